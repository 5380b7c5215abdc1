"""The answer record's schema and the answers-file reader (`evaluation.records`): standard library only."""

from __future__ import annotations

import copy
import json

import pytest

from evaluation.engine.errors import HarnessError
from evaluation.records import AnswerProblem, check_record, distinct_answers, read_answers


def good_record(question_id=1) -> dict:
    """A two-turn answer with every field the runner writes (`evaluation.run.answer.answer_record`)."""
    parts = {"prefill": 0.1, "draft": 0.05, "budget": 0.0, "tree": 0.01, "forward": 0.3, "verify": 0.02,
             "commit": 0.01, "update": 0.01}
    return {
        "question_id": question_id, "category": "writing", "subtask": "mt_bench", "answer_id": "x", "model_id": "m",
        "method": "pld", "status": "ok", "error": None, "tstamp": 1.0,
        "produced_by": {"git_commit": "abc", "git_dirty": False, "torch_threads": 4},
        "choices": [{
            "index": 0, "turns": ["a", "b"], "decoding_steps": [2, 3], "new_tokens": [3, 4],
            "wall_time": [0.5, 0.6], "accept_lengths": [1, 2, 1, 2, 1], "token_ids": [[1, 2, 3], [4, 5, 6, 7]],
            "prefill_time": [0.1, 0.1], "time_breakdown": [parts, parts], "stop_reason": ["stop_token", "max_new_tokens"],
            "proposed_nodes": [3, 3, 2], "verified_nodes": [3, 2, 2], "draft_detail": [{}, {"tree": 0.01}],
            "margins": [[0.5, 1.0, 2.0], [0.1, 0.2, 0.3, 0.4]],
        }],
    }


def error_record(question_id=2) -> dict:
    return {"question_id": question_id, "status": "error", "error": "RuntimeError: boom", "choices": []}


def test_the_runners_records_pass():
    assert check_record(good_record()) is None
    assert check_record(good_record("question-7")) is None
    assert check_record(error_record()) is None
    assert check_record({"question_id": 3, "status": "error", "error": "x"}) is None  # no choices at all


def test_optional_fields_of_older_runs_may_be_absent():
    record = good_record()
    for name in ("produced_by", "subtask", "category", "status", "tstamp"):
        del record[name]
    for name in ("turns", "proposed_nodes", "verified_nodes", "draft_detail", "margins", "stop_reason",
                 "prefill_time", "index"):
        del record["choices"][0][name]
    assert check_record(record) is None


def spoiled(change) -> dict:
    record = copy.deepcopy(good_record())
    change(record)
    return record


def choice(record) -> dict:
    return record["choices"][0]


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("question_id"), "question_id: missing"),
    (lambda r: r.update(question_id=True), "question_id: expected an int or a non-empty str, got a bool"),
    (lambda r: r.update(question_id=1.5), "question_id: expected an int or a non-empty str, got a number"),
    (lambda r: r.update(question_id=""), "question_id: expected an int or a non-empty str, got an empty str"),
    (lambda r: r.update(status="done"), 'status: expected "ok" or "error", got \'done\''),
    (lambda r: r.update(error="boom"), 'error: expected null when status is "ok", got a str'),
    (lambda r: r.update(status="error", error=None), "error: expected the error's message (a str)"),
    (lambda r: r.update(status="error", error="x", choices={}), "choices: expected a list, got an empty object"),
    (lambda r: r.pop("choices"), 'choices: missing (a record with status "ok" has its answer there)'),
    (lambda r: r.update(choices=[]), "choices: expected a non-empty list, got an empty list"),
    (lambda r: r.update(choices=["x"]), "choices[0]: expected an object, got a str"),
    (lambda r: r.update(subtask=3), "subtask: expected a str, got an int"),
    (lambda r: r.update(produced_by="abc"), "produced_by: expected an object, got a str"),
    (lambda r: r["produced_by"].pop("git_dirty"), "produced_by.git_dirty: missing"),
    (lambda r: r["produced_by"].update(git_dirty="no"), "produced_by.git_dirty: expected a bool, got a str"),
    (lambda r: r["produced_by"].update(torch_threads=True), "produced_by.torch_threads: expected an int, got a bool"),
    (lambda r: r["produced_by"].update(git_commit=None), "produced_by.git_commit: expected a str, got null"),
    (lambda r: choice(r).pop("wall_time"), "choices[0].wall_time: missing"),
    (lambda r: choice(r).update(turns=[]), "choices[0].turns: expected a non-empty list (one entry per turn)"),
    (lambda r: choice(r).update(turns=["a", 2]), "choices[0].turns: expected a list of strs"),
    (lambda r: choice(r).update(new_tokens=[3, -4]), "choices[0].new_tokens: expected a list of ints >= 0"),
    (lambda r: choice(r).update(new_tokens=[3, 4.0]), "choices[0].new_tokens: expected a list of ints >= 0"),
    (lambda r: choice(r).update(new_tokens=[7]), "choices[0].new_tokens: expected 2 entries (one per turn), got 1"),
    (lambda r: choice(r).update(wall_time=[0.5, "0.6"]), "choices[0].wall_time: expected a list of seconds >= 0"),
    (lambda r: choice(r).update(wall_time=[0.5, float("nan")]), "choices[0].wall_time: expected a list of seconds"),
    (lambda r: choice(r).update(wall_time=[0.0, 0.0]), "choices[0].wall_time: no time at all"),
    (lambda r: choice(r).update(decoding_steps=[2]), "choices[0].decoding_steps: expected 2 entries (one per turn)"),
    (lambda r: choice(r).update(token_ids=[[1, 2, 3], "4567"]),
     "choices[0].token_ids: expected a list of lists of ints"),
    (lambda r: choice(r).update(token_ids=[[1, 2, 3], [4, 5, None, 7]]),
     "choices[0].token_ids: expected a list of lists of ints"),
    (lambda r: choice(r).update(token_ids=[[1, 2, 3], [4, 5, 6]]),
     "choices[0].new_tokens[1]: 4, but token_ids[1] holds 3 ids"),
    (lambda r: choice(r).update(time_breakdown=[{"forward": 0.1}, {"forward": -1.0}]),
     "choices[0].time_breakdown: expected a list of an object of seconds >= 0 per part"),
    (lambda r: choice(r).update(time_breakdown=[{}]), "choices[0].time_breakdown: expected 2 entries"),
    (lambda r: choice(r).update(accept_lengths=[[1, 2], [1, 2, 1]]),
     "choices[0].accept_lengths: expected a flat list of ints >= 0"),
    (lambda r: choice(r).update(accept_lengths=[1, 2, 1]),
     "choices[0].accept_lengths: expected one entry per decoding step (5), got 3"),
    (lambda r: choice(r).update(proposed_nodes=[[3], [3, 2]]),
     "choices[0].proposed_nodes: expected a flat list of ints >= 0"),
    (lambda r: choice(r).update(verified_nodes=None), "choices[0].verified_nodes: expected a flat list of ints >= 0"),
    (lambda r: choice(r).update(draft_detail=[{}]), "choices[0].draft_detail: expected 2 entries (one per turn)"),
    (lambda r: choice(r).update(margins=[[0.5], ["x"]]), "choices[0].margins: expected a list of lists of numbers"),
    (lambda r: choice(r).update(stop_reason=["stop_token", None]), "choices[0].stop_reason: expected a list of strs"),
])
def test_each_bad_field_is_named(change, message):
    problem = check_record(spoiled(change))
    assert problem is not None and problem.startswith(message), problem
    assert "\n" not in problem


def test_a_record_that_is_not_an_object():
    assert check_record([1, 2]) == "expected a JSON object, got a list"
    assert check_record(None) == "expected a JSON object, got null"


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def test_the_reader_numbers_good_records_and_problems(tmp_path):
    good, error = json.dumps(good_record(1)), json.dumps(error_record(2))
    bad = json.dumps(spoiled(lambda r: choice(r).update(token_ids=[[1], "x"])))
    path = write(tmp_path / "answers.jsonl", f"{good}\n\n{{\"question_id\": 3,\n{bad}\n{error}\n")
    lines = read_answers(path)
    assert [(n, r["question_id"]) for n, r in lines.records] == [(1, 1), (5, 2)]  # line 2 is blank
    assert [(p.line, p.message.split(" (")[0]) for p in lines.problems] == [
        (3, "malformed JSON"), (4, "choices[0].token_ids: expected a list of lists of ints")]
    assert str(lines.problems[1]) == f"{path}:4: choices[0].token_ids: expected a list of lists of ints"
    assert lines.cut_line is None and lines.complete_bytes == path.stat().st_size
    with pytest.raises(HarnessError) as raised:
        lines.raise_for_problems()
    assert str(raised.value) == f"{lines.problems[0]} (and 1 more bad lines)" and "\n" not in str(raised.value)


def test_a_cut_last_line_is_no_problem_but_a_cut_middle_line_is(tmp_path):
    good = json.dumps(good_record(1))
    path = write(tmp_path / "answers.jsonl", f"{good}\n{good[:30]}")
    lines = read_answers(path)
    assert [n for n, _ in lines.records] == [1] and lines.problems == [] and lines.cut_line == 2
    assert lines.complete_bytes == len(good) + 1
    lines.raise_for_problems()  # nothing to raise
    # A whole record without its newline is still a cut line: the run path cuts it off and asks the question again.
    assert read_answers(write(tmp_path / "b.jsonl", f"{good}\n{good}")).cut_line == 2
    path = write(tmp_path / "c.jsonl", f"{good[:30]}\n{good}\n")
    lines = read_answers(path)
    assert lines.problems[0].line == 1 and lines.problems[0].message.startswith("malformed JSON")
    assert lines.cut_line is None


def test_bytes_that_are_not_utf8_are_a_problem_of_their_line(tmp_path):
    good = json.dumps(good_record(1)).encode()
    path = tmp_path / "answers.jsonl"
    path.write_bytes(good + b"\n" + b'{"question_id": "\xff"}\n' + good + b"\n")
    lines = read_answers(path)
    assert [p.line for p in lines.problems] == [2] and "not UTF-8" in lines.problems[0].message
    assert len(lines.records) == 2


def test_a_missing_file_reads_as_empty(tmp_path):
    lines = read_answers(tmp_path / "none.jsonl")
    assert lines.records == [] and lines.problems == [] and lines.cut_line is None


def test_one_answer_per_question(tmp_path):
    first, again = good_record(1), good_record(1)
    again["choices"][0]["wall_time"] = [9.0, 9.0]
    lines = "".join(json.dumps(r) + "\n" for r in (first, error_record(2), again, good_record(2), good_record("1")))
    path = write(tmp_path / "answers.jsonl", lines)
    kept, problems = distinct_answers(read_answers(path))
    # question 1: the first answer; question 2: answered again after it raised; "1" is not 1
    assert [(n, r["question_id"], r["status"]) for n, r in kept] == [(1, 1, "ok"), (4, 2, "ok"), (5, "1", "ok")]
    assert kept[0][1]["choices"][0]["wall_time"] == [0.5, 0.6]
    assert [str(p) for p in problems] == [f"{path}:3: question_id: duplicate 1 (first answered at line 1); left out"]
    assert isinstance(problems[0], AnswerProblem)


def test_the_module_imports_neither_pandas_nor_torch():
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys, evaluation.records\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'numpy', 'torch', 'omegaconf'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
