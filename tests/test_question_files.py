"""Question files that cannot be read as questions stop a run with one line naming the file, the line and the
problem, before any model loads and before anything is written: bytes that are not UTF-8, a question_id that is
not an integer or a non-empty string, a category that is not a string. The question sets `make data` fetches load.

No model is loaded here: the questions are read before it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evaluation.engine.errors import HarnessError
from evaluation.questions import load_questions
from evaluation.run import orchestrate
from tests.conftest import ROOT
from tests.test_runner import small_config

GOOD = '{"question_id": 1, "category": "qa", "turns": ["Say hi."]}\n'

# name -> (the file's bytes, the one line expected after "<file>:")
BAD_FILES = {
    "not_utf8": (GOOD.encode() + b'{"question_id": 2, "turns": ["caf\xff"]}\n',
                 "2: not UTF-8 text (byte 0xff at byte offset 33 of the line)"),
    "list_id": (GOOD + '{"question_id": [2], "turns": ["a"]}\n',
                "2: question_id must be an integer or a non-empty string, not a list ([2])"),
    "null_id": (GOOD + '{"question_id": null, "turns": ["a"]}\n',
                "2: question_id must be an integer or a non-empty string, not null"),
    "bool_id": ('{"question_id": true, "turns": ["a"]}\n',
                "1: question_id must be an integer or a non-empty string, not true"),
    "float_id": ('{"question_id": 1.0, "turns": ["a"]}\n',
                 "1: question_id must be an integer or a non-empty string, not a number (1.0)"),
    "empty_id": ('{"question_id": "", "turns": ["a"]}\n',
                 "1: question_id must be an integer or a non-empty string, not a blank string (\"\")"),
    "object_id": ('{"question_id": {"n": 1}, "turns": ["a"]}\n',
                  "1: question_id must be an integer or a non-empty string, not an object ({\"n\": 1})"),
    "list_category": (GOOD + '{"question_id": 2, "category": ["qa"], "turns": ["a"]}\n',
                      "2: category must be a string when present, not a list ([\"qa\"])"),
    "null_category": ('{"question_id": 1, "category": null, "turns": ["a"]}\n',
                      "1: category must be a string when present, not null"),
    "duplicate_id": (GOOD + GOOD, "2: duplicate question_id 1"),
}


def write(path, content) -> str:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_bad_question_file_stops_the_run_in_one_line_and_writes_nothing(tmp_path, name):
    content, message = BAD_FILES[name]
    qfile = write(tmp_path / "q.jsonl", content)
    with pytest.raises(HarnessError) as caught:
        orchestrate.run(small_config(tmp_path, qfile))
    assert str(caught.value) == f"{qfile}:{message}"
    assert not (tmp_path / "runs").exists()


def test_the_bad_byte_is_found_on_its_line_whatever_the_line_endings(tmp_path):
    crlf = GOOD.replace("\n", "\r\n").encode() + b"\r\n" + b'{"question_id": 2, "turns": ["\xc3"]}\r\n'
    with pytest.raises(HarnessError, match=r"q\.jsonl:3: not UTF-8 text \(byte 0xc3 at byte offset 30 of the line\)"):
        load_questions(write(tmp_path / "q.jsonl", crlf))
    with pytest.raises(HarnessError, match=r"p\.jsonl:1: not UTF-8 text \(byte 0xfe at byte offset 0 "):
        load_questions(write(tmp_path / "p.jsonl", b"\xfe" + GOOD.encode()))


def test_what_question_files_may_hold(tmp_path):
    """String ids, no category (then "default"), an empty category (Gumiho's Alpaca set), a byte-order mark."""
    content = ("\ufeff" + GOOD + '{"question_id": "q-2", "turns": ["a", "b"]}\n\n'
               + '{"question_id": 3, "category": "", "turns": ["c"], "reference": ["d"]}\n')
    questions = load_questions(write(tmp_path / "q.jsonl", content))
    assert [(q.question_id, q.category, q.turns) for q in questions] == [
        (1, "qa", ("Say hi.",)), ("q-2", "default", ("a", "b")), (3, "", ("c",))]


@pytest.mark.parametrize("name", ["spec_bench", "humaneval", "gsm8k", "alpaca"])
def test_the_question_sets_of_make_data_load(name):
    for folder in (ROOT / "data", ROOT.parent / "shared" / "data"):
        path = folder / name / "question.jsonl"
        if path.is_file():
            break
    else:
        pytest.skip(f"{name} questions not found: run `make data`")
    questions = load_questions(path)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert [q.question_id for q in questions] == [line["question_id"] for line in lines]
    assert all(isinstance(q.question_id, int) and isinstance(q.category, str) for q in questions)


def test_the_command_line_reports_a_bad_question_file_in_one_line(tmp_path):
    """Bad files through `run.py`, in parallel: exit status 2, one line, no traceback, no run folder."""
    running = {}
    for name in ("not_utf8", "list_id", "null_id", "bool_id", "list_category"):
        content, message = BAD_FILES[name]
        qfile = write(tmp_path / f"{name}.jsonl", content)
        command = [sys.executable, "run.py", f"bench.question_file={qfile}", f"run.results_dir={tmp_path / 'runs'}"]
        running[name] = (subprocess.Popen(command, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE), f"error: {qfile}:{message}")
    for name, (process, expected) in running.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 2, (name, err)
        assert err.strip().splitlines() == [expected], (name, err)
        assert "Traceback" not in out + err and "Loading" not in out, name
    assert not (tmp_path / "runs").exists()


def test_make_data_without_a_source_stops_in_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """No network: the download fails with one line naming the set, the address and the fix (SPEC_BENCH_DATA), and
    neither a partial file nor an empty folder is left; a source folder that lacks a set is one line too."""
    import urllib.error
    import urllib.request

    from evaluation.tools import data

    def refused(url, timeout):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", refused)
    out = tmp_path / "data"
    with pytest.raises(SystemExit) as stop:
        data.fetch("spec_bench", out, None)
    message = str(stop.value)
    assert "\n" not in message and message.startswith("error: spec_bench: cannot download https://")
    assert "Temporary failure in name resolution" in message and "SPEC_BENCH_DATA" in message
    assert not out.exists()

    (tmp_path / "partial" / "gsm8k").mkdir(parents=True)  # a source folder without spec_bench
    with pytest.raises(SystemExit, match=r"^error: .*spec_bench/question.jsonl is missing \(the folder of question"):
        data.fetch("spec_bench", out, tmp_path / "partial")
    assert not out.exists()
    monkeypatch.setenv("SPEC_BENCH_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match=r"^error: SPEC_BENCH_DATA=.*nowhere is not a folder"):
        data.local_source()
