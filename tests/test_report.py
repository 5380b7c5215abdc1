"""Report arithmetic on small hand-made answer files with known results."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from evaluation.engine.timing import PARTS
from evaluation.files import file_sha256
from evaluation.report.cli import main as report_main
from evaluation.report.load import _method_order, first_difference, load_runs, lossless_table
from evaluation.report.markdown import OUTPUTS, build
from evaluation.report.stats import PAIRED_COLUMNS, across_repeats, paired_tests, summarize


QUESTIONS = [(1, "qa"), (2, "qa"), (3, "rag"), (4, "rag")]


def write_questions(path, questions=QUESTIONS):
    path.write_text("".join(json.dumps({"question_id": q, "category": c, "turns": [f"question {q}?"]}) + "\n"
                            for q, c in questions))
    return path


def answer(qid, subtask, tokens, seconds, steps, ids, produced_by=None):
    """One answer line as the runner writes it (one turn); `tokens=None`: the question raised."""
    if tokens is None:
        record = {"question_id": qid, "subtask": subtask, "status": "error", "error": "boom", "choices": []}
    else:
        breakdown = dict.fromkeys(PARTS, 0.0)
        breakdown.update(prefill=0.25 * seconds, forward=0.5 * seconds, draft=0.25 * seconds)
        record = {"question_id": qid, "subtask": subtask, "status": "ok", "error": None, "choices": [{
            "turns": ["an answer"], "new_tokens": [tokens], "wall_time": [seconds], "decoding_steps": [steps],
            "accept_lengths": [1] * steps, "token_ids": [ids + [0] * (tokens - len(ids))],  # new_tokens ids
            "time_breakdown": [breakdown]}]}
    if produced_by is not None:
        record["produced_by"] = produced_by
    return record


def write_run(folder, method, key, answers, label=None, setting=None, repeat=0, question_file=None, **manifest):
    """A run folder: manifest.json (naming `question_file` and its sha256 when given) and answers.jsonl."""
    folder.mkdir(parents=True)
    comparison = {"model": "toy", "dtype": "float32", "device": "cpu", "repeat": repeat, "max_new_tokens": 16,
                  "subtasks": None, "questions_per_subtask": None}
    if question_file is not None:
        manifest.update(question_file=str(question_file))
        comparison["question_sha256"] = file_sha256(question_file)
    manifest = {"method": method, "method_label": label or method, "model": "toy", "comparison_key": key,
                "setting_key": setting or key, "comparison": comparison, **manifest}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    lines = [line if isinstance(line, dict) else answer(*line) for line in answers]
    (folder / "answers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture
def toy_results(tmp_path):
    runs = tmp_path / "runs"
    questions = write_questions(tmp_path / "questions.jsonl")
    #                       qid  subtask        tokens seconds steps ids
    write_run(runs / "v", "vanilla", "k1", [
        (1, "qa", 10, 10.0, 10, [1, 2, 3]),
        (2, "qa", 20, 10.0, 20, [4, 5]),
        (3, "rag", 30, 10.0, 30, [6]),
        (4, "rag", 5, 1.0, 5, [7]),
    ], question_file=questions)
    write_run(runs / "m", "fast", "k1", [
        (1, "qa", 10, 5.0, 4, [1, 2, 3]),       # 2 tok/s
        (2, "qa", 20, 2.0, 5, [4, 9]),          # 10 tok/s, differs at token 1
        (3, "rag", 30, 5.0, 10, [6]),           # 6 tok/s
        (4, "rag", None, None, None, None),     # raised: left out on both sides
    ], question_file=questions)
    write_run(runs / "other", "vanilla", "k2", [(1, "qa", 1, 1.0, 1, [1])],  # another comparison group
              question_file=write_questions(tmp_path / "one_question.jsonl", QUESTIONS[:1]))
    return tmp_path


def test_speedup_mat_and_breakdown(toy_results):
    df = load_runs(toy_results / "runs")
    summary = summarize(df).set_index(["comparison_key", "method_label", "subtask"])
    qa = summary.loc[("k1", "fast", "qa")]
    # Spec-Bench speedup: mean of per-question tokens/s over vanilla's mean: (2 + 10)/2 / ((1 + 2)/2) = 4
    assert qa.speedup == pytest.approx(4.0)
    # total tokens / total time: (30/7) / (30/20)
    assert qa.token_ratio_speedup == pytest.approx((30 / 7) / 1.5)
    assert qa.mat == pytest.approx(30 / 9)
    assert qa.frac_prefill == pytest.approx(0.25) and qa.frac_forward == pytest.approx(0.5)
    assert qa.ms_per_step_forward == pytest.approx(1000 * 3.5 / 9)
    overall = summary.loc[("k1", "fast", "overall")]
    assert overall.questions == 3  # question 4 raised and is excluded on both sides
    assert overall.speedup == pytest.approx(((2 + 10 + 6) / 3) / ((1 + 2 + 3) / 3))
    assert summary.loc[("k1", "vanilla", "overall")].speedup == pytest.approx(1.0)
    assert summary.loc[("k1", "vanilla", "overall")].mat == pytest.approx(1.0)


def test_losslessness_and_errors_are_reported(toy_results):
    summary, markdown = build(toy_results / "runs", toy_results)
    lossless = lossless_table(load_runs(toy_results / "runs"))
    assert lossless.equal.tolist() == [True, False, True]
    bad = lossless[~lossless.equal].iloc[0]
    assert (bad.question_id, bad.first_diff_turn, bad.first_diff_position) == (2, 0, 1)
    assert "| fast" in markdown and "2/3" in markdown
    assert "question 2 first differs from vanilla at turn 1, token 1" in markdown
    assert "fast question 4: boom" in markdown
    assert (toy_results / "report.csv").is_file() and (toy_results / "report.md").is_file()


def test_first_difference():
    assert first_difference([[1, 2], [3]], [[1, 2], [3]]) is None
    assert first_difference([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == (1, 1)
    assert first_difference([[1, 2]], [[1, 2, 3]]) == (0, 2)


def test_repeats_give_mean_spread_confidence_interval_and_paired_tests(tmp_path):
    runs = tmp_path / "runs"
    questions = [(q, "qa") for q in range(1, 7)]
    # Vanilla: 10 tok/s everywhere. The method: 20 tok/s in repeat 0, 30 tok/s in repeat 1.
    for repeat, method_seconds in ((0, 0.5), (1, 1 / 3)):
        write_run(runs / f"v{repeat}", "vanilla", f"k{repeat}", [(q, s, 10, 1.0, 10, [q]) for q, s in questions],
                  setting="S", repeat=repeat)
        write_run(runs / f"m{repeat}", "fast", f"k{repeat}",
                  [(q, s, 10, method_seconds * (1 + q / 100), 5, [q]) for q, s in questions], setting="S",
                  repeat=repeat)
    df = load_runs(runs)
    repeated = across_repeats(summarize(df)).set_index(["method_label", "subtask"])
    row = repeated.loc[("fast", "overall")]
    assert row.repeats == 2
    per_repeat = [sum(10 / (s * (1 + q / 100)) for q in range(1, 7)) / 6 / 10 for s in (0.5, 1 / 3)]
    assert row.speedup == pytest.approx(sum(per_repeat) / 2)
    assert row.speedup_std == pytest.approx(abs(per_repeat[0] - per_repeat[1]) / 2 ** 0.5)
    assert row.speedup_ci95 == pytest.approx(12.7062 * row.speedup_std / 2 ** 0.5, rel=1e-4)  # t(0.975, 1)
    tests = paired_tests(df).iloc[0]
    assert tests.questions == 6 and tests.faster_questions == 6
    ratios = [(20 / (1 + q / 100) + 30 / (1 + q / 100)) / 2 / 10 for q in range(1, 7)]
    geometric = float(__import__("numpy").exp(__import__("numpy").log(ratios).mean()))
    assert tests.mean_speedup_per_question == pytest.approx(geometric)
    assert tests.wilcoxon_p < 0.05
    _, markdown = build(runs, tmp_path)
    assert "Across repeats" in markdown and f"{row.speedup:.2f} ± {row.speedup_std:.2f}" in markdown


def test_methods_appear_in_one_fixed_order():
    labels = ["rest", "logitspec,next_next=False", "zeta", "vanilla", "logitspec", "lookahead", "pld",
              "logitspec,draft_tree_capacity=128", "logitspec,draft_tree_capacity=16"]
    assert _method_order(labels) == [
        "vanilla", "pld", "lookahead", "rest", "logitspec", "logitspec,draft_tree_capacity=16",
        "logitspec,draft_tree_capacity=128", "logitspec,next_next=False", "zeta"]


def test_several_folders_compare_each_method_with_its_own_vanilla(tmp_path):
    # Two sessions of the same setting: vanilla ran at 10 tok/s in the first and 5 tok/s in the second (a slower
    # machine that day). Each method is 2x its own session's vanilla; pooled, the second would look 1x.
    questions = [(q, "qa") for q in range(1, 5)]
    for session, (vanilla_seconds, label) in {"first": (1.0, "off"), "second": (2.0, "auto")}.items():
        runs = tmp_path / session
        write_run(runs / "v", "vanilla", "k0", [(q, s, 10, vanilla_seconds, 10, [q]) for q, s in questions],
                  setting="S")
        write_run(runs / "m", "fast", "k0", [(q, s, 10, vanilla_seconds / 2 * (1 + q % 2 / 50), 5, [q])
                                             for q, s in questions], label=f"fast,{label}", setting="S")
    df = load_runs([tmp_path / "first", tmp_path / "second"])
    overall = summarize(df).query("subtask == 'overall'").set_index("method_label")
    assert overall.loc["fast,off", "speedup"] == pytest.approx(2.0, rel=0.02)
    assert overall.loc["fast,auto", "speedup"] == pytest.approx(2.0, rel=0.02)
    tests = paired_tests(df).set_index("method_label")
    assert tests.mean_speedup_per_question.tolist() == pytest.approx([2.0, 2.0], rel=0.02)
    summary, markdown = build([tmp_path / "first", tmp_path / "second"], tmp_path / "out")
    assert "fast,auto" in markdown and "fast,off" in markdown


def test_building_the_report_and_figures_imports_neither_torch_nor_a_method(toy_results):
    """The report and figures read saved runs only: they run where torch and the methods are not installed."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys\nfrom evaluation.report import figures\nfrom evaluation.report.cli import main\n"
            f"main(['--results', {str(toy_results / 'runs')!r}, '--out', {str(toy_results / 'out')!r}])\n"
            f"figures.build_all({str(toy_results / 'runs')!r}, {str(toy_results / 'figs')!r})\n"
            "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'baselines', "
            "'logitspec', 'gumiho', 'hydra'})\nprint('LOADED', ','.join(loaded))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (toy_results / "out" / "report.md").is_file()
    assert done.stdout.strip().splitlines()[-1] == "LOADED"


def test_speedup_by_setting_puts_each_comparison_in_its_own_column(toy_results):
    import pandas as pd

    from evaluation.tools.speedup_by_setting import by_setting

    build(toy_results / "runs", toy_results / "out")
    table = by_setting(pd.read_csv(toy_results / "out" / "report.csv")).set_index("method (speedup x / MAT)")
    assert len(table.columns) == 2  # k1 and k2: the same (unknown) setting, told apart by their keys
    k1 = next(c for c in table.columns if "(k1)" in c)
    overall_speedup = ((2 + 10 + 6) / 3) / ((1 + 2 + 3) / 3)
    assert table.loc["fast", k1] == f"{overall_speedup:.2f}x / {60 / 19:.2f}"
    # vanilla's own mean tokens/s over its four questions: (1 + 2 + 3 + 5) / 4
    assert table.loc["vanilla", k1] == "1.00x / 1.00" and table.loc["vanilla tokens/s", k1] == "2.8"


def test_speedup_by_setting_keeps_earlier_settings_and_averages_rounds(toy_results):
    import pandas as pd

    from evaluation.tools.speedup_by_setting import by_setting, with_earlier_columns

    runs = toy_results / "runs"
    for round_ in (1, 2):  # the same setting again: an interleaved run's later rounds, 2x and 4x vanilla
        write_run(runs / f"v{round_}", "vanilla", f"r{round_}", [(1, "qa", 10, 10.0, 10, [1])], setting="S",
                  repeat=round_)
        write_run(runs / f"m{round_}", "fast", f"r{round_}", [(1, "qa", 10, 10.0 / (2 * round_), 5, [1])],
                  setting="S", repeat=round_)
    build(runs, toy_results / "out")
    table = by_setting(pd.read_csv(toy_results / "out" / "report.csv"))
    rounds = next(c for c in table.columns if "x2 rounds" in c)
    assert table.set_index(table.columns[0]).loc["fast", rounds] == "3.00x / 2.00"  # (2 + 4) / 2
    earlier = pd.DataFrame({table.columns[0]: ["vanilla", "slow", "vanilla tokens/s"],
                            "float32 plain budget-off @0000000": ["1.00x / 1.00", "0.50x / 1.10", "9.9"],
                            rounds: ["stale", "stale", "stale"]})
    merged = with_earlier_columns(table, earlier).set_index(table.columns[0])
    assert merged.loc["slow", "float32 plain budget-off @0000000"] == "0.50x / 1.10"  # an earlier setting, kept
    assert merged.loc["fast", rounds] == "3.00x / 2.00"  # a regenerated one, replaced
    assert merged.index[-1] == "vanilla tokens/s" and merged.loc["fast", "float32 plain budget-off @0000000"] == ""


# ---- results that cannot be silently wrong ---------------------------------------------------------------------


def report_files(out):
    return {name: (out / name).read_bytes() for name in OUTPUTS}


def clean_then_spoiled(toy_results, spoil, capsys):
    """The report of the toy runs, then of the same runs spoiled by `spoil(runs)`: both outputs and the warnings."""
    build(toy_results / "runs", toy_results / "clean")
    assert capsys.readouterr().err == ""  # the clean runs raise no warning
    spoil(toy_results / "runs")
    build(toy_results / "runs", toy_results / "spoiled")
    return report_files(toy_results / "clean"), report_files(toy_results / "spoiled"), capsys.readouterr().err


def add_lines(answers, *lines, at=None):
    """Insert raw text lines into an answers file, before line `at` (1-based), or at its end."""
    old = answers.read_text().splitlines(keepends=True)
    at = len(old) + 1 if at is None else at
    answers.write_text("".join(old[: at - 1]) + "".join(lines) + "".join(old[at - 1:]))


def same_numbers(clean, spoiled):
    for name in ("report.csv", "lossless.csv", "report_repeats.csv", "paired_tests.csv"):
        assert spoiled[name] == clean[name], name


def test_a_duplicated_vanilla_line_is_left_out_with_one_line(toy_results, capsys):
    answers = toy_results / "runs" / "v" / "answers.jsonl"
    first = answers.read_text().splitlines(keepends=True)[0]
    clean, spoiled, err = clean_then_spoiled(toy_results, lambda runs: add_lines(answers, first), capsys)
    same_numbers(clean, spoiled)  # before: vanilla.loc[1] was two rows, and fast "differed at token 0"
    assert f"{answers}:5: question_id: duplicate 1 (first answered at line 1); left out" in err.splitlines()[0]
    assert f"{answers.parent}: 1 of 5 answer lines left out (1 duplicate)" in err
    assert "2/3" in spoiled["report.md"].decode() and "first differs from vanilla at turn 1, token 0" not in \
        spoiled["report.md"].decode()


def test_an_answer_outside_the_runs_selection_is_left_out(toy_results, capsys):
    answers = toy_results / "runs" / "v" / "answers.jsonl"
    foreign = json.dumps(answer(99, "qa", 1000, 1.0, 1000, [1])) + "\n"  # 1000 tok/s: vanilla's mean would jump
    clean, spoiled, err = clean_then_spoiled(toy_results, lambda runs: add_lines(answers, foreign), capsys)
    same_numbers(clean, spoiled)
    [line, count] = err.splitlines()
    assert line.startswith(f"warning: {answers}:5: question_id 99 is not one of the questions") and "left out" in line
    assert count.endswith("1 of 5 answer lines left out (1 outside the selection)")


def test_a_question_file_changed_since_the_run_keeps_every_id_and_says_so(toy_results, capsys):
    answers = toy_results / "runs" / "v" / "answers.jsonl"
    add_lines(answers, json.dumps(answer(99, "qa", 1000, 1.0, 1000, [1])) + "\n")
    write_questions(toy_results / "questions.jsonl", QUESTIONS + [(5, "qa")])  # another sha256 than the runs'
    summary, markdown = build(toy_results / "runs", toy_results / "out")
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: question file {toy_results / 'questions.jsonl'} has changed since the run")
    assert "every answered question kept, the selection unchecked, in 2 runs" in line
    assert "the selection unchecked" in markdown.split("## Data checks")[1]
    assert summary.set_index(["comparison_key", "method_label", "subtask"]).loc[("k1", "vanilla", "qa")].questions \
        == 3  # 99 kept: the selection cannot be checked


def test_the_selection_takes_the_runs_subtasks_and_count_from_the_question_file(tmp_path, capsys):
    questions = write_questions(tmp_path / "q.jsonl")
    for folder, method in (("v", "vanilla"), ("m", "fast")):
        write_run(tmp_path / "runs" / folder, method, "k", [(q, s, 4, 1.0, 4, [q]) for q, s in QUESTIONS],
                  question_file=questions)
        manifest = tmp_path / "runs" / folder / "manifest.json"
        data = json.loads(manifest.read_text())
        data["comparison"].update(subtasks=["rag"], questions_per_subtask=1)  # asks for question 3 only
        manifest.write_text(json.dumps(data))
    df = load_runs(tmp_path / "runs")
    assert sorted(set(df.question_id)) == [3]
    assert len([line for line in capsys.readouterr().err.splitlines() if "is not one of the questions" in line]) == 6


def test_a_record_without_choices_is_one_line_not_a_traceback(toy_results, capsys):
    answers = toy_results / "runs" / "v" / "answers.jsonl"
    bad = json.dumps({"question_id": 2, "subtask": "qa", "status": "ok", "error": None}) + "\n"
    clean, spoiled, err = clean_then_spoiled(toy_results, lambda runs: add_lines(answers, bad, at=2), capsys)
    same_numbers(clean, spoiled)  # the good answer of question 2, further down, is the one counted
    assert err.splitlines()[0] == (f"warning: {answers}:2: choices: missing (a record with status \"ok\" has its "
                                   "answer there); left out")


def test_a_bad_field_is_named_with_its_file_and_line(toy_results, capsys):
    answers = toy_results / "runs" / "m" / "answers.jsonl"
    record = answer(2, "qa", 20, 2.0, 5, [4, 9])
    record["choices"][0]["token_ids"] = ["4 9"]
    clean, spoiled, err = clean_then_spoiled(
        toy_results, lambda runs: add_lines(answers, json.dumps(record) + "\n", at=1), capsys)
    same_numbers(clean, spoiled)
    assert f"{answers}:1: choices[0].token_ids: expected a list of lists of ints; left out" in err


def test_a_malformed_middle_line_is_reported_and_a_cut_last_line_is_only_noted(toy_results, capsys):
    answers = toy_results / "runs" / "v" / "answers.jsonl"

    def spoil(runs):
        add_lines(answers, '{"question_id": 2, "status": "o\n', at=3)
        with open(answers, "a") as f:
            f.write('{"question_id": 5, "sta')  # a kill in the middle of a write

    clean, spoiled, err = clean_then_spoiled(toy_results, spoil, capsys)
    same_numbers(clean, spoiled)
    lines = err.splitlines()
    assert lines[0].startswith(f"warning: {answers}:3: malformed JSON (") and lines[0].endswith("; left out")
    assert lines[1] == f"warning: {answers.parent}: 1 of 5 answer lines left out (1 bad)"
    assert lines[2].startswith(f"warning: {answers}:6: last line has no newline") and len(lines) == 3
    assert "1 of 5 answer lines left out (1 bad)" in spoiled["report.md"].decode()


def test_no_vanilla_run_writes_nothing_and_says_which_in_one_line(toy_results, capsys):
    import shutil

    out = toy_results / "out"
    report_main(["--results", str(toy_results / "runs"), "--out", str(out)])  # an earlier, complete report
    before = report_files(out)
    assert b"wilcoxon_p" in before["paired_tests.csv"]
    shutil.rmtree(toy_results / "runs" / "v")
    shutil.rmtree(toy_results / "runs" / "other")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        report_main(["--results", str(toy_results / "runs"), "--out", str(out)])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith("error: nothing to compare: no vanilla run for toy float32 on cpu, max_new_tokens=16, "
                           "repeat 1 (comparison k1, setting k1), to compare fast with")
    assert "left as they are" in line and captured.out == ""
    assert report_files(out) == before and sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)
    # After a run (run.py's --quiet-if-empty): the same line, not an error, and still nothing written.
    report_main(["--results", str(toy_results / "runs"), "--out", str(out), "--quiet-if-empty"])
    captured = capsys.readouterr()
    assert captured.out.startswith("Report not written: nothing to compare: no vanilla run") and captured.err == ""
    assert report_files(out) == before


def test_no_vanilla_run_from_the_command_line_is_one_line_and_exit_2(toy_results):
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT

    shutil.rmtree(toy_results / "runs" / "v")
    shutil.rmtree(toy_results / "runs" / "other")
    out = toy_results / "out"
    out.mkdir()
    for name in OUTPUTS:
        (out / name).write_text(f"earlier {name}\n")
    done = subprocess.run([sys.executable, "-m", "evaluation.report", "--results", str(toy_results / "runs"),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: nothing to compare: no vanilla run for toy float32") and "(comparison k1" in line
    assert {p.name: p.read_text() for p in out.iterdir()} == {name: f"earlier {name}\n" for name in OUTPUTS}


def test_the_outputs_are_replaced_together_and_none_is_left_stale(toy_results, monkeypatch):
    import pandas as pd

    runs = toy_results / "runs"
    out = toy_results / "out"
    build(runs, out)
    before = report_files(out)
    assert len(pd.read_csv(out / "paired_tests.csv")) == 1  # fast against vanilla over questions 1-3

    # A failure while the tables are written: no output is replaced, no temporary file is left.
    to_csv = pd.DataFrame.to_csv

    def fail_on_paired_tests(self, path, *args, **kwargs):
        if "paired_tests" in str(path):
            raise OSError("disk full")
        return to_csv(self, path, *args, **kwargs)

    for answers in runs.glob("*/answers.jsonl"):  # other numbers, so a partial replacement would show
        answers.write_text(answers.read_text().replace('"wall_time": [5.0]', '"wall_time": [4.0]'))
    monkeypatch.setattr(pd.DataFrame, "to_csv", fail_on_paired_tests)
    with pytest.raises(OSError, match="disk full"):
        build(runs, out)
    monkeypatch.undo()
    assert report_files(out) == before and sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)

    # Fewer questions than a paired test needs: paired_tests.csv is replaced by its header, not left stale.
    for answers in runs.glob("*/answers.jsonl"):
        answers.write_text(answers.read_text().splitlines(keepends=True)[0])
    build(runs, out)
    assert (out / "paired_tests.csv").read_text() == ",".join(PAIRED_COLUMNS) + "\n"
    assert all(report_files(out)[name] != before[name] for name in OUTPUTS)


def test_replacing_together_replaces_all_or_nothing(tmp_path):
    from evaluation.files import replacing_together

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a")
    with pytest.raises(RuntimeError):
        with replacing_together([a, b]) as (ta, tb):
            ta.write_text("new a")
            raise RuntimeError
    assert a.read_text() == "old a" and not b.exists()
    with pytest.raises(FileNotFoundError, match="b.txt"):
        with replacing_together([a, b]) as (ta, tb):
            ta.write_text("new a")  # b never written
    assert a.read_text() == "old a" and not b.exists()
    with replacing_together([a, b]) as (ta, tb):
        ta.write_text("new a")
        tb.write_text("new b")
        assert a.read_text() == "old a"  # nothing replaced before the block ends
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_a_rename_that_fails_midway_puts_the_old_files_back(tmp_path, monkeypatch):
    import os

    from evaluation import files

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a")
    b.write_text("old b")
    real = os.replace

    def second_fails(src, dst):
        if str(dst) == str(b):
            raise OSError("no")
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", second_fails)
    with pytest.raises(OSError, match="no"):
        with files.replacing_together([a, b]) as (ta, tb):
            ta.write_text("new a")
            tb.write_text("new b")
    monkeypatch.undo()
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_a_manifest_cut_short_is_one_line_and_its_run_is_left_out(toy_results, capsys):
    manifest = toy_results / "runs" / "m" / "manifest.json"
    manifest.write_text(manifest.read_text()[:60])
    summary, markdown = build(toy_results / "runs", toy_results / "out")
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: {manifest}: not valid JSON, cut short? (") and line.endswith("; run left out")
    assert "fast" not in set(summary.method_label) and "run left out" in markdown
    # The vanilla's manifest cut short: nothing to compare, one error line after the warning, no traceback.
    vanilla = toy_results / "runs" / "v" / "manifest.json"
    vanilla.write_text(vanilla.read_text()[:60])
    shutil_out = toy_results / "out2"
    with pytest.raises(SystemExit) as stop:
        report_main(["--results", str(toy_results / "runs" / "v"), "--out", str(shutil_out)])
    assert stop.value.code == 2 and not shutil_out.exists()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"warning: {vanilla}: not valid JSON") and err[1].startswith("error: no readable answer")
    assert len(err) == 2


def test_questions_still_failing_are_listed_per_run(toy_results, capsys):
    summary, markdown = build(toy_results / "runs", toy_results / "out")
    failing = markdown.split("## Questions still failing")[1]
    assert f"- toy fast, repeat 1 (`{toy_results / 'runs' / 'm'}`): 1 question (4)" in failing
    assert "  - toy fast question 4: boom" in failing
    # Answered again after it raised (a later line of the same question): no longer failing, and counted.
    add_lines(toy_results / "runs" / "m" / "answers.jsonl", json.dumps(answer(4, "rag", 5, 0.5, 5, [7])) + "\n")
    summary, markdown = build(toy_results / "runs", toy_results / "out")
    assert "Questions still failing" not in markdown and capsys.readouterr().err == ""
    overall = summary.set_index(["comparison_key", "method_label", "subtask"]).loc[("k1", "fast", "overall")]
    assert overall.questions == 4


def with_environment(folder, commit="c0ffee1234", dirty=False, threads=8, processes=None):
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["environment"] = {"git_commit": commit, "git_dirty": dirty, "torch_threads": threads, "cpu": "toy CPU",
                               "packages": {"torch": "2.0", "transformers": "4.0"}}
    if processes is not None:
        manifest["processes"] = processes
    (folder / "manifest.json").write_text(json.dumps(manifest))


def provenance_line(markdown, key="k1"):
    section = markdown.split(f"(comparison {key})")[1]
    return next(line for line in section.splitlines() if line.startswith("Machine: "))


def test_a_run_answered_at_two_commits_is_flagged(toy_results, capsys):
    runs = toy_results / "runs"
    for folder in runs.iterdir():
        with_environment(folder)
    _, markdown = build(runs, toy_results / "out")
    line = provenance_line(markdown)
    assert "; commit c0ffee1;" in line and "mixes commits" not in line and "8 torch threads" in line
    assert capsys.readouterr().err == ""

    answers = runs / "m" / "answers.jsonl"
    records = [json.loads(text) for text in answers.read_text().splitlines()]
    for i, record in enumerate(records):  # resumed at another commit after question 2, with 4 threads
        record["produced_by"] = {"git_commit": "c0ffee1234" if i < 2 else "beef5678aa", "git_dirty": False,
                                 "torch_threads": 8 if i < 2 else 4}
    answers.write_text("".join(json.dumps(r) + "\n" for r in records))
    _, markdown = build(runs, toy_results / "out")
    [warning] = capsys.readouterr().err.splitlines()
    assert warning == f"warning: {runs / 'm'}: answered at more than one commit (beef567, c0ffee1): its answers mix " \
                      "code versions"
    line = provenance_line(markdown)
    assert "; commit beef567, c0ffee1;" in line and "the fast run mixes commits (beef567, c0ffee1)" in line
    assert "4, 8 torch threads" in line


def test_the_same_commit_dirty_and_clean_is_flagged(toy_results, capsys):
    runs = toy_results / "runs"
    for folder in runs.iterdir():
        with_environment(folder)
    answers = runs / "v" / "answers.jsonl"
    records = [json.loads(text) for text in answers.read_text().splitlines()]
    records[-1]["produced_by"] = {"git_commit": "c0ffee1234", "git_dirty": True, "torch_threads": 8}
    answers.write_text("".join(json.dumps(r) + "\n" for r in records))
    _, markdown = build(runs, toy_results / "out")
    assert "answered at more than one commit (c0ffee1, c0ffee1+uncommitted changes)" in capsys.readouterr().err
    assert "the vanilla run mixes commits" in provenance_line(markdown)


def test_an_older_run_without_produced_by_reads_its_manifests_processes(toy_results, capsys):
    runs = toy_results / "runs"
    for folder in runs.iterdir():
        with_environment(folder)
    with_environment(runs / "m", processes=[{"git_commit": "c0ffee1234", "git_dirty": False, "host": "a", "pid": 1,
                                             "started": "x"},
                                            {"git_commit": "beef5678aa", "git_dirty": False, "host": "a", "pid": 2,
                                             "started": "y"}])
    _, markdown = build(runs, toy_results / "out")
    assert "answered at more than one commit (beef567, c0ffee1)" in capsys.readouterr().err
    assert "the fast run mixes commits" in provenance_line(markdown)


def test_an_output_folder_that_cannot_be_written_is_one_line(toy_results, capsys):
    out = toy_results / "out"
    out.write_text("a file where the folder should be")
    with pytest.raises(SystemExit) as stop:
        report_main(["--results", str(toy_results / "runs"), "--out", str(out)])
    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: cannot write the report into {out}: ")
    assert out.read_text() == "a file where the folder should be"


def test_two_run_sets_side_by_side(toy_results, tmp_path, capsys):
    """`--compare A B`: each method against its own set's vanilla, the B / A ratios, each set's losslessness and
    provenance; a method only one set ran has blanks on the other side; a set without runs is one line."""
    b = tmp_path / "b"
    questions = write_questions(tmp_path / "b_questions.jsonl")
    write_run(b / "v", "vanilla", "k1", [(1, "qa", 10, 5.0, 10, [1, 2, 3]), (2, "qa", 20, 5.0, 20, [4, 5]),
                                         (3, "rag", 30, 5.0, 30, [6])], question_file=questions)
    write_run(b / "m", "fast", "k1", [(1, "qa", 10, 1.0, 2, [1, 2, 3]), (2, "qa", 20, 1.0, 4, [4, 5]),
                                      (3, "rag", 30, 1.0, 6, [6])], question_file=questions)
    write_run(b / "s", "slow", "k1", [(1, "qa", 10, 10.0, 10, [1, 2, 3])], question_file=questions)
    report_main(["--compare", str(toy_results / "runs"), str(b), "--out", str(tmp_path / "cmp")])
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv").set_index("method_label")
    a_speedup = ((2 + 10 + 6) / 3) / ((1 + 2 + 3) / 3)  # test_speedup_mat_and_breakdown's overall row
    assert table.loc["fast", "speedup_a"] == pytest.approx(a_speedup) and table.loc["fast", "speedup_b"] == 5.0
    assert table.loc["fast", "speedup_b_over_a"] == pytest.approx(5.0 / a_speedup)
    assert table.loc["fast", "mat_b"] == pytest.approx(60 / 12) and table.loc["fast", "lossless_b"] == "3/3"
    assert table.loc["fast", "lossless_a"] == "2/3"
    assert pd.isna(table.loc["slow", "speedup_a"]) and table.loc["slow", "speedup_b"] == pytest.approx(0.5)
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert markdown.count("Machine: ") == 2 and "| fast | toy | 16 | 0 |" in markdown
    assert capsys.readouterr().out.strip() == markdown.strip()
    with pytest.raises(SystemExit) as stop:
        report_main(["--compare", str(toy_results / "runs"), str(tmp_path / "empty")])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("error: no runs under ")
