"""Every method's overall speedup and MAT side by side for each setting the report compares (dtype,
prepacked kernels, draft budget): the same machine before and after a change to the CPU path, in one table.

    python -m evaluation.tools.speedup_by_setting [--report results/report.csv] [--out results/engine/speedup_by_setting.csv]

Reads the report's `report.csv` and each run's manifest (for the draft budget, the commit and the processor), so
it shows only what `make bench` runs measured; one column per setting (the mean over an interleaved run's rounds),
labelled by those settings. Columns of an earlier table whose runs the report no longer holds are kept (each names
its commit), unless `--replace`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from evaluation.files import write_text
from evaluation.report.load import method_sort_key


def setting_label(row, manifest: dict) -> str:
    budget = (manifest.get("draft_budget") or {}).get("mode", "off")
    kernels = "prepacked" if row["prepacked"] else "plain"
    commit = str(manifest.get("environment", {}).get("git_commit", ""))[:7]
    dtype = row["dtype"] if isinstance(row["dtype"], str) and row["dtype"] else "dtype?"
    return f"{dtype} {kernels} budget-{budget} @{commit}"


def by_setting(report: pd.DataFrame) -> pd.DataFrame:
    overall = report[report.subtask == "overall"].copy()
    labels = {}
    for key, group in overall.groupby("setting_key"):
        method_run = group[group.method != "vanilla"].iloc[0] if (group.method != "vanilla").any() else group.iloc[0]
        manifest = json.loads((Path(method_run.run_dir) / "manifest.json").read_text())
        rounds = group.comparison_key.nunique()  # an interleaved run's rounds are comparisons of one setting
        labels[key] = setting_label(method_run, manifest) + (f" x{rounds} rounds" if rounds > 1 else "")
    # two runs of the same setting (another question selection, another session) stay apart: the key names them
    counts = pd.Series(labels).value_counts()
    labels = {key: label if counts[label] == 1 else f"{label} ({key[:6]})" for key, label in labels.items()}
    overall["setting"] = overall.setting_key.map(labels)
    overall["method_label"] = overall.method_label.str.replace(r",draft_budget=\w+", "", regex=True)  # in the column
    # one cell per method and setting, the mean over its rounds: "speedup x / MAT"; vanilla's tokens/s in a last row
    means = overall.groupby(["setting", "method_label"], as_index=False)[["speedup", "mat", "tokens_per_s"]].mean()
    means["cell"] = [f"{s:.2f}x / {m:.2f}" for s, m in zip(means.speedup, means.mat)]
    table = means.pivot_table(index="method_label", columns="setting", values="cell", aggfunc="first")
    table = table[sorted(table.columns)].fillna("")
    table = table.loc[sorted(table.index, key=method_sort_key)]
    vanilla = means[means.method_label == "vanilla"].set_index("setting").tokens_per_s
    table.loc["vanilla tokens/s"] = [f"{vanilla[c]:.1f}" if c in vanilla else "" for c in table.columns]
    return table.reset_index().rename(columns={"method_label": "method (speedup x / MAT)"})


def with_earlier_columns(table: pd.DataFrame, earlier: pd.DataFrame) -> pd.DataFrame:
    """`table` plus the columns of an earlier table that it does not regenerate (settings measured before, whose
    runs are no longer here), rows matched by method."""
    index = table.columns[0]
    merged = table.set_index(index)
    kept = earlier.set_index(earlier.columns[0])
    for column in kept.columns:
        if column not in merged.columns:
            merged[column] = kept[column].reindex(merged.index)
    extra = [m for m in kept.index if m not in merged.index]
    merged = pd.concat([merged, kept.loc[extra].reindex(columns=merged.columns)])
    rows = sorted((m for m in merged.index if m != "vanilla tokens/s"), key=method_sort_key) + ["vanilla tokens/s"]
    return merged.loc[rows, sorted(merged.columns)].fillna("").reset_index().rename(columns={"index": index})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", default="results/report.csv")
    parser.add_argument("--out", default="results/engine/speedup_by_setting.csv")
    parser.add_argument("--replace", action="store_true",
                        help="drop the columns of settings this report does not hold (kept by default)")
    args = parser.parse_args(argv)
    table = by_setting(pd.read_csv(args.report))
    if Path(args.out).is_file() and not args.replace:
        table = with_earlier_columns(table, pd.read_csv(args.out, dtype=str, keep_default_na=False))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, table.fillna("").to_csv(index=False))
    print(table.to_markdown(index=False, floatfmt=".2f"))


if __name__ == "__main__":
    main()
