"""Ctrl-C and SIGTERM stop a run cleanly: one line saying what is saved and how to resume, the shell's exit status,
no traceback, a valid answers file, and the same command finishes the rest."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, question_file


def first_answer(results, process, timeout: float = 180):
    """Wait until a run folder under `results` holds its first whole answer (or the process ends)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and process.poll() is None:
        files = list(results.glob("*/*/answers.jsonl"))
        if files and files[0].read_text().count("\n") >= 1:
            return files[0]
        time.sleep(0.2)
    raise AssertionError(f"no answer written (exit status {process.poll()})")


@pytest.mark.slow
@pytest.mark.parametrize("command, how, status", [
    (["run.py", "method=pld"], signal.SIGINT, 130),
    (["-m", "evaluation.run.interleave", "method=pld", "--"], signal.SIGTERM, 143),
], ids=["run.py-ctrl-c", "interleave-sigterm"])
def test_a_stopped_run_says_what_is_saved_and_the_same_command_resumes(tmp_path, command, how, status):
    args = [sys.executable, *command, f"bench.question_file={question_file()}", "bench.questions_per_subtask=1",
            "bench.subtasks=[translation,qa,math_reasoning]", "bench.max_new_tokens=32",
            "bench.warmup=0", "run.progress=false", "run.report=false", f"run.results_dir={tmp_path / 'runs'}"]
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    answers = first_answer(tmp_path / "runs", process)
    process.send_signal(how)
    out, err = process.communicate(timeout=120)
    name = "Ctrl-C" if how == signal.SIGINT else "SIGTERM"
    assert process.returncode == status, err[-2000:]
    assert err.strip().splitlines()[-1] == (f"stopped by {name}: every finished answer is saved under "
                                            f"{tmp_path / 'runs'}; run the same command again to resume")
    assert "Traceback" not in out + err
    kept = [json.loads(line) for line in answers.read_text().splitlines()]  # whole lines only
    assert 1 <= len(kept) < 3

    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    finished = [json.loads(line) for line in answers.read_text().splitlines()]
    assert len(finished) == 3 and finished[:len(kept)] == kept
