"""What every table and figure shares: settings (runs grouped by their comparison without the repeat), method
order and colours (from each method's own metadata), and writers that give the same bytes on the same runs."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import matplotlib

if not os.environ.get("MPLBACKEND"):  # a notebook kernel sets its inline backend there; elsewhere draw headless
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from evaluation.catalog import method_display  # noqa: E402
from evaluation.files import replacing  # noqa: E402
from evaluation.report.load import method_sort_key  # noqa: E402 - one method order everywhere
from evaluation.report.stats import summarize  # noqa: E402
from evaluation.questions import SUBTASKS  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FLOAT_FORMAT = "%.4f"
DPI = 150

# Labels whose method sets no colour of its own (variants such as `logitspec,next_next=False`) take these in order.
EXTRA_COLOURS = ("#e377c2", "#393b79", "#637939", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
                 "#756bb1", "#636363", "#ad494a", "#8ca252")
PART_COLOURS = {
    "prefill": "#4e79a7", "draft": "#f28e2b", "budget": "#ff9da7", "tree": "#edc948", "forward": "#59a14f",
    "verify": "#e15759", "commit": "#b07aa1", "update": "#9c755f",
}
SUBTASK_COLOURS = dict(zip((*SUBTASKS, "overall"),
                           ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#000000")))


# PNG/PDF without timestamp or software version, so two builds give the same bytes.
PNG_METADATA = {"Software": None}
PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}


def order_methods(df: pd.DataFrame) -> list[str]:
    """The method labels of `df` (needs method_label, method) in the fixed order: vanilla first."""
    pairs = df[["method_label", "method"]].drop_duplicates()
    return [label for label, method in sorted(zip(pairs.method_label, pairs.method),
                                              key=lambda p: method_sort_key(p[0], p[1]))]


def colour_map(labels) -> dict[str, str]:
    """Each plain method's own colour (its config's `display.colour`); variants and methods without one get
    EXTRA_COLOURS in the order given."""
    colours, extra = {}, iter(EXTRA_COLOURS * 10)
    for label in labels:
        colours[label] = method_display(label).colour or next(extra)
    return colours


def _manifest_setting(run_dir: str) -> dict | None:
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    comparison = {k: v for k, v in manifest.get("comparison", {}).items() if k != "repeat"}
    return comparison


def with_settings(df: pd.DataFrame) -> pd.DataFrame:
    """`df` plus `setting` (a short id of the comparison block without repeat) and `setting_title`.

    Read from each run's manifest; when a manifest has gone, the run's comparison_key stands in. Runs that differ
    only in how they were scheduled (one method after another, or interleaved per question) measure the same
    thing and share a setting; its title says which were interleaved.
    """
    if "setting" in df.columns:
        return df
    ids, titles, interleaved = {}, {}, {}
    for run_dir, group in df.groupby("run_dir", sort=True):
        first = group.iloc[0]
        comparison = _manifest_setting(run_dir)
        if comparison is None:
            comparison = {"comparison_key": first.comparison_key, "model": first.model,
                          "max_new_tokens": first.max_new_tokens}
        interleaved[run_dir] = bool(comparison.pop("schedule", None))
        digest = hashlib.sha256(json.dumps(comparison, sort_keys=True, default=str).encode()).hexdigest()[:8]
        ids[run_dir] = f"{first.model}-{digest}"
        per = comparison.get("questions_per_subtask")
        parts = [str(first.model), f"max_new_tokens={comparison.get('max_new_tokens', first.max_new_tokens)}",
                 f"{'all' if per is None else per} questions/subtask"]
        if comparison.get("subtasks"):
            parts.append("subtasks=" + "+".join(map(str, comparison["subtasks"])))
        parts += [str(comparison[k]) for k in ("dtype", "device") if comparison.get(k)]
        if comparison.get("sampling"):
            parts.append(f"temperature {comparison['sampling']['temperature']:g}")
        titles[run_dir] = ", ".join(parts)
    for run_dir, setting in ids.items():  # which of the setting's runs were interleaved
        flags = {interleaved[other] for other, theirs in ids.items() if theirs == setting}
        if flags == {True}:
            titles[run_dir] += ", interleaved per question"
        elif flags == {True, False}:
            titles[run_dir] += ", partly interleaved per question"
    out = df.copy()
    out["setting"] = out.run_dir.map(ids)
    out["setting_title"] = out.run_dir.map(titles)
    return out


def summarize_settings(df: pd.DataFrame) -> pd.DataFrame:
    """`summarize(df)` (the report's) plus the setting columns (one row per comparison, method run and subtask)."""
    df = with_settings(df)
    summary = summarize(df)
    if summary.empty:
        return summary
    keys = df.drop_duplicates("comparison_key").set_index("comparison_key")
    summary["setting"] = summary.comparison_key.map(keys.setting)
    summary["setting_title"] = summary.comparison_key.map(keys.setting_title)
    return summary


def _title(setting_title: str, summary_rows: pd.DataFrame) -> str:
    # repeats per method label: they differ when, e.g., one setting ran 3 rounds and another 1
    counts = summary_rows.groupby("method_label").repeat.nunique() if not summary_rows.empty else pd.Series([0])
    low, high = int(counts.min()), int(counts.max())
    repeats = f"{high} repeat{'s' if high != 1 else ''}" if low == high else f"{low}-{high} repeats"
    questions = summary_rows[(summary_rows.subtask == "overall") & (summary_rows.method == "vanilla")].questions
    n = f", {int(questions.max())} questions" if len(questions) else ""
    return f"{setting_title}{n}, {repeats}"


def _save(fig, path_stem: Path) -> list[Path]:
    png, pdf = path_stem.with_suffix(".png"), path_stem.with_suffix(".pdf")
    with replacing(png) as tmp:
        fig.savefig(tmp, dpi=DPI, metadata=PNG_METADATA, bbox_inches="tight")
    with replacing(pdf) as tmp:
        fig.savefig(tmp, metadata=PDF_METADATA, bbox_inches="tight")
    plt.close(fig)
    return [png, pdf]


def _write_csv(table: pd.DataFrame, path: Path) -> None:
    with replacing(path) as tmp:
        table.to_csv(tmp, index=False, float_format=FLOAT_FORMAT, lineterminator="\n")


def _markdown(shown: pd.DataFrame) -> str:
    return shown.to_markdown(colalign=("left", *["right"] * shown.shape[1]), disable_numparse=True)


def _tex_escape(text: str) -> str:
    for char in "\\&%$#_{}":
        text = text.replace(char, "\\" + char)
    return text.replace("±", "$\\pm$").replace("–", "--")


def _latex(shown: pd.DataFrame, caption: str, label: str) -> str:
    body = shown.rename(columns=lambda c: c.replace("Question Answering", "QA")
                        .replace("Mathematical Reasoning", "Math")
                        .replace("Multi-turn Conversation", "MT-bench")).reset_index()
    body = body.apply(lambda col: col.map(lambda v: _tex_escape(str(v))))
    return body.to_latex(index=False, caption=_tex_escape(caption), label=label, escape=False,
                         column_format="l" + "r" * (body.shape[1] - 1))
