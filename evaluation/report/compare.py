"""Two run sets side by side (two commits, two machines, two settings): `python -m evaluation.report --compare A B
[--out DIR]`. Each set is read and summarised as its own report does (each method against the vanilla run of its
own set); the methods both sets ran are joined by model, label, token budget and temperature, with the ratios B / A
of speedup, MAT and tokens/s, each set's losslessness, and where each was measured.
"""

from __future__ import annotations

import pandas as pd

from evaluation.engine.errors import HarnessError
from evaluation.report.load import load_runs, lossless_table, method_sort_key, provenance
from evaluation.report.stats import summarize

KEYS = ["model", "method_label", "max_new_tokens", "temperature"]
METRICS = ["speedup", "mat", "tokens_per_s"]


def set_summary(folder) -> tuple[pd.DataFrame, str]:
    """One row per method setting of a run set (overall, mean over repeats), and its provenance line."""
    df = load_runs(folder)
    if df.empty:
        raise HarnessError(f"no runs under {folder}")
    summary = summarize(df)
    if summary.empty:
        raise HarnessError(f"no method under {folder} has a vanilla run to compare with")
    rows = summary[summary.subtask == "overall"].groupby(KEYS, sort=False)[METRICS].mean()
    lossless = lossless_table(df)
    equal = lossless.groupby(["model", "method_label"]).equal.agg(lambda s: f"{int(s.sum())}/{len(s)}")
    rows["lossless"] = [equal.get((model, label), "–") for model, label, *_ in rows.index]
    return rows, provenance(df.run_dir.unique(), df)


def compare(folder_a, folder_b) -> tuple[pd.DataFrame, str]:
    """The joined table (methods both sets ran, then those only one did) and its Markdown."""
    a, where_a = set_summary(folder_a)
    b, where_b = set_summary(folder_b)
    table = a.join(b, how="outer", lsuffix="_a", rsuffix="_b").reset_index()
    for metric in METRICS:
        table[f"{metric}_b_over_a"] = table[f"{metric}_b"] / table[f"{metric}_a"]
    one_side = (table.speedup_a.isna() | table.speedup_b.isna()).tolist()  # methods both sets ran come first
    order = sorted(range(len(table)), key=lambda i: (one_side[i], method_sort_key(table.method_label.iloc[i])))
    table = table.iloc[order].reset_index(drop=True)
    lines = [f"# Run sets compared: A = `{folder_a}`, B = `{folder_b}`", "",
             f"- A: {where_a}", f"- B: {where_b}", "",
             "Each method against its own set's vanilla run (overall, mean over repeats); B / A above 1: B is "
             "higher. A method only one set ran has blanks on the other side.", "",
             "| method | model | tokens | T | speedup A | speedup B | B / A | MAT A | MAT B | B / A | tokens/s B / A | "
             "lossless A | lossless B |", "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|:--|:--|"]
    for row in table.itertuples():
        cells = [row.method_label, row.model, row.max_new_tokens, f"{row.temperature:g}",
                 *(_number(getattr(row, f"{m}")) for m in ("speedup_a", "speedup_b", "speedup_b_over_a", "mat_a",
                                                           "mat_b", "mat_b_over_a", "tokens_per_s_b_over_a")),
                 _text(row.lossless_a), _text(row.lossless_b)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return table, "\n".join(lines) + "\n"


def _number(value) -> str:
    return "–" if pd.isna(value) else f"{value:.2f}"


def _text(value) -> str:
    return "–" if not isinstance(value, str) else value
