"""LogitSpec ablations: overall speedup and MAT against each option varied alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.catalog import method_display
from evaluation.report.figures.common import plt, summarize_settings

ABLATED_OPTIONS = ("draft_tree_capacity", "max_ngram_size", "num_pred_tokens", "next_next")


def ablation_table(df: pd.DataFrame, method: str = "logitspec") -> pd.DataFrame:
    """Overall speedup and MAT of `method` per ablated option value, mean over repeats.

    A run whose options are all defaults counts at the default value of every option; a run with exactly one
    option off its default counts for that option. Options come from each run's manifest.
    """
    summary = summarize_settings(df)
    if summary.empty:
        return pd.DataFrame()
    rows = summary[(summary.method == method) & (summary.subtask == "overall")]
    options = {}
    for run_dir in df[df.method == method].run_dir.unique():
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
        label = manifest.get("method_label", method)
        options[label] = manifest.get("options", {})
    defaults = options.get(method)
    if defaults is None:
        return pd.DataFrame()
    records = []
    for (setting, label), group in rows.groupby(["setting", "method_label"], sort=True):
        opts = options.get(label, {})
        changed = [k for k in ABLATED_OPTIONS if k in opts and opts[k] != defaults.get(k)]
        others = [k for k in opts if k not in ABLATED_OPTIONS and opts[k] != defaults.get(k)]
        if others or len(changed) > 1:
            continue
        for option in (changed or [k for k in ABLATED_OPTIONS if k in opts]):
            records.append({"setting": setting, "option": option, "value": str(opts[option]),
                            "sort": float(opts[option]), "speedup": group.speedup.mean(), "mat": group.mat.mean(),
                            "repeats": len(group)})
    if not records:
        return pd.DataFrame()
    table = pd.DataFrame(records).sort_values(["setting", "option", "sort"]).drop(columns="sort")
    return table.reset_index(drop=True)


def plot_ablations(table: pd.DataFrame, title: str = ""):
    """One panel per ablated option: speedup (left axis) and MAT (right axis) against the option's value."""
    options = [o for o in ABLATED_OPTIONS if o in set(table.option)]
    fig, axes = plt.subplots(1, len(options), figsize=(3.6 * len(options), 3.4), squeeze=False)
    for ax, option in zip(axes[0], options):
        rows = table[table.option == option]
        x = np.arange(len(rows))
        ax.plot(x, rows.speedup, "o-", color=method_display("logitspec").colour, label="speedup")
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xticks(x, rows.value)
        ax.set_xlabel(option)
        ax.set_ylabel("speedup over vanilla (x)")
        twin = ax.twinx()
        twin.plot(x, rows.mat, "s--", color="black", label="MAT")
        twin.set_ylabel("mean accepted tokens per step")
        if option == options[0]:
            ax.legend(handles=ax.get_lines()[:1] + twin.get_lines(), fontsize=8, loc="best")
    fig.suptitle(f"LogitSpec ablations{': ' + title if title else ''}", fontsize=10)
    fig.tight_layout()
    return fig
