"""The runner: configs compose, bad input fails early and cleanly, runs resume, errors are recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from evaluation.report.load import load_runs
from evaluation.report.stats import summarize
from evaluation.run import orchestrate
from evaluation.catalog import available_methods, method_class
from evaluation.engine.errors import HarnessError
from tests.conftest import CONF, ROOT, compose_config

MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
METHOD_CONFIGS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
# Configs that run on the embedded model only with an override (sps: no draft model is paired with it; the tests
# give it the target's own layers).
REQUIRED_OVERRIDES = {"sps": ["method.draft_model=self"]}


@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_composes(model):
    from evaluation.catalog import model_name

    cfg = compose_config(f"model={model}")
    short = (CONF / "model" / f"{model}.yaml").read_text().count("defaults:") > 0
    assert cfg.model.name == (model_name(model) if short else model)
    if short:  # a short name is the full config under another file name: same model, same run folders
        full = compose_config(f"model={cfg.model.name}")
        assert cfg.model == full.model and model_name(model) != model
    assert cfg.model.chat_template == "tokenizer" or cfg.model.chat_template.startswith("fschat:")
    assert cfg.model.hf_id


@pytest.mark.parametrize("method", METHOD_CONFIGS)
def test_every_method_config_composes_and_validates(method):
    from evaluation.run.validation import method_spec

    cfg = compose_config(f"method={method}", *REQUIRED_OVERRIDES.get(method, []))
    spec = method_spec(cfg.method)
    assert isinstance(spec.options, spec.cls.Config) and spec.cls is method_class(cfg.method.name)


def test_every_registered_method_has_a_config():
    assert set(available_methods()) <= {compose_config(f"method={m}").method.name for m in METHOD_CONFIGS}


def test_unknown_keys_and_names_are_rejected():
    with pytest.raises(ConfigCompositionException, match="max_new_tokenz"):
        compose_config("bench.max_new_tokenz=3")
    with pytest.raises(ConfigCompositionException, match="max_new_tokens=abc"):
        compose_config("bench.max_new_tokens=abc")
    with pytest.raises(MissingConfigException, match="smollm2-135m"):
        compose_config("model=gpt-17")  # the message lists the available models
    from evaluation.run.validation import method_spec

    with pytest.raises(HarnessError, match="unknown method 'vanila'.*did you mean 'vanilla'"):
        method_class("vanila")
    with pytest.raises(HarnessError, match="unknown option method.depth for method 'vanilla'"):
        method_spec(compose_config("+method.depth=3").method)


def write_questions(path: Path, questions: list[dict]) -> Path:
    path.write_text("".join(json.dumps(q) + "\n" for q in questions))
    return path


def small_config(tmp_path, question_file, *extra):
    return compose_config(
        f"bench.question_file={question_file}", "bench.max_new_tokens=6", "bench.warmup=0",
        f"run.results_dir={tmp_path / 'runs'}", "run.progress=false", "model.dtype=float32", "run.device=cpu",
        *extra)


QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Name a colour.", "Name another one."]},
    {"question_id": 2, "category": "qa", "turns": ["What is the capital of France?"]},
    {"question_id": 3, "category": "qa", "turns": ["What is two plus two?"]},
]


def check_run_and_resume(cfg, question_ids: list[int]) -> tuple[Path, list[dict]]:
    """Run `cfg`, check what it wrote, cut its last answer line in half as a kill while writing it would, run
    again: only that question is redone, and once finished a rerun changes nothing. Lines may come in any order
    (Ray workers finish questions out of order); each question must be written exactly once.
    Returns the run folder and its answer lines."""
    [folder] = orchestrate.run(cfg)
    answers = folder / "answers.jsonl"
    lines = [json.loads(line) for line in answers.read_text().splitlines()]
    assert sorted(line["question_id"] for line in lines) == question_ids
    first = next(line for line in lines if line["question_id"] == question_ids[0])["choices"][0]
    assert len(first["turns"]) == 2 and len(first["token_ids"]) == 2
    assert first["new_tokens"] == [len(ids) for ids in first["token_ids"]]
    assert sum(first["accept_lengths"]) == sum(first["new_tokens"])
    for key in ("answer_id", "model_id", "tstamp", "category", "status"):
        assert key in lines[0]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["environment"]["packages"]["torch"] and manifest["comparison"]["question_sha256"]
    assert (folder / "config.yaml").is_file()

    # A kill while the last question was being written: half a line at the end, then the same command again.
    data = answers.read_bytes()
    cut = data.rfind(b"\n", 0, len(data) - 1) + 1
    answers.write_bytes(data[: cut + 25])
    assert orchestrate.run(cfg) == [folder]
    again = [json.loads(line) for line in answers.read_text().splitlines()]
    assert sorted(line["question_id"] for line in again) == question_ids
    assert again[:-1] == lines[:-1]  # answered questions are not redone
    assert again[-1]["question_id"] == lines[-1]["question_id"]
    resumed = json.loads((folder / "manifest.json").read_text())
    assert resumed["started"] == manifest["started"] and len(resumed["resumed"]) == 1

    # Once finished, running again changes nothing, not even the manifest.
    before = {name: (folder / name).read_bytes() for name in ("manifest.json", "config.yaml", "answers.jsonl")}
    assert orchestrate.run(cfg) == [folder]
    assert {name: (folder / name).read_bytes() for name in before} == before
    return folder, again


def test_run_writes_answers_and_resumes_after_a_kill(lm, tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    folder, lines = check_run_and_resume(small_config(tmp_path, qfile), [1, 2, 3])
    assert [line["question_id"] for line in lines] == [1, 2, 3]  # in order, in one process
    assert "workers" not in json.loads((folder / "manifest.json").read_text())


def test_a_question_that_raises_is_recorded_and_excluded(lm, tmp_path):
    long_second_turn = " ".join(["word"] * 200)
    questions = [{"question_id": 7, "category": "qa", "turns": ["Say hi.", long_second_turn]},
                 {"question_id": 8, "category": "qa", "turns": ["Say bye."]}]
    qfile = write_questions(tmp_path / "q.jsonl", questions)
    for method in ("vanilla",):
        orchestrate.run(small_config(tmp_path, qfile, f"method={method}", "model.max_context=120"))
    df = load_runs(tmp_path / "runs")
    bad = df[df.question_id == 7].iloc[0]
    assert bad.status == "error" and "does not fit the context" in bad.error and "\n" not in bad.error
    summary = summarize(df)
    assert summary[summary.subtask == "overall"].questions.tolist() == [1]
    # The command line's last line says so, without the report (run.report=false).
    done = subprocess.run([sys.executable, "run.py", f"bench.question_file={qfile}", "model.max_context=120",
                           "bench.max_new_tokens=8", "bench.warmup=0", "run.progress=false", "run.report=false",
                           f"run.results_dir={tmp_path / 'cli'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"Answers: {tmp_path / 'cli'}") and "(1 of 2 questions failed, status \"error\"" in last
    assert "does not fit the context" in last and last.endswith("the same command asks them again)")


@pytest.mark.parametrize("content, message", [
    ('{"question_id": 1, "turns": ["a"]}\n{"question_id": 2, "turns": ["b"\n', r"q\.jsonl:2: malformed JSON"),
    ('{"question_id": 1, "category": "qa"}\n', r"q\.jsonl:1: question has no 'turns'"),
])
def test_bad_question_files_fail_with_file_and_line_and_write_nothing(tmp_path, content, message):
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(content)
    with pytest.raises(HarnessError, match=message):
        orchestrate.run(small_config(tmp_path, qfile))
    assert not (tmp_path / "runs").exists()


def test_missing_model_directory_and_too_long_prompt_write_nothing(lm, tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    with pytest.raises(HarnessError, match="bad value for model.path: '/no/such/model' .*existing folder"):
        orchestrate.run(small_config(tmp_path, qfile, "model.path=/no/such/model"))
    with pytest.raises(HarnessError, match="question 1: prompt of .* tokens does not fit the context of 20"):
        orchestrate.run(small_config(tmp_path, qfile, "model.max_context=20"))
    assert not (tmp_path / "runs").exists()


def test_unknown_subtask_is_named(tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    with pytest.raises(HarnessError, match="unknown subtask.*poetry.*this file has: mt_bench, qa"):
        orchestrate.run(small_config(tmp_path, qfile, "bench.subtasks=[poetry]"))


def test_command_line_errors_are_one_line(tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", [{"question_id": 1}])
    done = subprocess.run([sys.executable, "run.py", f"bench.question_file={qfile}",
                           f"run.results_dir={tmp_path / 'runs'}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"error: {qfile}:1: question has no 'turns' (a non-empty list of strings)"
    assert len(done.stderr.strip().splitlines()) == 1


def test_embedded_conversion_was_checked_against_the_gguf(lm):
    """The conversion compares greedy tokens of the GGUF-loaded and the converted model before publishing."""
    manifest = json.loads((Path(lm.source) / "conversion.json").read_text())
    check = manifest["greedy_check"]
    assert check["equal"] and check["gguf_ids"] == check["converted_ids"] and len(check["gguf_ids"]) == 40


def test_a_datastore_of_another_tokenizer_stops_the_run_in_one_line(lm, tmp_path):
    """Known only once the model is loaded: refused before the first question, nothing written."""
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text(json.dumps({"tokenizer_sha256": "0" * 64}))
    with pytest.raises(HarnessError, match="built with another tokenizer") as caught:
        orchestrate.run(small_config(tmp_path, qfile, "method=rest", f"method.datastore={store}"))
    assert "\n" not in str(caught.value) and not (tmp_path / "runs").exists()
