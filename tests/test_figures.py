"""Tables and figures from small hand-made runs with known speedups (no model, a few seconds)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from evaluation.report import figures
from evaluation.report.load import load_runs
from evaluation.catalog import method_display
from evaluation.engine.timing import PARTS
from evaluation.engine.errors import HarnessError


def write_run(folder, method, key, repeat, answers, label=None, model="toy"):
    """A run folder as the runner writes it: manifest.json + answers.jsonl, one turn per question."""
    folder.mkdir(parents=True)
    manifest = {"method": method, "method_label": label or method, "model": model, "comparison_key": key,
                "comparison": {"model": model, "dtype": "float32", "device": "cpu", "questions_per_subtask": 2,
                               "subtasks": None, "max_new_tokens": 16, "repeat": repeat}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    lines = []
    for qid, subtask, tokens, seconds, accepts in answers:
        breakdown = dict.fromkeys(PARTS, 0.0)
        breakdown.update(prefill=0.1 * seconds, draft=0.2 * seconds, forward=0.6 * seconds, verify=0.1 * seconds)
        assert sum(accepts) == tokens
        lines.append({"question_id": qid, "subtask": subtask, "status": "ok", "choices": [{
            "new_tokens": [tokens], "wall_time": [seconds], "decoding_steps": [len(accepts)],
            "accept_lengths": accepts, "token_ids": [list(range(tokens))], "time_breakdown": [breakdown]}]})
    (folder / "answers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def ones(n):
    return [1] * n


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    #                                    qid subtask tokens seconds accept_lengths
    write_run(root / "v0", "vanilla", "k0", 0, [
        (1, "qa", 10, 10.0, ones(10)),            # 1 tok/s
        (2, "qa", 20, 10.0, ones(20)),            # 2 tok/s
        (3, "rag", 30, 10.0, ones(30)),           # 3 tok/s
    ])
    write_run(root / "p0", "pld", "k0", 0, [
        (1, "qa", 10, 5.0, [1, 3, 3, 3]),         # 2 tok/s
        (2, "qa", 20, 2.0, [1, 4, 5, 5, 5]),      # 10 tok/s
        (3, "rag", 30, 5.0, [1] + [2] * 10 + [3] * 3),  # 6 tok/s
    ])
    write_run(root / "l0", "logitspec", "k0", 0, [
        (1, "qa", 10, 2.5, [1, 2, 7]),            # 4 tok/s
        (2, "qa", 20, 4.0, [1, 9, 10]),           # 5 tok/s
        (3, "rag", 30, 3.0, [1, 14, 15]),         # 10 tok/s
    ])
    # repeat 1 of the same setting: its own vanilla, and pld only
    write_run(root / "v1", "vanilla", "k1", 1, [
        (1, "qa", 10, 10.0, ones(10)),            # 1 tok/s
        (2, "qa", 20, 10.0, ones(20)),            # 2 tok/s
        (3, "rag", 30, 10.0, ones(30)),           # 3 tok/s
    ])
    write_run(root / "p1", "pld", "k1", 1, [
        (1, "qa", 10, 5.0, [1, 3, 3, 3]),         # 2 tok/s
        (2, "qa", 20, 5.0, [1, 4, 5, 5, 5]),      # 4 tok/s
        (3, "rag", 30, 7.5, [1] + [2] * 10 + [3] * 3),  # 4 tok/s
    ])
    published = tmp_path / "leaderboard.csv"
    pd.DataFrame([
        ("specbench_leaderboard_3090", "Vicuna-7B-v1.3", "Vanilla AR", "Spec-Bench", "Overall", "speedup", "1.00"),
        ("specbench_leaderboard_3090", "Vicuna-7B-v1.3", "PLD", "Spec-Bench", "Question Answering", "speedup",
         "1.28"),
        ("specbench_leaderboard_3090", "Vicuna-7B-v1.3", "PLD", "Spec-Bench", "Overall", "speedup", "1.64"),
        ("specbench_leaderboard_3090", "Vicuna-7B-v1.3", "PLD", "Spec-Bench", "RAG", "speedup", ""),  # not captured
        ("specbench_leaderboard_A100", "Vicuna-7B-v1.3", "PLD", "Spec-Bench", "Overall", "speedup", "1.66"),
        ("specbench_leaderboard_A100", "Vicuna-7B-v1.3", "EAGLE", "Spec-Bench", "Overall", "speedup", "2.0"),
        ("secondary_blog", "Vicuna-7B-v1.3", "PLD", "Spec-Bench", "Overall", "speedup", "9.99"),
        ("secondary_blog", "Vicuna-7B-v1.3", "LogitSpec", "Spec-Bench", "Overall", "speedup", "2.61"),
    ], columns=["table", "model", "method", "benchmark", "subtask", "metric", "value"]).assign(
        unit="x", note="").to_csv(published, index=False)
    motivation = tmp_path / "motivation.csv"
    pd.DataFrame({"subtask": ["qa", "qa", "rag", "rag"], "k": [1, 8, 1, 8],
                  "hit_rate": [0.2, 0.5, 0.3, 0.7]}).to_csv(motivation, index=False)
    return root, published, motivation


def build(runs, out):
    root, published, motivation = runs
    return figures.build_all(root, out, published_csv=published, motivation=[motivation])


def test_table1_values_files_and_determinism(runs, tmp_path):
    written = build(runs, tmp_path / "a")
    out = tmp_path / "a"
    table = pd.read_csv(out / "table1.csv").set_index("method_label")
    assert table.index.tolist() == ["vanilla", "pld", "logitspec"]  # fixed order, vanilla first
    assert table.setting.nunique() == 1  # two repeats of one setting
    pld, ls = table.loc["pld"], table.loc["logitspec"]
    # pld repeat 0: QA (2+10)/2 / 1.5 = 4, RAG 6/3 = 2, overall 6/2 = 3; repeat 1: QA 2, RAG 4/3, overall 10/6
    assert pld.repeats == 2
    assert pld["Question Answering"] == pytest.approx(3.0, abs=1e-4)
    assert pld["Question Answering std"] == pytest.approx(math.sqrt(2), abs=1e-4)
    assert pld["RAG"] == pytest.approx((2 + 4 / 3) / 2, abs=1e-4)
    assert pld["Overall Speedup"] == pytest.approx((3 + 10 / 6) / 2, abs=1e-4)
    assert pld["Overall MAT"] == pytest.approx(60 / 23, abs=1e-4)  # same lengths in both repeats
    assert pd.isna(pld["Translation"])  # subtask not run
    # logitspec, one repeat: QA (4+5)/2 / 1.5 = 3, RAG 10/3, overall (19/3)/2, MAT 60/9, no std
    assert ls.repeats == 1
    assert ls["Question Answering"] == pytest.approx(3.0, abs=1e-4)
    assert ls["RAG"] == pytest.approx(10 / 3, abs=1e-4)
    assert ls["Overall Speedup"] == pytest.approx(19 / 6, abs=1e-4)
    assert ls["Overall MAT"] == pytest.approx(60 / 9, abs=1e-4)
    assert pd.isna(ls["Question Answering std"])
    assert table.loc["vanilla", "Overall Speedup"] == pytest.approx(1.0)

    md = (out / "table1.md").read_text()
    assert "3.00 ± 1.41" in md and "published, other hardware and model" in md
    tex = (out / "table1.tex").read_text()
    assert "\\begin{table}" in tex and "3.00 $\\pm$ 1.41" in tex and "max\\_new\\_tokens=16" in tex
    setting = table.setting.iloc[0]
    for name in (f"breakdown_{setting}", f"acceptance_{setting}", "motivation_motivation"):
        for ext in (".png", ".pdf"):
            assert (out / (name + ext)).stat().st_size > 1000
            assert out / (name + ext) in written

    # a second build gives byte-identical CSVs (and images), and removes what an earlier build left
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "breakdown_gone-setting.png").write_bytes(b"stale")
    build(runs, tmp_path / "b")
    assert not (tmp_path / "b" / "breakdown_gone-setting.png").exists()
    for path in sorted(out.iterdir()):
        if path.suffix in (".csv", ".md", ".tex", ".png"):
            assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name


def test_published_table_drops_secondary_and_empty(runs, tmp_path):
    build(runs, tmp_path / "a")
    pub = pd.read_csv(tmp_path / "a" / "published_specbench.csv")
    assert not pub.source_table.str.startswith("secondary_").any()
    assert set(pub.source_table) == {"specbench_leaderboard_3090", "specbench_leaderboard_A100"}
    # only our methods (vanilla, pld, logitspec -> LogitSpec only in a secondary row, so absent); EAGLE left out
    assert sorted(pub.published_method.unique()) == ["PLD", "Vanilla AR"]
    row = pub[(pub.device == "RTX 3090") & (pub.method == "pld")].iloc[0]
    assert row["Question Answering"] == pytest.approx(1.28) and row["Overall Speedup"] == pytest.approx(1.64)
    assert pd.isna(row["RAG"])  # empty value dropped
    assert 9.99 not in pub.select_dtypes("number").to_numpy()


def test_a_method_published_only_for_a_larger_model_brings_that_models_rows():
    from evaluation.report.figures.tables import default_published_csv, load_published, published_table

    path = default_published_csv()
    assert path is not None  # results/published/specbench_leaderboard.csv, in the repository
    pub = published_table(load_published(path), ["eagle", "eagle2", "eagle3", "pld"])
    seven = pub[pub.model == "Vicuna-7B-v1.3"]
    assert {"EAGLE", "EAGLE2", "PLD", "Vanilla AR"} <= set(seven.published_method) and "EAGLE3" not in set(
        seven.published_method)
    thirteen = pub[pub.model == "Vicuna-13B-v1.3"].set_index("published_method")
    # EAGLE-3 is on the leaderboard for Vicuna-13B only (A100), beside EAGLE and EAGLE-2 there
    assert {"EAGLE3", "EAGLE", "EAGLE2"} <= set(thirteen.index) and set(thirteen.device) == {"A100"}
    assert thirteen.loc["EAGLE3", "Overall Speedup"] > thirteen.loc["EAGLE2", "Overall Speedup"] > 1
    assert list(pub.model.unique()) == ["Vicuna-7B-v1.3", "Vicuna-13B-v1.3"]  # 33B: nothing of ours only there
    assert published_table(load_published(path), ["pld"]).model.unique().tolist() == ["Vicuna-7B-v1.3"]


def test_the_self_draft_is_read_beside_spss_row_and_sps_keeps_it():
    from evaluation.report.figures.tables import default_published_csv, load_published, published_table

    path = default_published_csv()
    assert path is not None
    published = load_published(path)
    alone = published_table(published, ["sps-self", "medusa", "hydra"])
    assert {"SpS", "Medusa", "Hydra"} <= set(alone.published_method)
    assert set(alone[alone.published_method == "SpS"].method) == {"sps-self"}
    both = published_table(published, ["sps-self", "sps"])  # the method it was published for wins the row
    assert set(both[both.published_method == "SpS"].method) == {"sps"}


def test_the_default_build_reads_the_published_rows_kept_in_the_repository(runs, tmp_path):
    """No --published: the leaderboard rows come from results/published/, inside the repository."""
    from pathlib import Path

    from evaluation.report.figures.tables import (PUBLISHED_DIR, TABLE1_COLUMNS, default_gumiho_paper_csv,
                                                  default_published_csv)

    root = Path(__file__).resolve().parent.parent
    assert PUBLISHED_DIR == root / "results" / "published"
    assert default_published_csv() == PUBLISHED_DIR / "specbench_leaderboard.csv"
    assert default_gumiho_paper_csv() == PUBLISHED_DIR / "gumiho_paper.csv"
    runs_dir, _, motivation = runs
    out = tmp_path / "out"
    figures.main(["--results", str(runs_dir), "--out", str(out), "--no-training-curves",
                  "--motivation", str(motivation)])
    pub = pd.read_csv(out / "published_specbench.csv")
    source = pd.read_csv(PUBLISHED_DIR / "specbench_leaderboard.csv", dtype={"value": "string"})
    assert set(source.table) == {"specbench_leaderboard_3090", "specbench_leaderboard_A100"}
    # every cell of PLD's rows (Vicuna-7B, both devices) is the in-repository file's
    pld = pub[(pub.published_method == "PLD") & (pub.model == "Vicuna-7B-v1.3")].set_index("source_table")
    assert sorted(pld.index) == ["specbench_leaderboard_3090", "specbench_leaderboard_A100"]
    for table_id, row in pld.iterrows():
        mine = source[(source.table == table_id) & (source.model == "Vicuna-7B-v1.3") & (source.method == "PLD")]
        for column in TABLE1_COLUMNS:
            metric = "mean_accepted_tokens" if column == "Overall MAT" else "speedup"
            subtask = "Overall" if column.startswith("Overall") else column
            [value] = mine[(mine.subtask == subtask) & (mine.metric == metric)].value
            assert row[column] == pytest.approx(float(value)), (table_id, column)
    assert pld.loc["specbench_leaderboard_A100", "Overall Speedup"] == pytest.approx(1.66)  # Leaderboard.md@fd2c1cd
    assert pld.loc["specbench_leaderboard_3090", "Translation"] == pytest.approx(1.15)
    md = (out / "table1.md").read_text()
    assert "from `specbench_leaderboard.csv`" in md and "Published Spec-Bench table skipped" not in md


VICUNA_PUBLISHED = [  # table, model, method, subtask, metric, value: made-up numbers, easy ratios
    ("specbench_leaderboard_A100", "Vicuna-7B-v1.3", "PLD", "Overall", "speedup", "1.60"),
    ("specbench_leaderboard_A100", "Vicuna-7B-v1.3", "PLD", "Overall", "mean_accepted_tokens", "1.25"),
    ("specbench_leaderboard_3090", "Vicuna-7B-v1.3", "PLD", "Overall", "speedup", "1.64"),  # A100's wins
    ("specbench_leaderboard_3090", "Vicuna-7B-v1.3", "PLD", "Overall", "mean_accepted_tokens", "1.73"),
    ("specbench_leaderboard_3090", "Vicuna-7B-v1.3", "Vanilla AR", "Overall", "speedup", "1.00"),  # 3090 only
    ("specbench_leaderboard_3090", "Vicuna-7B-v1.3", "Vanilla AR", "Overall", "mean_accepted_tokens", "1.00"),
    ("specbench_leaderboard_A100", "Vicuna-13B-v1.3", "PLD", "Overall", "speedup", "9.00"),  # another target
    ("specbench_leaderboard_A100", "Vicuna-7B-v1.3", "PLD", "Translation", "speedup", "8.00"),  # not overall
    ("secondary_blog", "Vicuna-7B-v1.3", "LogitSpec", "Overall", "speedup", "2.61"),  # not the leaderboard
]


def test_table1_beside_the_leaderboard_rows_of_its_own_target(runs, tmp_path):
    from evaluation.report.figures.tables import leaderboard_model, load_published, published_comparison

    assert leaderboard_model("vicuna-7b-v1.3") == "Vicuna-7B-v1.3"
    assert leaderboard_model("vicuna-13b") == "Vicuna-13B-v1.3"  # a short name, as `make bench MODEL=` takes
    assert leaderboard_model("vicuna-33b-v1.3") == "Vicuna-33B-v1.3"
    assert leaderboard_model("smollm2-135m") is None and leaderboard_model("llama-2-7b") is None
    root = tmp_path / "vicuna"
    write_run(root / "v", "vanilla", "k", 0, [(1, "qa", 10, 10.0, ones(10))], model="vicuna-7b-v1.3")  # 1 tok/s
    write_run(root / "p", "pld", "k", 0, [(1, "qa", 10, 5.0, [1, 3, 3, 3])], model="vicuna-7b-v1.3")  # 2 tok/s
    write_run(root / "l", "logitspec", "k", 0, [(1, "qa", 10, 2.5, [1, 2, 7])], model="vicuna-7b-v1.3")  # 4 tok/s
    published = tmp_path / "vicuna_leaderboard.csv"
    pd.DataFrame(VICUNA_PUBLISHED, columns=["table", "model", "method", "subtask", "metric", "value"]).assign(
        benchmark="Spec-Bench", unit="x", note="").to_csv(published, index=False)
    out = tmp_path / "out"
    figures.build_all(root, out, published_csv=published, drafts_dir=None)

    vs = pd.read_csv(out / "table1_vs_published.csv").set_index("method_label")
    assert vs.index.tolist() == ["vanilla", "pld", "logitspec"]
    assert set(vs.model) == {"vicuna-7b-v1.3"} and set(vs.published_model) == {"Vicuna-7B-v1.3"}
    pld = vs.loc["pld"]
    assert (pld.published_method, pld.device, pld.source_table) == ("PLD", "A100", "specbench_leaderboard_A100")
    assert pld["Overall Speedup"] == pytest.approx(2.0) and pld["Overall MAT"] == pytest.approx(2.5)
    assert pld["published Overall Speedup"] == pytest.approx(1.60)
    assert pld["published Overall MAT"] == pytest.approx(1.25)
    assert pld["Speedup ratio"] == pytest.approx(2.0 / 1.60, abs=1e-4)
    assert pld["MAT ratio"] == pytest.approx(2.5 / 1.25, abs=1e-4)
    vanilla = vs.loc["vanilla"]
    assert vanilla.device == "RTX 3090"  # the A100 table lacks it here
    assert vanilla["Speedup ratio"] == pytest.approx(1.0) and vanilla["MAT ratio"] == pytest.approx(1.0)
    logitspec = vs.loc["logitspec"]  # not on the leaderboard: ours only
    assert logitspec["Overall Speedup"] == pytest.approx(4.0)
    assert logitspec["Overall MAT"] == pytest.approx(10 / 3, abs=1e-4)
    assert pd.isna(logitspec.published_method) and pd.isna(logitspec["Speedup ratio"])
    assert pd.isna(logitspec["MAT ratio"])
    md = (out / "table1.md").read_text()
    assert "## Ours beside the leaderboard, same target" in md and "beside Vicuna-7B-v1.3" in md
    assert "| pld" in md and "1.25" in md and "PLD (A100)" in md and "none for this target" in md
    assert "(published, other hardware)" in md  # the published section is the runs' own target's
    assert set(pd.read_csv(out / "published_specbench.csv").model) == {"Vicuna-7B-v1.3"}

    # a target without leaderboard rows: no comparison, one line in table1.md, and the earlier CSV removed
    table = figures.table1(figures.with_settings(load_runs(runs[0])))
    assert published_comparison(table, load_published(published), "toy").empty
    assert published_comparison(table, load_published(published), "smollm2-135m").empty
    figures.build_all(runs[0], out, published_csv=published, drafts_dir=None)
    assert not (out / "table1_vs_published.csv").exists()
    md = (out / "table1.md").read_text()
    assert "No leaderboard rows for `toy`: the leaderboard has Vicuna-13B-v1.3, Vicuna-33B-v1.3, Vicuna-7B-v1.3 only." \
        in md
    assert "(published, other hardware and model)" in md


def test_acceptance_lengths_and_colours(runs):
    df = figures.with_settings(load_runs(runs[0]))
    lengths = figures.accept_lengths(df)
    assert list(lengths) == ["vanilla", "pld", "logitspec"]
    assert sorted(lengths["logitspec"].tolist()) == [1, 1, 1, 2, 7, 9, 10, 14, 15]
    colours = figures.colour_map(["vanilla", "pld", "logitspec,next_next=False", "logitspec"])
    assert colours["pld"] == method_display("pld").colour
    assert colours["logitspec,next_next=False"] == figures.EXTRA_COLOURS[0]


def test_no_runs_is_refused_and_writes_nothing(tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(HarnessError, match="no saved runs under .*make bench"):
        figures.build_all(tmp_path / "runs", tmp_path / "out", published_csv=tmp_path / "missing.csv",
                          motivation=[tmp_path / "missing_motivation.csv"])
    assert not (tmp_path / "out").exists()


def test_ablation_table_and_figure(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "v", "vanilla", "k", 0, [(1, "qa", 10, 10.0, ones(10))])  # 1 tok/s
    defaults = {"draft_tree_capacity": 64, "max_ngram_size": 3, "num_pred_tokens": 20, "next_next": True}
    variants = {"logitspec": ({}, 2.0), "logitspec,draft_tree_capacity=16": ({"draft_tree_capacity": 16}, 5.0),
                "logitspec,next_next=False": ({"next_next": False}, 10.0)}
    for i, (label, (changed, seconds)) in enumerate(variants.items()):
        folder = root / f"l{i}"
        write_run(folder, "logitspec", "k", 0, [(1, "qa", 10, seconds, [1, 4, 5])], label=label)
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["options"] = {**defaults, **changed}
        (folder / "manifest.json").write_text(json.dumps(manifest))
    table = figures.ablation_table(figures.with_settings(load_runs(root)))
    capacity = table[table.option == "draft_tree_capacity"]
    assert capacity.value.tolist() == ["16", "64"]
    assert capacity.speedup.tolist() == pytest.approx([2.0, 5.0])  # 10 tokens in 5 s and 2 s, vanilla 1 tok/s
    assert table[table.option == "next_next"].set_index("value").speedup.to_dict() == pytest.approx(
        {"False": 1.0, "True": 5.0})
    written = figures.build_all(root, tmp_path / "out")
    assert any(p.name.startswith("ablations_") and p.suffix == ".png" for p in written)


def test_gumiho_table_puts_ours_beside_the_paper_and_the_training_curve_is_drawn(tmp_path):
    from pathlib import Path

    from evaluation.report.figures.gumiho import draft_curves, gumiho_table, plot_training_curve
    from evaluation.report.figures.tables import default_gumiho_paper_csv

    ours = pd.DataFrame([{"subtask": "overall", "method": m, "method_label": m, "model": "toy", "temperature": t,
                          "setting_title": "toy, cpu", "speedup": s, "mat": a}
                         for m, t, s, a in (("gumiho", 0.0, 0.5, 1.8), ("eagle2", 0.0, 0.4, 1.7),
                                            ("eagle", 0.0, 0.45, 1.4), ("gumiho", 1.0, 0.45, 1.6),
                                            ("pld", 0.0, 1.1, 1.7))])
    paper = default_gumiho_paper_csv()
    assert paper is not None  # results/published/gumiho_paper.csv, in the repository
    table = gumiho_table(ours, paper)
    mine = table[table.source.str.startswith("ours")]
    assert sorted(zip(mine.method, mine.temperature)) == [("eagle", 0.0), ("eagle2", 0.0), ("gumiho", 0.0),
                                                          ("gumiho", 1.0)]
    vicuna = table[(table.model == "Vicuna-7B") & (table.temperature == 0)].set_index("method")
    assert vicuna.loc["gumiho", "speedup"] == pytest.approx(2.97) and vicuna.loc["eagle2", "MAT"] > 4
    assert vicuna.loc["eagle", "speedup"] == pytest.approx(2.52)
    curves = draft_curves(Path(figures.__file__).resolve().parents[2] / "gumiho" / "drafts")
    for model, path in curves.items():
        figure = plot_training_curve(pd.read_csv(path), model)
        assert len(figure.axes[0].lines) == 7  # one line per draft depth
