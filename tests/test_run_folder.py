"""The run folder cannot be silently wrong: its identity covers the contents a run reads, questions that failed are
asked again, every answer says what produced it, and what it writes is whole or not written."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from evaluation.report.load import load_runs
from evaluation.engine.errors import HarnessError
from evaluation.questions import Question
from evaluation.run import folder as run_folder_module
from evaluation.run import orchestrate
from evaluation.run.folder import AnswerFile, content_sha256, one_writer, open_run, run_identity
from evaluation.run.validation import validate
from eagle.method import Eagle2
from evaluation.families import family
from tests.conftest import ROOT
from tests.test_runner import QUESTIONS, small_config, write_questions

CURVE = ROOT / "results" / "budget" / "latency_calibrated.csv"
MODEL = SimpleNamespace(source="embedded", dtype=torch.float32, device=torch.device("cpu"), prepacked=True)


def questions_file(tmp_path) -> Path:
    return write_questions(tmp_path / "q.jsonl", QUESTIONS)


def identity(cfg) -> dict:
    return run_identity(validate(cfg), MODEL, "sha", 0)[1]


def test_a_replayed_latency_curve_changed_in_place_is_a_new_run(tmp_path):
    curve = tmp_path / "curve.csv"
    shutil.copy(CURVE, curve)
    cfg = small_config(tmp_path, questions_file(tmp_path), "method=pld", "run.draft_budget=auto",
                       f"run.latency_curve={curve}")
    before = identity(cfg)
    assert identity(cfg) == before
    lines = curve.read_text().splitlines()
    lines[2] = lines[2].replace(lines[2].split(",")[2], "70.0", 1)  # the same path, another t(2)
    curve.write_text("\n".join(lines) + "\n")
    after = identity(cfg)
    assert after["draft_budget"]["latency_curve"] == before["draft_budget"]["latency_curve"]
    assert after["draft_budget"]["latency_curve_sha256"] != before["draft_budget"]["latency_curve_sha256"]
    assert run_folder_module.run_folder(validate(cfg), after) != run_folder_module.run_folder(validate(cfg), before)


def test_a_draft_retrained_in_place_is_a_new_run(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(family("gumiho").committed_dir("smollm2-135m"), draft)
    cfg = small_config(tmp_path, questions_file(tmp_path), "method=gumiho", f"method.draft={draft}")
    before = identity(cfg)
    assert before["inputs_sha256"] == {"draft": content_sha256(draft)}
    weights = next(p for p in draft.iterdir() if p.suffix in (".safetensors", ".bin"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    assert identity(cfg)["inputs_sha256"] != before["inputs_sha256"]
    # The committed draft counts too; a method reading nothing beside the model keeps the identity it had.
    committed = identity(small_config(tmp_path, questions_file(tmp_path), "method=gumiho-serial"))
    assert committed["inputs_sha256"] == {"draft": content_sha256(family("gumiho").committed_dir("smollm2-135m"))}
    eagle = identity(small_config(tmp_path, questions_file(tmp_path), "method=eagle2"))
    assert eagle["inputs_sha256"] == {"draft": content_sha256(Eagle2.committed_dir("smollm2-135m"))}
    assert "inputs_sha256" not in identity(small_config(tmp_path, questions_file(tmp_path), "method=pld"))


def test_a_rest_datastore_given_by_path_is_named_by_its_manifest(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text('{"corpus_sha256": "a"}\n')
    cfg = small_config(tmp_path, questions_file(tmp_path), "method=rest", f"method.datastore={store}")
    before = identity(cfg)["inputs_sha256"]
    (store / "manifest.json").write_text('{"corpus_sha256": "b"}\n')
    assert identity(cfg)["inputs_sha256"] != before


class FakeAnswerer:
    """What `open_run` needs of an answerer, without a model."""

    model = MODEL
    workers = None
    latency_source = None

    def __init__(self, threads: int = 1):
        self.threads = threads

    def start(self, questions: int) -> None:
        pass

    def environment(self) -> dict:
        return {"torch_threads": self.threads, "git_commit": "first"}


def ok(question: Question) -> dict:
    """A whole answer record of one turn: three tokens in two decoding steps."""
    choice = {"turns": ["a b c"], "new_tokens": [3], "token_ids": [[1, 2, 3]], "wall_time": [0.1],
              "decoding_steps": [2], "accept_lengths": [2, 1], "time_breakdown": [{"forward": 0.05}]}
    return {"question_id": question.question_id, "status": "ok", "error": None, "choices": [choice]}


def failed(question: Question) -> dict:
    return {"question_id": question.question_id, "status": "error", "error": "ZeroDivisionError: x", "choices": []}


def test_failed_questions_are_asked_again_and_provenance_is_kept_per_process(tmp_path, capsys, monkeypatch):
    spec = validate(small_config(tmp_path, questions_file(tmp_path)))
    questions = [Question(i, "qa", ("q",)) for i in (1, 2, 3)]
    with open_run(spec, FakeAnswerer(threads=1), questions, "sha", 0) as run:
        assert [q.question_id for q in run.todo] == [1, 2, 3]
        run.append(ok(questions[0]))
        run.append(failed(questions[1]))
        run.append(failed(questions[2]))
    folder = run.folder
    manifest = json.loads((folder / "manifest.json").read_text())
    [first] = manifest["processes"]
    assert {"git_commit", "git_dirty", "host", "pid", "started"} <= set(first)
    lines = AnswerFile(folder / "answers.jsonl").read()
    assert all(line["produced_by"]["torch_threads"] == 1 for line in lines)
    assert lines[0]["produced_by"]["git_commit"] == first["git_commit"]

    # Resumed by another process (here: another thread count): the failed two are asked again, their old lines
    # gone; the manifest keeps the first environment and lists both processes.
    monkeypatch.setattr(run_folder_module, "commit", lambda: {"git_commit": "second", "git_dirty": True})
    with open_run(spec, FakeAnswerer(threads=2), questions, "sha", 0) as again:
        assert [q.question_id for q in again.todo] == [2, 3]
        assert "1 answered, 2 to go (2 that failed asked again)" in capsys.readouterr().out
        assert [line["question_id"] for line in AnswerFile(folder / "answers.jsonl").read()] == [1]
        again.append(ok(questions[1]))
        again.append(ok(questions[2]))
    resumed = json.loads((folder / "manifest.json").read_text())
    assert resumed["environment"] == manifest["environment"] and resumed["started"] == manifest["started"]
    assert [p["git_commit"] for p in resumed["processes"]] == [first["git_commit"], "second"]
    lines = AnswerFile(folder / "answers.jsonl").read()
    assert [(line["question_id"], line["produced_by"]["git_commit"], line["produced_by"]["torch_threads"])
            for line in lines] == [(1, first["git_commit"], 1), (2, "second", 2), (3, "second", 2)]
    with open_run(spec, FakeAnswerer(), questions, "sha", 0) as done:  # finished: nothing to do, nothing written
        assert done.todo == []


def test_a_cut_manifest_stops_the_run_in_one_line(tmp_path):
    spec = validate(small_config(tmp_path, questions_file(tmp_path)))
    questions = [Question(i, "qa", ("q",)) for i in (1, 2)]
    with open_run(spec, FakeAnswerer(), questions, "sha", 0) as run:
        run.append(ok(questions[0]))
    manifest = run.folder / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(HarnessError, match=r"manifest\.json is not a whole JSON manifest .*remove it"):
        with open_run(spec, FakeAnswerer(), questions, "sha", 0):
            pass


def test_a_full_disk_stops_with_one_line_and_the_same_command_resumes(tmp_path, monkeypatch):
    spec = validate(small_config(tmp_path, questions_file(tmp_path)))
    questions = [Question(i, "qa", ("q",)) for i in (1, 2, 3)]
    appends = []

    class FullDisk:
        """The second answer line: half of it reaches the disk, then the disk is full."""

        def __init__(self, path, mode, **kwargs):
            self.file = open(path, mode, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            appends.append(text)
            if len(appends) == 2:
                self.file.write(text[: len(text) // 2])
                self.file.flush()
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.file.write(text)

        def __getattr__(self, name):
            return getattr(self.file, name)

    monkeypatch.setattr(run_folder_module, "open", FullDisk, raising=False)
    with pytest.raises(HarnessError, match=r"answers\.jsonl: the disk is full; the answers written so far are kept"):
        with open_run(spec, FakeAnswerer(), questions, "sha", 0) as run:
            for question in run.todo:
                run.append(ok(question))
    monkeypatch.undo()
    with open_run(spec, FakeAnswerer(), questions, "sha", 0) as again:  # the half line is cut off, 2 asked again
        assert [q.question_id for q in again.todo] == [2, 3]
        for question in again.todo:
            again.append(ok(question))
    assert [r["question_id"] for r in AnswerFile(run.folder / "answers.jsonl").read()] == [1, 2, 3]


def test_a_bad_line_stops_a_resume_in_one_line_and_a_cut_last_line_is_dropped(tmp_path):
    """A line cut off by a kill is the question in flight: dropped, and the question asked again. A bad line
    anywhere else (malformed, not a whole record) is never built on: the resume stops, naming it."""
    spec = validate(small_config(tmp_path, questions_file(tmp_path)))
    questions = [Question(i, "qa", ("q",)) for i in (1, 2, 3)]
    with open_run(spec, FakeAnswerer(), questions, "sha", 0) as run:
        for question in run.todo[:2]:
            run.append(ok(question))
    answers = run.folder / "answers.jsonl"
    whole = answers.read_bytes()
    answers.write_bytes(whole + json.dumps(ok(questions[2])).encode()[:30])  # killed while writing question 3
    with open_run(spec, FakeAnswerer(), questions, "sha", 0) as again:
        assert [q.question_id for q in again.todo] == [3]
        assert answers.read_bytes() == whole
    first, second = whole.decode().splitlines()
    for bad, problem in [("{not json", "malformed JSON"),
                         (json.dumps({**json.loads(second), "choices": None}), "choices: expected a non-empty list")]:
        answers.write_text(f"{first}\n{bad}\n")
        with pytest.raises(HarnessError) as caught, open_run(spec, FakeAnswerer(), questions, "sha", 0):
            pass
        assert str(caught.value).startswith(f"{answers}:2: {problem}") and "\n" not in str(caught.value)
        assert "fix or remove that line" in str(caught.value)
        assert answers.read_text() == f"{first}\n{bad}\n"  # left as it was


def test_a_lock_error_is_named_as_what_it_is(tmp_path, monkeypatch):
    import fcntl

    with one_writer(tmp_path), pytest.raises(HarnessError, match="being written by another process"):
        with one_writer(tmp_path):
            pass

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(HarnessError, match=r"cannot lock .*\.writer\.lock: No locks available \(does this file system"):
        with one_writer(tmp_path):
            pass


def test_a_question_that_failed_is_answered_once_the_cause_is_fixed(lm, tmp_path):
    """End to end on the real model: a prompt too long for the context is an error; with a larger context the
    same run resumes, answers it, and the report counts it."""
    long_turn = " ".join(["word"] * 200)
    questions = [{"question_id": 7, "category": "qa", "turns": ["Say hi.", long_turn]}, *QUESTIONS[1:2]]
    qfile = write_questions(questions_file(tmp_path), questions)
    [folder] = orchestrate.run(small_config(tmp_path, qfile, "model.max_context=120"))
    statuses = [line["status"] for line in AnswerFile(folder / "answers.jsonl").read()]
    assert statuses == ["error", "ok"]
    assert orchestrate.run(small_config(tmp_path, qfile)) == [folder]
    lines = AnswerFile(folder / "answers.jsonl").read()
    assert [(line["question_id"], line["status"]) for line in lines] == [(2, "ok"), (7, "ok")]
    df = load_runs(tmp_path / "runs")
    assert sorted(df[df.status == "ok"].question_id) == [2, 7]


def test_content_sha256_of_a_folder_follows_names_and_bytes(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "w.bin").write_bytes(b"12")
    first = content_sha256(tmp_path / "a")
    (tmp_path / "a" / ".writer.lock").write_text("")  # hidden files are not content
    assert content_sha256(tmp_path / "a") == first
    (tmp_path / "a" / "w.bin").rename(tmp_path / "a" / "v.bin")
    assert content_sha256(tmp_path / "a") != first
    assert content_sha256(tmp_path / "a" / "v.bin") == content_sha256(Path(tmp_path / "a" / "v.bin"))
