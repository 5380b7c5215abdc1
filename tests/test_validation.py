"""Every option of every config group and every registered method, fuzzed: wrong type, empty, negative, zero, huge.

The options are discovered from the config dataclasses (`evaluation.run.config.config_groups()` and each registered
method's `Config`), so a new option is fuzzed without touching this file. Each value is either refused with one
line naming the option (by the schema or the config's `check()`, before the model loads) or accepted; an accepted
value must then really work: the run is prepared on the real model (questions read, model loaded, method built)
and, for a method option, a few tokens are decoded with it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import typing
from dataclasses import fields
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from evaluation.run.answerers import build_method, load_target, read_questions
from evaluation.run.config import config_groups
from evaluation.catalog import available_methods, method_class
from evaluation.engine import decode_turn
from evaluation.engine.errors import HarnessError
from evaluation.run.validation import option_error_from_hydra, validate
from tests.conftest import CONF, ROOT

HUGE = "1000000000000"
INT_VALUES = ("abc", "", "1.5", "[1]", "null", "-1", "0", HUGE)
FLOAT_VALUES = ("abc", "", "[1]", "null", "-1.0", "0", "2.0", "1e300", "nan", "inf", "-inf")
BOOL_VALUES = ("maybe", "", "[1]", "null", "2", "-1")
STR_VALUES = ("", "' '", "[1]", "null", "x" * 300, "/dev/null/x")
LIST_VALUES = ("abc", "null", "[]", "[abc]", "['']", "[-1]", "[0]", f"[{HUGE}]", "[1,1]", "[3,2,1]")


def fuzz_values(annotation) -> tuple[str, ...]:
    """Override values (Hydra syntax) for an option of this type."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union:
        return fuzz_values(next(a for a in args if a is not type(None)))
    if origin in (list, tuple):
        return LIST_VALUES
    return {int: INT_VALUES, float: FLOAT_VALUES, bool: BOOL_VALUES, str: STR_VALUES}.get(annotation, STR_VALUES)


def method_config_names() -> dict[str, str]:
    """Registered method -> its YAML in conf/method (the one named after it, else the first that selects it)."""
    stems = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
    chosen = {}
    for stem in stems:
        name = OmegaConf.load(CONF / "method" / f"{stem}.yaml").get("name", stem)
        if name not in chosen or stem == name:
            chosen[name] = stem
    return chosen


def options() -> list[tuple[str, str | None, str, object]]:
    """(group, method or None, option, annotation) for every option there is."""
    found = []
    for group, schema in config_groups().items():
        hints = typing.get_type_hints(schema)
        found += [(group, None, f.name, hints[f.name]) for f in fields(schema)]
    for name in available_methods():
        schema = method_class(name).Config
        hints = typing.get_type_hints(schema)
        found += [("method", name, f.name, hints[f.name]) for f in fields(schema)]
    return found


def tiny_corpus(path):
    """A ShareGPT-style corpus of three conversations, for a REST datastore built in a second."""
    talk = ["Tell me about the sea.", "The sea is large and blue and full of fish.",
            "What is two plus two?", "Two plus two is four.", "Name a colour.", "Blue is a colour."]
    records = [{"conversations": [{"from": "human", "value": talk[i]}, {"from": "gpt", "value": talk[i + 1]}]}
               for i in range(0, len(talk), 2)]
    path.write_text(json.dumps(records))
    return path


@pytest.fixture(scope="module")
def setting(tmp_path_factory, lm):
    """Overrides every sample starts from: a two-question file, a scratch results folder, the embedded model on
    the CPU; options that would make construction slow (REST's default ShareGPT datastore) point at tiny files."""
    from baselines.rest_datastore import build_datastore

    tmp = tmp_path_factory.mktemp("fuzz")
    questions = tmp / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Say hi.", "Say bye."]}) + "\n"
                         + json.dumps({"question_id": 2, "category": "writing", "turns": ["Name a fruit."]}) + "\n")
    store = build_datastore(lm.tokenizer, str(tiny_corpus(tmp / "corpus.json")), out_dir=tmp / "store",
                            progress=False)
    base = [f"bench.question_file={questions}", f"run.results_dir={tmp / 'runs'}", "bench.max_new_tokens=4",
            "bench.warmup=0", "run.progress=false", "run.report=false", "model.dtype=float32", "run.device=cpu"]
    per_method = {"rest": [f"method.datastore={store}"], "sps": ["method.draft_model=self"]}
    return tmp, base, per_method


def attempt(overrides: list[str], reference=None):
    """("refused", message) or ("accepted", cfg): the checks the command line runs, without loading a model.

    With `reference` (the config `overrides[:-1]` compose to), the last override is applied to a copy of it as
    Hydra's compose applies a value override (its own parser and merge, in struct mode): the same result without
    composing the defaults again, which is most of the time (`test_applying_a_value_is_composing_it` keeps the two
    equal)."""
    try:
        if reference is None:
            cfg = compose("config", overrides=overrides)
        else:
            cfg = copy.deepcopy(reference)
            ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(overrides[-1:]), cfg)
    except ConfigCompositionException as exc:
        error = option_error_from_hydra(exc)
        assert error is not None, f"{overrides[-1]}: Hydra's own error for a value: {exc}"
        return "refused", str(error)
    try:
        validate(cfg)
    except HarnessError as exc:
        return "refused", str(exc)
    return "accepted", cfg


def test_every_option_is_refused_in_one_line_or_really_works(setting, lm):
    tmp, base, per_method = setting
    yamls = method_config_names()
    prompt = lm.tokenizer.encode("The sea is large and blue and")
    counts = {"refused": 0, "accepted": 0, "built": 0, "decoded": 0}
    failures = []
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        for group, method, option, annotation in options():
            start = [*base, f"method={yamls[method]}", *per_method.get(method, [])] if method else list(base)
            reference = compose("config", overrides=start)
            for value in fuzz_values(annotation):
                sample = f"{group}.{option}={value}"
                outcome, result = attempt([*start, sample], reference)
                counts[outcome] += 1
                if outcome == "refused":
                    if "\n" in result or option not in result or f"{group}." not in result:
                        failures.append(f"{sample}: message does not name the option in one line: {result!r}")
                    continue
                if OmegaConf.select(result, f"{group}.{option}") == OmegaConf.select(reference, f"{group}.{option}"):
                    continue  # the value it already had: covered by the method's and the runner's own tests
                try:
                    spec = validate(result)
                    built = build_method(spec, load_target(spec, read_questions(spec)))
                except HarnessError as exc:  # refused once read or loaded (a subtask the file lacks): one line
                    if "\n" in str(exc):
                        failures.append(f"{sample}: accepted, then a multi-line error: {exc}")
                    continue
                except Exception as exc:  # noqa: BLE001 - an accepted value must not crash
                    failures.append(f"{sample}: accepted, then {type(exc).__name__}: {exc}")
                    continue
                counts["built"] += 1
                if method:
                    try:
                        decode_turn(lm, built, prompt, 4)
                        counts["decoded"] += 1
                    except Exception as exc:  # noqa: BLE001
                        failures.append(f"{sample}: accepted, then decoding raised {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)
    assert not (tmp / "runs").exists()  # nothing was written by any sample
    # Non-vacuous: both outcomes occur, and accepted values were built and decoded with.
    assert counts["refused"] > 100 and counts["built"] > 10 and counts["decoded"] > 5, counts


def test_applying_a_value_is_composing_it(setting):
    """The fuzz's shortcut (`attempt` with a reference) gives what Hydra's compose gives, refusal message or
    config, for one value of each type on a few methods' options and the run's own."""
    _, base, per_method = setting
    yamls = method_config_names()
    chosen = [o for o in options() if o[1] in (None, "gumiho", "sps")]
    compared = 0
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        for group, method, option, annotation in chosen:
            start = [*base, f"method={yamls[method]}", *per_method.get(method, [])] if method else list(base)
            reference = compose("config", overrides=start)
            for value in fuzz_values(annotation)[compared % 4::4]:
                sample = [*start, f"{group}.{option}={value}"]
                fast, slow = attempt(sample, reference), attempt(sample)
                assert fast[0] == slow[0], (sample[-1], fast, slow)
                if fast[0] == "refused":
                    assert fast[1] == slow[1], sample[-1]
                else:
                    assert OmegaConf.to_container(fast[1]) == OmegaConf.to_container(slow[1]), sample[-1]
                compared += 1
    assert compared > 40


def run_cli(tmp_path, *overrides: str, env=None):
    return subprocess.Popen(
        [sys.executable, "run.py", f"run.results_dir={tmp_path / 'runs'}", *overrides], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


def test_the_command_line_reports_bad_options_in_one_line(tmp_path):
    """A sample through the real entry point, in parallel: exit status 2, one line, no run folder, no model."""
    samples = {
        "method.draft_tree_capacity": ["method=logitspec", "method.draft_tree_capacity=0"],
        "bench.max_new_tokens": ["bench.max_new_tokens=abc"],
        "bench.question_file": [f"bench.question_file={tmp_path / 'none.jsonl'}"],
        "method.datastore": ["method=rest", f"method.datastore={tmp_path}"],
        "bench.max_new_tokenz": ["bench.max_new_tokenz=3"],
        "run.seed": ["run.seed=-1"],
        "run.latency_curve": ["run.draft_budget=auto", f"run.latency_curve={tmp_path / 'inf.csv'}"],
    }
    (tmp_path / "inf.csv").write_text("new_tokens,median_ms\n1,20\n8,inf\n")
    running = {name: run_cli(tmp_path, *overrides) for name, overrides in samples.items()}
    for name, process in running.items():
        out, err = process.communicate(timeout=120)
        lines = err.strip().splitlines()
        assert process.returncode == 2, (name, err)
        assert len(lines) == 1 and lines[0].startswith("error: ") and name in lines[0], (name, err)
        assert "Traceback" not in out + err and "Loading" not in out
        if name == "bench.question_file":  # the fix, named
            assert lines[0].endswith("(allowed: an existing file; `make data` puts the question sets under data/)")
    assert not (tmp_path / "runs").exists()


def test_a_mistyped_choice_or_option_name_is_one_line_with_the_fix(tmp_path):
    """A config group choice that does not exist gets the closest name and the choices (not Hydra's page of them);
    an option the chosen method lacks gets the method's options (not Hydra's `+key` hint)."""
    samples = {
        ("method=logitsepc",): "error: unknown method 'logitsepc' (did you mean 'logitspec'?); available: eagle, ",
        ("model=vicuna7b",): "error: unknown model 'vicuna7b' (did you mean 'vicuna-7b'?); available: ",
        ("method.top_k=3",): "error: unknown option method.top_k for method 'vanilla' (options: none)",
        ("method=pld", "method.max_ngram_sizee=3"): "error: unknown option method.max_ngram_sizee for method 'pld' "
                                                    "(options: max_ngram_size, ",
    }
    running = {sample: run_cli(tmp_path, *sample) for sample in samples}
    for sample, process in running.items():
        _, err = process.communicate(timeout=120)
        assert process.returncode == 2 and len(err.strip().splitlines()) == 1, (sample, err)
        assert err.startswith(samples[sample]), (sample, err)
        assert "Traceback" not in err and "+method" not in err
    assert "sam-no-fallback" in run_cli(tmp_path, "method=nope").communicate(timeout=120)[1]  # config names
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command, outputs", [
    (["-m", "evaluation.report.figures", "--results", "{tmp}/runs", "--out", "{tmp}/out"], ["table1.md", "breakdown_x.png"]),
    (["-m", "evaluation.report", "--results", "{tmp}/runs", "--out", "{tmp}/out"], ["report.md", "report.csv"]),
    (["-m", "evaluation.report.figures", "--results", "{tmp}/ablations/runs", "--out", "{tmp}/out"], ["table1.md"]),
])
def test_reports_and_figures_without_runs_leave_outputs_untouched(tmp_path, command, outputs):
    """A fresh clone has the committed outputs but no saved runs: one line saying what to run, exit status 2."""
    (tmp_path / "runs").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    before = {}
    for name in outputs:
        (out / name).write_bytes(name.encode() * 3)
        before[name] = (out / name).read_bytes()
    done = subprocess.run([sys.executable, *[part.format(tmp=tmp_path) for part in command]], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    make = "make ablations" if "ablations" in command[3] else "make bench"
    assert len(lines) == 1 and lines[0].startswith("error: no saved runs under") and make in lines[0], done.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ------------------------------------------------------------------------ run.question_timeout_s (Ray workers)
TIMEOUTS = "(allowed: null (no timeout) or a number of seconds in (0, 2592000])"


@pytest.mark.parametrize("overrides, message", [
    # Without workers a run is never timed out: a value other than the default would silently do nothing.
    (["run.question_timeout_s=60"],
     "run.question_timeout_s: 60.0 (allowed: 1800 (the default) or null unless run.workers is set)"),
    (["run.workers=2", "run.question_timeout_s=0"], f"run.question_timeout_s: 0.0 {TIMEOUTS}"),
    (["run.workers=2", "run.question_timeout_s=-5"], f"run.question_timeout_s: -5.0 {TIMEOUTS}"),
    (["run.workers=2", "run.question_timeout_s=nan"], f"run.question_timeout_s: nan {TIMEOUTS}"),
    (["run.workers=2", "run.question_timeout_s=1e9"], f"run.question_timeout_s: 1000000000.0 {TIMEOUTS}"),
    (["run.workers=2", "run.question_timeout_s=soon"], "run.question_timeout_s"),  # Hydra's type check
])
def test_the_question_timeout_is_checked_in_one_line(tmp_path, overrides, message):
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "turns": ["Say hi."]}) + "\n")
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        outcome, result = attempt([f"bench.question_file={questions}", *overrides])
    assert outcome == "refused" and message in result and "\n" not in result, result


def test_the_question_timeout_is_taken_and_is_not_part_of_a_run_identity(tmp_path):
    """A timeout changes when a hung worker is given up, not what a run is: every value gives the same folder."""
    import torch

    from evaluation.run.folder import run_identity

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "turns": ["Say hi."]}) + "\n")
    model = SimpleNamespace(source="model", dtype=torch.float32, device=torch.device("cpu"), prepacked=False)
    settings = [[], ["run.question_timeout_s=null"], ["run.workers=2"], ["run.workers=2", "run.question_timeout_s=5"],
                ["run.workers=2", "run.question_timeout_s=null"]]
    identities = set()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        for overrides in settings:
            outcome, cfg = attempt([f"bench.question_file={questions}", *overrides])
            assert outcome == "accepted", (overrides, cfg)
            spec = validate(cfg)
            identities.add(json.dumps(run_identity(spec, model, "sha", 0), sort_keys=True))
    assert spec.run.question_timeout_s is None and len(identities) == 1


def test_a_config_file_cannot_run_code_and_a_target_must_be_a_method(tmp_path):
    """An experiment file whose `hydra:` block names a callback (which Hydra would run as it starts, before any
    check) is refused in one line and nothing runs; a `_target_` that is a class but not a method is one line."""
    victim = tmp_path / "written-by-a-callback"
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "sneaky.yaml").write_text(
        "# @package _global_\nhydra:\n  callbacks:\n    copy:\n      _target_: shutil.copyfile\n"
        f"      src: {ROOT / 'run.py'}\n      dst: {victim}\n")
    process = run_cli(tmp_path, f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "experiment=sneaky")
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {tmp_path / 'conf' / 'experiment' / 'sneaky.yaml'}: hydra.callbacks runs code")
    assert not victim.exists() and not (tmp_path / "runs").exists()

    process = run_cli(tmp_path, "method._target_=pathlib.Path")
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and err.strip() == ("error: method 'vanilla': _target_ pathlib.Path is not a "
                                                       "decoding method (a subclass of evaluation.engine.method.Method)")
