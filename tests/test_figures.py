"""Tables and figures from small hand-made runs with known speedups (no model, a few seconds)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from evaluation.report import figures
from evaluation.catalog import method_display
from evaluation.engine.timing import PARTS
from evaluation.engine.errors import HarnessError


def write_run(folder, method, key, repeat, answers, label=None):
    """A run folder as the runner writes it: manifest.json + answers.jsonl, one turn per question."""
    folder.mkdir(parents=True)
    manifest = {"method": method, "method_label": label or method, "model": "toy", "comparison_key": key,
                "comparison": {"model": "toy", "dtype": "float32", "device": "cpu", "questions_per_subtask": 2,
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
    if path is None:
        pytest.skip("no shared/reference beside the checkout")
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
    if path is None:
        pytest.skip("no shared/reference beside the checkout")
    published = load_published(path)
    alone = published_table(published, ["sps-self", "medusa", "hydra"])
    assert {"SpS", "Medusa", "Hydra"} <= set(alone.published_method)
    assert set(alone[alone.published_method == "SpS"].method) == {"sps-self"}
    both = published_table(published, ["sps-self", "sps"])  # the method it was published for wins the row
    assert set(both[both.published_method == "SpS"].method) == {"sps"}


def test_acceptance_lengths_and_colours(runs):
    df = figures.with_settings(figures.report.load_runs(runs[0]))
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
    table = figures.ablation_table(figures.with_settings(figures.report.load_runs(root)))
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
    from evaluation.report.figures.tables import default_published_csv

    ours = pd.DataFrame([{"subtask": "overall", "method": m, "method_label": m, "model": "toy", "temperature": t,
                          "setting_title": "toy, cpu", "speedup": s, "mat": a}
                         for m, t, s, a in (("gumiho", 0.0, 0.5, 1.8), ("eagle2", 0.0, 0.4, 1.7),
                                            ("eagle", 0.0, 0.45, 1.4), ("gumiho", 1.0, 0.45, 1.6),
                                            ("pld", 0.0, 1.1, 1.7))])
    published = default_published_csv()
    paper = Path(published).with_name("gumiho_paper.csv") if published else None
    table = gumiho_table(ours, paper)
    mine = table[table.source.str.startswith("ours")]
    assert sorted(zip(mine.method, mine.temperature)) == [("eagle", 0.0), ("eagle2", 0.0), ("gumiho", 0.0),
                                                          ("gumiho", 1.0)]
    if paper is not None and paper.is_file():
        vicuna = table[(table.model == "Vicuna-7B") & (table.temperature == 0)].set_index("method")
        assert vicuna.loc["gumiho", "speedup"] == pytest.approx(2.97) and vicuna.loc["eagle2", "MAT"] > 4
        assert vicuna.loc["eagle", "speedup"] == pytest.approx(2.52)
    curves = draft_curves(Path(figures.__file__).resolve().parents[2] / "gumiho" / "drafts")
    for model, path in curves.items():
        figure = plot_training_curve(pd.read_csv(path), model)
        assert len(figure.axes[0].lines) == 7  # one line per draft depth
