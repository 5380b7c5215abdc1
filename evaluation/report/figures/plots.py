"""The running-time breakdown (the Spec-Bench paper's Figure 4 analogue), the acceptance detail, and the draft
budget's speedup against verified nodes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from evaluation.engine.timing import PARTS
from evaluation.report.figures.common import (PART_COLOURS, _title, colour_map, order_methods, plt, summarize_settings,
                                       with_settings)

BUDGET_SUFFIX = ",draft_budget="  # method labels of runs with the draft budget carry it


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

    Each turn's first entry is its prefill step (1, or 0 for a method whose prefill stops one token short); turns
    can't be told apart in the flat list, so those entries are kept: the share of length 1 (or 0) is slightly
    inflated, by one step per turn.
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
    entries of `accept_lengths` are used, including each turn's prefill step (length 1, or 0 when the prefill
    stops one token short: then a bar at 0 shows those). Vanilla (always 1) is left out unless `include_vanilla`.
    """
    df = with_settings(df)
    setting = setting or sorted(df.setting.unique())[0]
    lengths = accept_lengths(df, setting)
    if not include_vanilla:
        lengths = {k: v for k, v in lengths.items() if not k.startswith("vanilla") and len(v)}
    # Runs with the draft budget verify a cut tree: the budget figure shows them; here, what each method drafts.
    lengths = {k: v for k, v in lengths.items() if BUDGET_SUFFIX not in k}
    colours = colour_map(order_methods(df))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    n = max(len(lengths), 1)
    longest = max((int(v.max()) for v in lengths.values()), default=1)
    top = min(cap, longest)
    lowest = min((int(v.min()) for v in lengths.values() if len(v)), default=1)
    bins = np.arange(min(lowest, 1), top + 1)
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


# ---------------------------------------------------------------- the draft budget


BUDGET_MARKERS = {"off": "o", "auto": "s", "auto,replayed_curve": "^"}
BUDGET_NAMES = {"off": "draft budget off", "auto": "draft budget auto (this machine's curve)",
                "auto,replayed_curve": "draft budget auto, replayed curve"}


def budget_pairs(summary: pd.DataFrame) -> pd.DataFrame:
    """Overall speedup, MAT and verified nodes per step of each method label with the draft budget off and on,
    mean over repeats: one row per (label without the budget, budget setting)."""
    overall = summary[(summary.subtask == "overall") & (summary.method != "vanilla")]
    rows = []
    for label, group in overall.groupby("method_label", sort=False):
        base, _, budget = label.partition(BUDGET_SUFFIX)
        rows.append({"method_label": base, "method": group.method.iloc[0], "budget": budget or "off",
                     "speedup": group.speedup.mean(), "mat": group.mat.mean(),
                     "verified_per_step": group.verified_per_step.mean(),
                     "proposed_per_step": group.proposed_per_step.mean()})
    return pd.DataFrame(rows)


def plot_budget(df: pd.DataFrame, setting: str | None = None):
    """Speedup against mean verified draft nodes per step, per method: the budget off (circle) and on (square),
    joined by an arrow. Returns the figure, or None when no run of the setting used the budget."""
    summary = summarize_settings(df)
    setting = setting or sorted(summary.setting.unique())[0]
    rows = summary[summary.setting == setting]
    pairs = budget_pairs(rows)
    if pairs.empty or (pairs.budget == "off").all():
        return None
    colours = colour_map(order_methods(pairs.drop_duplicates("method_label")))
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for label in order_methods(pairs.drop_duplicates("method_label")):
        mine = pairs[pairs.method_label == label].set_index("budget")
        for i, (budget, r) in enumerate(mine.iterrows()):
            ax.scatter(r.verified_per_step, r.speedup, marker=BUDGET_MARKERS.get(budget, "x"), s=46,
                       color=colours[label], label=label if i == 0 else None, zorder=3)
        for budget in mine.index.drop("off", errors="ignore"):
            if "off" in mine.index:
                a, b = mine.loc["off"], mine.loc[budget]
                ax.annotate("", xy=(b.verified_per_step, b.speedup), xytext=(a.verified_per_step, a.speedup),
                            arrowprops={"arrowstyle": "->", "color": colours[label], "lw": 1.0,
                                        "linestyle": "-" if budget == "auto" else ":"})
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(left=-0.2)  # counts are never negative
    ax.set_xlabel("verified draft nodes per decoding step (mean)")
    ax.set_ylabel("speedup over vanilla (x)")
    ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker=marker, linestyle="", color="black", label=BUDGET_NAMES[budget])
               for budget, marker in BUDGET_MARKERS.items() if budget in set(pairs.budget)]
    first = ax.legend(handles=handles, fontsize=8, loc="lower right")
    ax.add_artist(first)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="method",
              title_fontsize=8)
    ax.set_title("The draft budget: speedup against verified nodes per step\n"
                 + _title(rows.setting_title.iloc[0], rows), fontsize=10)
    return fig
