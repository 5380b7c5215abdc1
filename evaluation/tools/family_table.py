"""The trained-draft families side by side, from a report of `make bench-families` (or of any bench set): one row
per method setting, with what a step costs.

    python -m evaluation.tools.family_table [--report results/families] [--name families]

Reads the report's `report.csv` (overall rows) and `lossless.csv`, and the runs' manifests for the machine, commit
and settings; writes `families.csv` (the table) and `families.md` (where and how it was measured, then the table)
beside them (`--name` names them otherwise). Drafting per step is split into its parts: the draft's decoder layers
(`serial`), Gumiho's MLP heads (`mlp`), the vocabulary head (`head`: the projection onto the draft vocabulary,
what `draft_vocab` shrinks) and choosing the tree (`select`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from evaluation.engine.errors import HarnessError
from evaluation.files import write_text
from evaluation.report.load import method_sort_key

COLUMNS = {"method_label": "method", "speedup": "speedup", "mat": "MAT", "tokens_per_s": "tokens/s",
           "verified_per_step": "draft nodes/step", "ms_per_step_forward": "forward ms/step",
           "ms_per_step_draft": "draft ms/step", "ms_per_step_draft_serial": "of which layers",
           "ms_per_step_draft_mlp": "of which MLP heads", "ms_per_step_draft_head": "of which vocabulary head",
           "ms_per_step_draft_select": "of which tree selection"}


def family_table(folder: Path) -> tuple[pd.DataFrame, str]:
    report_csv, lossless_csv = folder / "report.csv", folder / "lossless.csv"
    if not report_csv.is_file():
        raise HarnessError(f"{report_csv} not found: run `make bench-families` first")
    report = pd.read_csv(report_csv)
    overall = report[report.subtask == "overall"]
    rows = overall.groupby("method_label", sort=False)[[c for c in COLUMNS if c in overall and c != "method_label"]]
    table = rows.mean().reset_index()
    if lossless_csv.is_file():
        lossless = pd.read_csv(lossless_csv)
        equal = lossless.groupby("method_label").equal.agg(lambda s: f"{int(s.sum())}/{len(s)}")
        table["equal to vanilla"] = table.method_label.map(equal).fillna("–")
    table = table.iloc[sorted(range(len(table)), key=lambda i: method_sort_key(table.method_label.iloc[i]))]
    table = table.rename(columns=COLUMNS)
    for column in table.columns[1:]:
        if table[column].dtype.kind == "f":
            table[column] = table[column].map(lambda v: "–" if pd.isna(v) else f"{v:.2f}" if v < 10 else f"{v:.0f}")
    first = Path(overall.run_dir.iloc[0]) / "manifest.json"
    manifest = json.loads(first.read_text()) if first.is_file() else {}
    env = manifest.get("environment", {})
    row = overall.iloc[0]
    where = (f"Measured on {env.get('cpu', 'an unnamed CPU')} ({env.get('cpu_count', '?')} cores, "
             f"{env.get('torch_threads', '?')} torch threads) at commit `{str(env.get('git_commit', ''))[:7]}`"
             f"{' (dirty)' if env.get('git_dirty') else ''}: {row['model']}, {row['dtype']}, max_new_tokens "
             f"{row['max_new_tokens']}, {int(row['questions'])} questions, one interleaved round.")
    return table, where


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", default="results/families", type=Path)
    parser.add_argument("--name", default="families", help="the files written: <name>.csv and <name>.md")
    args = parser.parse_args(argv)
    table, where = family_table(args.report)
    write_text(args.report / f"{args.name}.csv", table.to_csv(index=False))
    write_text(args.report / f"{args.name}.md", f"{where}\n\n{table.to_markdown(index=False)}\n")
    print(f"Written: {args.report / f'{args.name}.csv'}, {args.report / f'{args.name}.md'}")


if __name__ == "__main__":
    main()
