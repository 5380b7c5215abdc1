"""The running-time breakdown (the Spec-Bench paper's Figure 4 analogue) and the acceptance detail."""

from __future__ import annotations

import numpy as np
import pandas as pd

from evaluation.engine.timing import PARTS
from evaluation.figures.common import (PART_COLOURS, _title, colour_map, order_methods, plt, summarize_settings,
                                       with_settings)

def plot_breakdown(df: pd.DataFrame, setting: str | None = None, ax=None):
    """Stacked horizontal bars: each part's share of total wall time (%) per method, mean over repeats.

    `setting`: which setting (see with_settings); default the first. Returns the figure.
    """
    summary = summarize_settings(df)
    setting = setting or sorted(summary.setting.unique())[0]
    rows = summary[(summary.setting == setting) & (summary.subtask == "overall")]
    labels = order_methods(rows)
    fracs = rows.groupby("method_label")[[f"frac_{p}" for p in PARTS]].mean().reindex(labels) * 100
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, max(2.6, 1.1 + 0.55 * len(labels))))
    fig = ax.figure
    y = np.arange(len(labels))
    left = np.zeros(len(labels))
    for part in PARTS:
        values = fracs[f"frac_{part}"].to_numpy()
        ax.barh(y, values, left=left, color=PART_COLOURS[part], label=part, edgecolor="white", linewidth=0.5)
        for yi, (l0, v) in enumerate(zip(left, values)):
            if v >= 6:
                ax.text(l0 + v / 2, yi, f"{v:.0f}", ha="center", va="center", fontsize=8,
                        color="black" if part == "tree" else "white")
        left += values
    ax.set_yticks(y, labels)
    ax.invert_yaxis()  # vanilla on top
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of wall time (%)")
    ax.set_ylabel("method")
    ax.set_title("Running-time breakdown\n" + _title(rows.setting_title.iloc[0], rows), fontsize=10)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False, title="part",
              title_fontsize=8)
    return fig


# ---------------------------------------------------------------- acceptance detail


def accept_lengths(df: pd.DataFrame, setting: str | None = None) -> dict[str, np.ndarray]:
    """Every accepted length of every step, pooled over questions, turns and repeats, per method label.

    Each turn's first entry is its prefill step (always 1); turns can't be told apart in the flat list, so those
    entries are kept: the share of length 1 is slightly inflated, by one step per turn.
    """
    df = with_settings(df)
    ok = df[(df.status == "ok")]
    if setting is not None:
        ok = ok[ok.setting == setting]
    out = {}
    for label in order_methods(ok):
        lists = ok[ok.method_label == label].accept_lengths
        out[label] = np.asarray([x for lst in lists for x in lst], dtype=int)
    return out


def plot_acceptance(df: pd.DataFrame, setting: str | None = None, include_vanilla: bool = False, cap: int = 12):
    """Left: histogram of accepted length per step (share of steps, %), lengths >= `cap` pooled into one bar.
    Right: P(accepted length > d) for draft depth d = 1..max, one line per method.

    Accepted length counts the bonus token, so length > d means at least d draft tokens were accepted. All
    entries of `accept_lengths` are used, including each turn's prefill step (length 1). Vanilla (always 1) is
    left out unless `include_vanilla`.
    """
    df = with_settings(df)
    setting = setting or sorted(df.setting.unique())[0]
    lengths = accept_lengths(df, setting)
    if not include_vanilla:
        lengths = {k: v for k, v in lengths.items() if not k.startswith("vanilla") and len(v)}
    colours = colour_map(order_methods(df))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    n = max(len(lengths), 1)
    longest = max((int(v.max()) for v in lengths.values()), default=1)
    top = min(cap, longest)
    bins = np.arange(1, top + 1)
    width = 0.8 / n
    for i, (label, values) in enumerate(lengths.items()):
        clipped = np.minimum(values, top)
        share = np.array([(clipped == b).mean() * 100 for b in bins])
        left.bar(bins - 0.4 + width * (i + 0.5), share, width=width, color=colours[label],
                 label=f"{label} (MAT {values.mean():.2f}, {len(values)} steps)")
        depths = np.arange(1, max(int(values.max()), 2))
        rate = np.array([(values > d).mean() * 100 for d in depths])
        right.plot(depths, rate, marker="o", markersize=3, color=colours[label], label=label)
    left.set_xticks(bins, [str(b) if b < top or top == longest else f"≥{b}" for b in bins])
    left.set_xlabel("accepted tokens per step (bonus included)")
    left.set_ylabel("share of decoding steps (%)")
    left.set_title("Accepted length per step")
    right.set_xlabel("draft depth d (tokens)")
    right.set_ylabel("P(accepted length > d) (%)")
    right.set_title("Acceptance by draft depth")
    right.set_ylim(0, 100)
    right.xaxis.get_major_locator().set_params(integer=True)
    right.grid(alpha=0.3)
    if not lengths:
        left.text(0.5, 0.5, "no speculative method", transform=left.transAxes, ha="center")
    summary = summarize_settings(df)
    rows = summary[summary.setting == setting] if not summary.empty else summary
    title_base = df[df.setting == setting].setting_title.iloc[0]
    fig.suptitle("Acceptance detail (all steps, each turn's prefill step included)\n"
                 + (_title(title_base, rows) if not rows.empty else title_base), fontsize=10)
    fig.tight_layout()
    if lengths:  # one legend for both panels, below them
        fig.legend(*left.get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncol=min(len(lengths), 3), fontsize=8, frameon=False)
    return fig
