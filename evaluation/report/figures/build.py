"""`python -m evaluation.report.figures`: every table and figure from the saved runs, into one folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from evaluation.engine.errors import HarnessError
from evaluation.families import family
from evaluation.files import write_text
from evaluation.report.figures.ablations import ablation_table, plot_ablations
from evaluation.report.figures.gumiho import (draft_curves, family_curves, gumiho_table, plot_family_curves,
                                              plot_training_curve)
from evaluation.report.figures.common import _latex, _markdown, _save, _write_csv, summarize_settings, with_settings
from evaluation.report.figures.motivation import find_motivation, load_motivation, plot_motivation
from evaluation.report.figures.plots import budget_pairs, plot_acceptance, plot_breakdown, plot_budget
from evaluation.report.figures.tables import (LEADERBOARD_MODELS, PUBLISHED_MODEL, TABLE1_COLUMNS,
                                              default_gumiho_paper_csv, default_published_csv, leaderboard_model,
                                              load_published, published_comparison, published_table, table1,
                                              table1_display)
from evaluation.report.load import load_runs, method_sort_key, missing_runs, provenance

OUTPUT_PATTERNS = ("table1.md", "table1.tex", "table1.csv", "published_specbench.csv", "table1_vs_published.csv",
                   "ablations_*.csv", "ablations_*.png", "ablations_*.pdf", "breakdown_*.png", "breakdown_*.pdf",
                   "budget_*.csv", "budget_*.png", "budget_*.pdf", "acceptance_*.png", "acceptance_*.pdf",
                   "motivation_*.png", "motivation_*.pdf", "gumiho.csv", "training_*.png", "training_*.pdf")
DRAFTS_DIR = family("gumiho").drafts  # the committed Gumiho drafts, whose training curves get a figure each


def _remove_old_outputs(out: Path, keep: list[Path]) -> None:
    """Once the new outputs are all written, delete what an earlier build wrote here and this one did not, so a
    setting or CSV that has gone leaves no stale file."""
    kept = {path.resolve() for path in keep}
    for pattern in OUTPUT_PATTERNS:
        for path in sorted(out.glob(pattern)):
            if path.resolve() not in kept:
                path.unlink()


def _versus_published(table: pd.DataFrame, published: pd.DataFrame, out: Path, written: list[Path]) -> list[str]:
    """table1_vs_published.csv (our overall speedup and MAT beside the leaderboard's for the same target, and the
    ratios) when our runs are of a Vicuna v1.3 target; its Markdown section, or one line saying there is none."""
    models = sorted(set(table.model))
    without = [m for m in models if not leaderboard_model(m)]
    parts = [published_comparison(table, published, m) for m in models if m not in without]
    comparison = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    md = ["## Ours beside the leaderboard, same target", ""]
    if without:
        md += [f"No leaderboard rows for {', '.join(f'`{m}`' for m in without)}: the leaderboard has "
               f"{', '.join(sorted(set(LEADERBOARD_MODELS.values())))} only.", ""]
    if comparison.empty:
        return md
    _write_csv(comparison, out / "table1_vs_published.csv")
    written.append(out / "table1_vs_published.csv")
    md += ["Overall speedup and MAT, ours (mean over repeats) and the leaderboard's for the same target, and ours / "
           "published (`table1_vs_published.csv`). Published as: the leaderboard's row, from the A100 table where "
           "it has the method, else the RTX 3090 one; SAMD[EAGLE2] falls back to EAGLE-2 where our `sam` falls back "
           "to Token Recycling. Ours ran on the machine, dtype and questions each heading names; where they differ "
           "from the leaderboard's (one GPU, FP16), the speedup ratio compares machines as much as methods. The MAT "
           "ratio compares what the drafts accept (our MAT counts the prefill as a step).", ""]

    def cell(v):
        return "–" if pd.isna(v) else f"{v:.2f}"

    for setting, rows in comparison.groupby("setting", sort=False):
        shown = pd.DataFrame({
            "Speedup": rows["Overall Speedup"].map(cell), "published": rows["published Overall Speedup"].map(cell),
            "ours / published": rows["Speedup ratio"].map(cell), "MAT": rows["Overall MAT"].map(cell),
            "published MAT": rows["published Overall MAT"].map(cell),
            "MAT ours / published": rows["MAT ratio"].map(cell),
            "Published as": [f"{m} ({d})" if isinstance(m, str) else "none for this target"
                             for m, d in zip(rows.published_method, rows.device)]})
        shown.index = pd.Index(rows.method_label.tolist(), name="Method")
        md += [f"### {rows.setting_title.iloc[0]} (setting {setting}) beside {rows.published_model.iloc[0]}", "",
               _markdown(shown), ""]
    return md


def build_all(results_dir: str | Path | list[str | Path], out_dir: str | Path,
              published_csv: str | Path | None = None, motivation: list[str | Path] | None = None,
              drafts_dir: str | Path | None = DRAFTS_DIR) -> list[Path]:
    """Write every table and figure from the runs under `results_dir` (one folder, or several each compared with
    its own vanilla) into `out_dir`; returns the files."""
    out = Path(out_dir)
    df = load_runs(results_dir)
    if df.empty:  # the outputs there (committed ones, on a fresh clone) stay as they are
        raise HarnessError(f"{missing_runs(results_dir)}; {out} is left as it is")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    folders = [results_dir] if isinstance(results_dir, (str, Path)) else list(results_dir)
    md = ["# Tables and figures", "", f"From the saved runs under {', '.join(f'`{f}`' for f in folders)} "
          "(evaluation.report's numbers).", ""]
    captions: list[str] = []
    table = pd.DataFrame()
    if not df.empty:
        df = with_settings(df)
        table = table1(df)
    if table.empty:
        md += ["No method has a vanilla run to compare with yet.", ""]
    else:
        _write_csv(table, out / "table1.csv")
        written.append(out / "table1.csv")
        md += ["## Table 1: speedup over vanilla per subtask, overall MAT and speedup (ours)", "",
               "Speedup: Spec-Bench's, mean tokens/s over vanilla's on the same questions. MAT: mean accepted "
               "tokens per step, bonus included. With several repeats: mean ± standard deviation over repeats.", ""]
        tex = []
        for setting in table.setting.unique():
            rows = table[table.setting == setting]
            shown = table1_display(table, setting)
            heading = (f"{rows.setting_title.iloc[0]}, {rows.questions.max()} questions, "
                       f"{rows.repeats.max()} repeat{'s' if rows.repeats.max() != 1 else ''} (setting {setting})")
            md += [f"### {heading}", "", provenance(df[df.setting == setting].run_dir), "", _markdown(shown), ""]
            tex += [f"% setting {setting}",
                    _latex(shown, f"Speedup and MAT over vanilla: {heading}.", f"tab:table1-{setting}"), ""]
        write_text(out / "table1.tex", "\n".join(tex))
        written.append(out / "table1.tex")

    summary = summarize_settings(df) if not df.empty else pd.DataFrame()
    if not df.empty:
        compared = set(summary.comparison_key) if not summary.empty else set()
        lonely = df[~df.comparison_key.isin(compared)].drop_duplicates("run_dir").sort_values("run_dir")
        if not lonely.empty:
            md += ["Runs left out (no vanilla run with the same comparison_key):", ""]
            md += [f"- `{r.run_dir}`: {r.method_label}, {r.setting_title}, repeat {r.repeat + 1}"
                   for r in lonely.itertuples()]
            md.append("")
    published_csv = published_csv or default_published_csv()
    if published_csv is not None and Path(published_csv).is_file():
        published = load_published(published_csv)
        ours = sorted(set(df.method), key=method_sort_key) if not df.empty else None
        targets = {leaderboard_model(m) for m in table.model} if not table.empty else set()
        vicunas = sorted(targets - {None})
        target = vicunas[0] if len(vicunas) == 1 else PUBLISHED_MODEL  # the runs' own Vicuna, where they have one
        pub = published_table(published, ours, model=target)
        _write_csv(pub, out / "published_specbench.csv")
        written.append(out / "published_specbench.csv")
        other = "other hardware" if targets == {target} else "other hardware and model"
        md += [f"## Published Spec-Bench leaderboard (published, {other})", "",
               f"{target} (and a larger Vicuna where a method is published only for it), greedy, "
               "FP16, batch size 1, mean of 3 runs; Spec-Bench Leaderboard.md at "
               f"fd2c1cd, current RTX 3090 and A100 tables (from `{Path(published_csv).name}`). "
               f"Not comparable with ours: {other}. Methods not on the leaderboard "
               "(LogitSpec) are absent; SAMD[EAGLE2] is SAM-Decoding with an EAGLE-2 fallback, where our `sam` "
               "falls back to Token Recycling.", ""]
        for (model, device), rows in (pub.groupby(["model", "device"], sort=False) if not pub.empty else []):
            shown = rows.set_index("published_method")[TABLE1_COLUMNS].rename_axis("Method")
            shown = shown.apply(lambda col: col.map(lambda v: "–" if pd.isna(v) else f"{v:.2f}"))
            md += [f"### {model} on {device} (`{rows.source_table.iloc[0]}`), published", "",
                   _markdown(shown), ""]
        if not table.empty:
            md += _versus_published(table, published, out, written)
    else:
        md += ["(Published Spec-Bench table skipped: reference CSV not found.)", ""]

    paper = default_gumiho_paper_csv()
    gumiho = gumiho_table(summary, paper)
    if not gumiho.empty and (gumiho.source.str.startswith("ours")).any():
        _write_csv(gumiho, out / "gumiho.csv")
        written.append(out / "gumiho.csv")
        md += ["## Gumiho, EAGLE and EAGLE-2: ours beside the paper's", "",
               "Overall speedup and MAT (τ). The paper's rows are its mean over six benchmarks on GPUs with its "
               "released drafts for 7B-70B targets (`gumiho_paper.csv`); ours are another model, draft and machine: "
               "they show the method runs and how it ranks here, not a reproduction of the paper's numbers.", "",
               _markdown(gumiho.round(2).set_index("source")), ""]
    for model, curve_csv in (draft_curves(drafts_dir).items() if drafts_dir else []):
        figure = plot_training_curve(pd.read_csv(curve_csv), f"Gumiho draft for {model}")
        written += _save(figure, out / f"training_{model}")
        captions.append(f"- `training_{model}.png/.pdf`: held-out top-1 accuracy of the committed Gumiho draft per "
                        f"depth (1-2 serial layers, 3-7 MLP heads) against training tokens (`{curve_csv.name}`).")
        curves = family_curves(model)
        if len(curves) > 1:
            written += _save(plot_family_curves(curves, model), out / f"training_families_{model}")
            captions.append(f"- `training_families_{model}.png/.pdf`: held-out top-1 accuracy at depths 1-4 against "
                            f"training tokens, every draft family committed for {model} ({', '.join(curves)}).")

    for setting in (sorted(summary.setting.unique()) if not summary.empty else []):
        title = summary[summary.setting == setting].setting_title.iloc[0]
        written += _save(plot_breakdown(df, setting), out / f"breakdown_{setting}")
        captions.append(f"- `breakdown_{setting}.png/.pdf`: share of total wall time per part (prefill, draft, tree, "
                        f"forward, verify, commit, update) per method, mean over repeats; {title}.")
        if not (summary[summary.setting == setting].method != "vanilla").any():
            continue
        budget_figure = plot_budget(df, setting)
        if budget_figure is not None:
            pairs = budget_pairs(summary[summary.setting == setting])
            _write_csv(pairs, out / f"budget_{setting}.csv")
            written += [out / f"budget_{setting}.csv", *_save(budget_figure, out / f"budget_{setting}")]
            captions.append(f"- `budget_{setting}.png/.pdf/.csv`: overall speedup against mean verified draft nodes "
                            f"per step, each method with the draft budget off and auto (arrows); {title}.")
        written += _save(plot_acceptance(df, setting), out / f"acceptance_{setting}")
        captions.append(f"- `acceptance_{setting}.png/.pdf`: histogram of accepted tokens per step, and "
                        f"P(accepted length > d) per draft depth d, per method; all entries of accept_lengths, "
                        f"each turn's prefill step (length 1) included since turns can't be told apart; {title}.")

    ablations = ablation_table(df) if not df.empty else pd.DataFrame()
    for setting in (ablations.setting.unique() if not ablations.empty else []):
        rows = ablations[ablations.setting == setting]
        if rows.option.nunique() < 1 or len(rows) <= rows.option.nunique():
            continue  # only default runs: nothing was varied
        title = summary[summary.setting == setting].setting_title.iloc[0]
        _write_csv(rows.drop(columns="setting"), out / f"ablations_{setting}.csv")
        written += [out / f"ablations_{setting}.csv", *_save(plot_ablations(rows, title), out / f"ablations_{setting}")]
        captions.append(f"- `ablations_{setting}.png/.pdf/.csv`: LogitSpec's overall speedup and MAT against "
                        f"each ablated option (others at their defaults); {title}.")

    motivation = list(motivation) if motivation else find_motivation(folders[0])
    for path in motivation:
        path = Path(path)
        if not path.is_file():
            md += [f"(Motivation figure skipped: {path} not found.)", ""]
            continue
        title = "all subtasks" if path.stem == "combined" else path.stem
        written += _save(plot_motivation(load_motivation(path), title=title), out / f"motivation_{path.stem}")
        captions.append(f"- `motivation_{path.stem}.png/.pdf`: hit rate (%) of the next-next token among the top-k "
                        f"of the last logits, against k, per subtask (from `{path}`).")
    if not motivation:
        md += ["(Motivation figure skipped: no results/motivation/*.csv; run `python -m evaluation.tools.motivation`.)", ""]
    if captions:
        md += ["## Figures", "", *captions, ""]
    write_text(out / "table1.md", "\n".join(md))
    written.insert(0, out / "table1.md")
    _remove_old_outputs(out, written)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m evaluation.report.figures",
                                     description="Tables and figures from the saved runs")
    parser.add_argument("--results", nargs="+", default=["results/runs"],
                        help="folder(s) holding the run folders; each folder's methods are compared with its vanilla")
    parser.add_argument("--out", default="results/figures", help="where the tables and figures go")
    parser.add_argument("--published", default=None,
                        help="Spec-Bench leaderboard CSV (default: results/published/specbench_leaderboard.csv)")
    parser.add_argument("--training-curves", action=argparse.BooleanOptionalAction, default=True,
                        help="draw the committed drafts' training curves (default: yes)")
    parser.add_argument("--motivation", nargs="*", default=None,
                        help="CSV(s) of evaluation.tools.motivation (default: results/motivation/*.csv)")
    args = parser.parse_args(argv)
    try:
        written = build_all(args.results, args.out, args.published, args.motivation,
                            drafts_dir=DRAFTS_DIR if args.training_curves else None)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print((Path(args.out) / "table1.md").read_text())
    print("Written:", ", ".join(str(p) for p in written))


if __name__ == "__main__":
    main()
