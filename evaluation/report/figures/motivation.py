"""The LogitSpec paper's Figure 2 analogue: how often the next-next token is in the top-k of the last logits."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evaluation.report.figures.common import SUBTASK_COLOURS, plt
from evaluation.questions import SUBTASK_TITLES

def load_motivation(path: str | Path) -> pd.DataFrame:
    """The CSV of `python -m evaluation.tools.motivation`: at least subtask, k, hit_rate (fraction or %)."""
    data = pd.read_csv(path)
    missing = {"subtask", "k", "hit_rate"} - set(data.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    return data


def plot_motivation(data: pd.DataFrame, title: str = ""):
    """Hit rate (%) against k, one line per subtask; any other text column (e.g. which token is guessed)
    sets the line style. A hit rate column entirely within [0, 1] is taken as a fraction."""
    data = data.copy()
    if data.hit_rate.max() <= 1.0:
        data["hit_rate"] = data.hit_rate * 100
    extra = [c for c in data.columns if c not in ("subtask", "k", "hit_rate") and data[c].dtype == object
             and data[c].nunique() > 1]
    style_col = extra[0] if extra else None
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    subtasks = sorted(data.subtask.unique(), key=lambda s: (list(SUBTASK_COLOURS).index(s)
                                                             if s in SUBTASK_COLOURS else 99, str(s)))
    style_values = sorted(data[style_col].unique()) if style_col else [None]
    for subtask in subtasks:
        for j, sv in enumerate(style_values):
            sel = data[data.subtask == subtask]
            if style_col:
                sel = sel[sel[style_col] == sv]
            curve = sel.groupby("k").hit_rate.mean().sort_index()
            if curve.empty:
                continue
            name = SUBTASK_TITLES.get(subtask, str(subtask)) + (f" ({sv})" if style_col else "")
            ax.plot(curve.index, curve.values, styles[j % len(styles)], marker="o", markersize=3,
                    color=SUBTASK_COLOURS.get(subtask, "#333333"), label=name)
    if "ngram_hit_rate" in data and data.subtask.isin(["all"]).any():
        # The comparison the paper draws: how often plain n-gram retrieval finds the same token.
        rate = data[data.subtask == "all"].ngram_hit_rate.iloc[0]
        rate = rate * 100 if rate <= 1.0 else rate
        ax.axhline(rate, color="#333333", linestyle="--", linewidth=1,
                   label=f"n-gram retrieval, all subtasks ({rate:.0f}%)")
    if data.k.min() > 0 and data.k.max() / data.k.min() >= 20:
        ax.set_xscale("log")
        ticks = sorted(data.k.unique())
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel("k (top-k candidates of the last logits)")
    ax.set_ylabel("hit rate (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Next-next token in the top-k of the last logits" + (f"\n{title}" if title else ""), fontsize=10)
    return fig


def find_motivation(results_dir: str | Path) -> list[Path]:
    """CSV files of results/motivation (beside the runs folder): `combined.csv` (all subtasks) when present,
    else every CSV there, sorted."""
    folder = Path(results_dir).parent / "motivation"
    combined = folder / "combined.csv"
    return [combined] if combined.is_file() else sorted(folder.glob("*.csv"))
