"""Interleaved runs: every cell answers a question before the next question starts, into ordinary run folders."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evaluation.report.cli import main as report_main
from evaluation.report.load import load_runs
from evaluation.run import interleave, orchestrate
from evaluation.engine.errors import HarnessError
from evaluation.report.figures.common import with_settings
from tests.conftest import ROOT
from tests.test_runner import QUESTIONS, small_config, write_questions


def common(tmp_path, qfile, *extra) -> list[str]:
    return [f"bench.question_file={qfile}", "bench.max_new_tokens=6", "bench.warmup=0",
            f"run.results_dir={tmp_path / 'runs'}", "run.progress=false", "model.dtype=float32", "run.device=cpu",
            *extra]


def answers(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "answers.jsonl").read_text().splitlines()]


def test_cells_take_turns_per_question_and_compare_only_among_themselves(lm, tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    args = common(tmp_path, qfile)
    vanilla, pld = interleave.interleave(["method=vanilla", "method=pld"], args)
    by_cell = {"vanilla": answers(vanilla), "pld": answers(pld)}
    assert [a["question_id"] for a in by_cell["pld"]] == [1, 2, 3]
    for v, p in zip(by_cell["vanilla"], by_cell["pld"]):  # lossless, as in any run
        assert v["choices"][0]["token_ids"] == p["choices"][0]["token_ids"]

    # Written in the order answered: question by question, each question in its own drawn order of the cells.
    written = sorted((a["tstamp"], a["question_id"], cell) for cell, lines in by_cell.items() for a in lines)
    names = ["vanilla", "pld"]
    assert [(q, cell) for _, q, cell in written] == [
        (q, names[i]) for number, q in enumerate([1, 2, 3]) for i in interleave.turn_order(2, 0, 0, number)]

    manifests = [json.loads((f / "manifest.json").read_text()) for f in (vanilla, pld)]
    assert manifests[0]["comparison"]["schedule"] == {"interleaved": ["pld", "vanilla"]}
    assert manifests[0]["comparison_key"] == manifests[1]["comparison_key"]

    # A vanilla run of run.py in the same folder is another setting: pld is compared with its own vanilla only.
    [plain] = orchestrate.run(small_config(tmp_path, qfile))
    assert plain not in (vanilla, pld)
    runs = load_runs(tmp_path / "runs")
    assert runs.groupby("comparison_key").method.apply(sorted).map(tuple).value_counts().to_dict() == {
        ("pld", "pld", "pld", "vanilla", "vanilla", "vanilla"): 1, ("vanilla", "vanilla", "vanilla"): 1}
    report_main(["--results", str(tmp_path / "runs"), "--out", str(tmp_path / "report")])
    headings = [line for line in (tmp_path / "report" / "report.md").read_text().splitlines() if line.startswith("## ")]
    assert sum("interleaved per question" in heading for heading in headings) == 1  # pld's comparison, not run.py's
    # The figures draw both in one setting (the same measurement, scheduled differently) and say so.
    titles = with_settings(runs).groupby("setting").setting_title.unique()
    assert len(titles) == 1 and list(titles.iloc[0]) == [titles.iloc[0][0]]
    assert titles.iloc[0][0].endswith(", partly interleaved per question")

    # A kill while pld's last answer was being written: the same command redoes that answer only.
    data = (pld / "answers.jsonl").read_bytes()
    cut = data.rfind(b"\n", 0, len(data) - 1) + 1
    (pld / "answers.jsonl").write_bytes(data[: cut + 20])
    before = (vanilla / "answers.jsonl").read_bytes()
    assert interleave.interleave(["method=vanilla", "method=pld"], args) == [vanilla, pld]
    assert (vanilla / "answers.jsonl").read_bytes() == before
    again = answers(pld)
    assert [a["question_id"] for a in again] == [1, 2, 3] and again[:2] == by_cell["pld"][:2]
    assert again[2]["choices"][0]["token_ids"] == by_cell["pld"][2]["choices"][0]["token_ids"]


def test_turn_order_varies_neighbours_and_places_and_repeats_itself():
    # 14 cells over 12 questions, as in the budget's benchmark: no cell always follows the same cell or always
    # stands in the same place (a rotation keeps every cell's predecessor fixed), and the same seed, repeat and
    # question give the same order, so a resumed run answers in the order it would have.
    orders = [interleave.turn_order(14, 0, 0, number) for number in range(12)]
    assert all(sorted(order) == list(range(14)) for order in orders)
    for cell in range(14):
        predecessors = {order[order.index(cell) - 1] if order.index(cell) else None for order in orders}
        places = {order.index(cell) for order in orders}
        assert len(predecessors) > 1 and len(places) > 1
    assert orders == [interleave.turn_order(14, 0, 0, number) for number in range(12)]
    assert orders != [interleave.turn_order(14, 0, 1, number) for number in range(12)]
    assert orders != [interleave.turn_order(14, 1, 0, number) for number in range(12)]


@pytest.mark.parametrize("cells, extra, message", [
    (["method=vanilla", "method=pld bench.max_new_tokens=8"], [], "its bench options differ .*put bench options after --"),
    (["method=vanilla", "method=pld", "method=pld"], [], "cells given twice: pld"),
    (["method=vanilla", "method=pld run.repeats=2"], [], "run.repeats differs"),
    (["method=vanilla", "method=pld method.max_ngram_size=0"], [], "cell 'method=pld method.max_ngram_size=0': .*max_ngram_size"),
    (["method=vanilla", "method=pdl"], [], "cell 'method=pdl': .*pdl"),
    ([], [], "no cells"),
])
def test_bad_cells_fail_in_one_line_and_write_nothing(tmp_path, cells, extra, message):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    with pytest.raises(HarnessError, match=message) as caught:
        interleave.interleave(cells, common(tmp_path, qfile, *extra))
    assert "\n" not in str(caught.value) and not (tmp_path / "runs").exists()


def test_command_line_error_is_one_line(tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    done = subprocess.run([sys.executable, "-m", "evaluation.run.interleave", "method=vanilla", "method=pld",
                           "--", f"bench.question_file={qfile}", "bench.max_new_tokens=-1",
                           f"run.results_dir={tmp_path / 'runs'}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: cell 'method=vanilla': ") and "max_new_tokens" in line
