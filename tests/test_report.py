"""Report arithmetic on small hand-made answer files with known results."""

from __future__ import annotations

import json

import pytest

from evaluation import report
from evaluation.engine.timing import PARTS


def write_run(folder, method, key, answers, label=None, setting=None, repeat=0):
    folder.mkdir(parents=True)
    manifest = {"method": method, "method_label": label or method, "model": "toy", "comparison_key": key,
                "setting_key": setting or key, "comparison": {"repeat": repeat, "max_new_tokens": 16}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    lines = []
    for qid, subtask, tokens, seconds, steps, ids in answers:
        if tokens is None:
            lines.append({"question_id": qid, "subtask": subtask, "status": "error", "error": "boom", "choices": []})
            continue
        breakdown = dict.fromkeys(PARTS, 0.0)
        breakdown.update(prefill=0.25 * seconds, forward=0.5 * seconds, draft=0.25 * seconds)
        lines.append({"question_id": qid, "subtask": subtask, "status": "ok", "choices": [{
            "new_tokens": [tokens], "wall_time": [seconds], "decoding_steps": [steps],
            "accept_lengths": [1] * steps, "token_ids": [ids], "time_breakdown": [breakdown]}]})
    (folder / "answers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture
def toy_results(tmp_path):
    runs = tmp_path / "runs"
    #                       qid  subtask        tokens seconds steps ids
    write_run(runs / "v", "vanilla", "k1", [
        (1, "qa", 10, 10.0, 10, [1, 2, 3]),
        (2, "qa", 20, 10.0, 20, [4, 5]),
        (3, "rag", 30, 10.0, 30, [6]),
        (4, "rag", 5, 1.0, 5, [7]),
    ])
    write_run(runs / "m", "fast", "k1", [
        (1, "qa", 10, 5.0, 4, [1, 2, 3]),       # 2 tok/s
        (2, "qa", 20, 2.0, 5, [4, 9]),          # 10 tok/s, differs at token 1
        (3, "rag", 30, 5.0, 10, [6]),           # 6 tok/s
        (4, "rag", None, None, None, None),     # raised: left out on both sides
    ])
    write_run(runs / "other", "vanilla", "k2", [(1, "qa", 1, 1.0, 1, [1])])  # another comparison group
    return tmp_path


def test_speedup_mat_and_breakdown(toy_results):
    df = report.load_runs(toy_results / "runs")
    summary = report.summarize(df).set_index(["comparison_key", "method_label", "subtask"])
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
    summary, markdown = report.build(toy_results / "runs", toy_results)
    lossless = report.lossless_table(report.load_runs(toy_results / "runs"))
    assert lossless.equal.tolist() == [True, False, True]
    bad = lossless[~lossless.equal].iloc[0]
    assert (bad.question_id, bad.first_diff_turn, bad.first_diff_position) == (2, 0, 1)
    assert "| fast" in markdown and "2/3" in markdown
    assert "question 2 first differs from vanilla at turn 1, token 1" in markdown
    assert "fast question 4: boom" in markdown
    assert (toy_results / "report.csv").is_file() and (toy_results / "report.md").is_file()


def test_first_difference():
    assert report.first_difference([[1, 2], [3]], [[1, 2], [3]]) is None
    assert report.first_difference([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == (1, 1)
    assert report.first_difference([[1, 2]], [[1, 2, 3]]) == (0, 2)


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
    df = report.load_runs(runs)
    repeated = report.across_repeats(report.summarize(df)).set_index(["method_label", "subtask"])
    row = repeated.loc[("fast", "overall")]
    assert row.repeats == 2
    per_repeat = [sum(10 / (s * (1 + q / 100)) for q in range(1, 7)) / 6 / 10 for s in (0.5, 1 / 3)]
    assert row.speedup == pytest.approx(sum(per_repeat) / 2)
    assert row.speedup_std == pytest.approx(abs(per_repeat[0] - per_repeat[1]) / 2 ** 0.5)
    assert row.speedup_ci95 == pytest.approx(12.7062 * row.speedup_std / 2 ** 0.5, rel=1e-4)  # t(0.975, 1)
    tests = report.paired_tests(df).iloc[0]
    assert tests.questions == 6 and tests.faster_questions == 6
    ratios = [(20 / (1 + q / 100) + 30 / (1 + q / 100)) / 2 / 10 for q in range(1, 7)]
    geometric = float(__import__("numpy").exp(__import__("numpy").log(ratios).mean()))
    assert tests.mean_speedup_per_question == pytest.approx(geometric)
    assert tests.wilcoxon_p < 0.05
    _, markdown = report.build(runs, tmp_path)
    assert "Across repeats" in markdown and f"{row.speedup:.2f} ± {row.speedup_std:.2f}" in markdown


def test_methods_appear_in_one_fixed_order():
    labels = ["rest", "logitspec,next_next=False", "zeta", "vanilla", "logitspec", "lookahead", "pld",
              "logitspec,draft_tree_capacity=128", "logitspec,draft_tree_capacity=16"]
    assert report._method_order(labels) == [
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
    df = report.load_runs([tmp_path / "first", tmp_path / "second"])
    overall = report.summarize(df).query("subtask == 'overall'").set_index("method_label")
    assert overall.loc["fast,off", "speedup"] == pytest.approx(2.0, rel=0.02)
    assert overall.loc["fast,auto", "speedup"] == pytest.approx(2.0, rel=0.02)
    tests = report.paired_tests(df).set_index("method_label")
    assert tests.mean_speedup_per_question.tolist() == pytest.approx([2.0, 2.0], rel=0.02)
    summary, markdown = report.build([tmp_path / "first", tmp_path / "second"], tmp_path / "out")
    assert "fast,auto" in markdown and "fast,off" in markdown


def test_building_the_report_and_figures_imports_neither_torch_nor_a_method(toy_results):
    """The report and figures read saved runs only: they run where torch and the methods are not installed."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys\nfrom evaluation import report\nfrom evaluation.report import figures\n"
            f"report.main(['--results', {str(toy_results / 'runs')!r}, '--out', {str(toy_results / 'out')!r}])\n"
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

    report.build(toy_results / "runs", toy_results / "out")
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
    report.build(runs, toy_results / "out")
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
