"""The trained drafts' own outputs: the training curve of a committed draft, every family's curves side by side,
and our Gumiho/EAGLE-2 rows beside the paper's."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evaluation.families import families
from evaluation.report.figures.common import plt

PAPER_TABLES = {"gumiho_main_temp0": 0.0, "gumiho_main_temp1": 1.0}
PAPER_METHODS = {"Eagle": "eagle", "Eagle-2": "eagle2", "Gumiho": "gumiho"}
MEAN = "Mean (6 benchmarks)"


def draft_curves(drafts_dir: str | Path) -> dict[str, Path]:
    """The training curve of every committed draft: {model name: gumiho/drafts/<model>/curve.csv}."""
    return {path.parent.name: path for path in sorted(Path(drafts_dir).glob("*/curve.csv"))}


def family_curves(model: str, registry: dict | None = None) -> dict[str, pd.DataFrame]:
    """The training curves of the committed drafts of every trained-draft family (conf/family/, or `registry`) for
    `model`, by family, those that exist (`<the family's drafts>/<model>/curve.csv`)."""
    registry = families() if registry is None else registry
    paths = {name: entry.committed_dir(model) / "curve.csv" for name, entry in registry.items()}
    return {name: pd.read_csv(path) for name, path in paths.items() if path.is_file()}


def plot_family_curves(curves: dict[str, pd.DataFrame], model: str, depths=(1, 2, 3, 4),
                       registry: dict | None = None):
    """Held-out top-1 accuracy against training tokens, one panel per depth, one line per family (its registry
    title)."""
    registry = families() if registry is None else registry
    fig, axes = plt.subplots(1, len(depths), figsize=(3.2 * len(depths), 3.2), sharey=True)
    for ax, depth in zip(axes, depths):
        for family, curve in curves.items():
            column = f"acc{depth}"
            if column in curve:
                ax.plot(curve.tokens, curve[column], marker="o", markersize=3, label=registry[family].title if family in registry else family)
        ax.set_title(f"depth {depth}", fontsize=10)
        ax.set_xlabel("training tokens")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1e3:.0f}k")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("held-out top-1 accuracy")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"Drafts for {model} trained on the same ShareGPT tokens", fontsize=10)
    fig.tight_layout()
    return fig


def plot_training_curve(curve: pd.DataFrame, title: str):
    """Held-out top-1 accuracy per draft depth against training tokens."""
    depths = [c for c in curve.columns if c.startswith("acc")]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    shown = curve[curve.tokens > 0]
    cmap = plt.get_cmap("viridis")
    for i, column in enumerate(depths):
        ax.plot(shown.tokens, shown[column], marker="o", color=cmap(i / max(len(depths) - 1, 1)),
                label=f"depth {column[3:]}")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out top-1 accuracy")
    ax.set_ylim(bottom=0)
    hours = curve.wall_hours.iloc[-1]
    ax.set_title(f"{title}: {int(curve.tokens.iloc[-1]):,} tokens, {hours:.2f} h of training steps", fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def paper_rows(published_csv: str | Path) -> pd.DataFrame:
    """The paper's mean over its six benchmarks for Gumiho, EAGLE and EAGLE-2: one row per model, temperature,
    method."""
    table = pd.read_csv(published_csv)
    table = table[table.table.isin(PAPER_TABLES) & table.method.isin(PAPER_METHODS) & (table.benchmark == MEAN)]
    rows = table.pivot_table(index=["model", "table", "method"], columns="metric", values="value").reset_index()
    return pd.DataFrame({
        "source": "paper (GPU, its own benchmarks)", "model": rows.model,
        "temperature": rows.table.map(PAPER_TABLES), "method": rows.method.map(PAPER_METHODS),
        "speedup": rows.get("speedup"), "MAT": rows.get("mean_accepted_tokens")})


def our_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """Our overall rows of the paper's methods (EAGLE, EAGLE-2, Gumiho and its variants; mean over repeats), per
    setting."""
    if summary.empty:
        return pd.DataFrame()
    mine = summary[(summary.subtask == "overall") & summary.method.isin(tuple(PAPER_METHODS.values()))]
    if mine.empty:
        return pd.DataFrame()
    grouped = mine.groupby(["setting_title", "method_label", "temperature"], sort=False)
    rows = grouped[["speedup", "mat"]].mean().reset_index()
    return pd.DataFrame({"source": "ours: " + rows.setting_title, "model": mine.model.iloc[0],
                         "temperature": rows.temperature, "method": rows.method_label, "speedup": rows.speedup,
                         "MAT": rows.mat})


def gumiho_table(summary: pd.DataFrame, published_csv: str | Path | None) -> pd.DataFrame:
    """Ours next to the paper's, Gumiho against EAGLE and EAGLE-2 at each temperature."""
    parts = [our_rows(summary)]
    if published_csv is not None and Path(published_csv).is_file():
        parts.append(paper_rows(published_csv))
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame()
    table = pd.concat(parts, ignore_index=True)
    return table.sort_values(["source", "model", "temperature", "method"], kind="stable", ignore_index=True)
