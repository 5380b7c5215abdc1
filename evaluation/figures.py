"""Tables and figures from the saved runs: Table 1, the running-time breakdown, acceptance detail, motivation.

    python -m evaluation.figures [--results results/runs] [--out results/figures]
                                 [--published PATH] [--motivation PATH ...]

Everything is computed from saved runs only, through `evaluation.report.load_runs` / `summarize`, so the numbers
are the report's. Runs are grouped into *settings*: the manifest's `comparison` block without its `repeat` index
(model, question file, selection, token budget, dtype, device). Within a setting each repeat is compared with the
vanilla run of the same repeat (its comparison_key); with several repeats Table 1 gives mean ± sample standard
deviation over the repeats.

Written to --out:
- table1.md (Table 1 per setting, then the published Spec-Bench numbers, then the figure list with captions),
  table1.tex, table1.csv, published_specbench.csv;
- breakdown_<setting>.png/.pdf (Figure 4 analogue), acceptance_<setting>.png/.pdf, motivation_<name>.png/.pdf.

Each figure has a function taking the tidy table of `load_runs` (plus, for the published table and the motivation
figure, their CSV), so a notebook can call them one by one; `build_all(results_dir, out_dir)` does everything.
CSV files are byte-identical between two builds on the same runs (sorted rows, fixed float format); PNG and PDF
files are written without timestamps or software versions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import matplotlib

if not os.environ.get("MPLBACKEND"):  # a notebook kernel sets its inline backend there; elsewhere draw headless
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from evaluation import report  # noqa: E402
from evaluation.report import method_sort_key  # noqa: E402 - one method order everywhere
from evaluation.engine.timing import PARTS  # noqa: E402
from evaluation.questions import SUBTASK_TITLES, SUBTASKS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FLOAT_FORMAT = "%.4f"
DPI = 150

# One colour per method label, the same in every figure; other labels take EXTRA_COLOURS in method order.
METHOD_COLOURS = {
    "vanilla": "#7f7f7f",
    "pld": "#1f77b4",
    "lookahead": "#ff7f0e",
    "rest": "#2ca02c",
    "logitspec": "#d62728",
}
EXTRA_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#637939", "#843c39",
                 "#7b4173", "#3182bd", "#e6550d", "#31a354")
PART_COLOURS = {
    "prefill": "#4e79a7", "draft": "#f28e2b", "tree": "#edc948", "forward": "#59a14f",
    "verify": "#e15759", "commit": "#b07aa1", "update": "#9c755f",
}
SUBTASK_COLOURS = dict(zip((*SUBTASKS, "overall"),
                           ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#000000")))

# Our method names -> the Spec-Bench leaderboard's.
PUBLISHED_NAMES = {"vanilla": "Vanilla AR", "pld": "PLD", "lookahead": "Lookahead", "rest": "REST",
                   "logitspec": "LogitSpec"}
PUBLISHED_TABLES = {"specbench_leaderboard_3090": "RTX 3090", "specbench_leaderboard_A100": "A100"}
PUBLISHED_MODEL = "Vicuna-7B-v1.3"

TABLE1_SPEEDUP_COLUMNS = [SUBTASK_TITLES[s] for s in SUBTASKS]
TABLE1_COLUMNS = [*TABLE1_SPEEDUP_COLUMNS, "Overall MAT", "Overall Speedup"]

# PNG/PDF without timestamp or software version, so two builds give the same bytes.
PNG_METADATA = {"Software": None}
PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}


# ---------------------------------------------------------------- ordering, colours, settings


def order_methods(df: pd.DataFrame) -> list[str]:
    """The method labels of `df` (needs method_label, method) in the fixed order: vanilla first."""
    pairs = df[["method_label", "method"]].drop_duplicates()
    return [label for label, method in sorted(zip(pairs.method_label, pairs.method),
                                              key=lambda p: method_sort_key(p[0], p[1]))]


def colour_map(labels) -> dict[str, str]:
    """Fixed colours for the known methods; the others get EXTRA_COLOURS in the order given."""
    colours, extra = {}, iter(EXTRA_COLOURS * 10)
    for label in labels:
        colours[label] = METHOD_COLOURS.get(label) or next(extra)
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

    Read from each run's manifest; when a manifest has gone, the run's comparison_key stands in.
    """
    if "setting" in df.columns:
        return df
    ids, titles = {}, {}
    for run_dir, group in df.groupby("run_dir", sort=True):
        first = group.iloc[0]
        comparison = _manifest_setting(run_dir)
        if comparison is None:
            comparison = {"comparison_key": first.comparison_key, "model": first.model,
                          "max_new_tokens": first.max_new_tokens}
        digest = hashlib.sha256(json.dumps(comparison, sort_keys=True, default=str).encode()).hexdigest()[:8]
        ids[run_dir] = f"{first.model}-{digest}"
        per = comparison.get("questions_per_subtask")
        parts = [str(first.model), f"max_new_tokens={comparison.get('max_new_tokens', first.max_new_tokens)}",
                 f"{'all' if per is None else per} questions/subtask"]
        if comparison.get("subtasks"):
            parts.append("subtasks=" + "+".join(map(str, comparison["subtasks"])))
        parts += [str(comparison[k]) for k in ("dtype", "device") if comparison.get(k)]
        titles[run_dir] = ", ".join(parts)
    out = df.copy()
    out["setting"] = out.run_dir.map(ids)
    out["setting_title"] = out.run_dir.map(titles)
    return out


def summarize_settings(df: pd.DataFrame) -> pd.DataFrame:
    """report.summarize(df) plus the setting columns (one row per comparison, method run and subtask)."""
    df = with_settings(df)
    summary = report.summarize(df)
    if summary.empty:
        return summary
    keys = df.drop_duplicates("comparison_key").set_index("comparison_key")
    summary["setting"] = summary.comparison_key.map(keys.setting)
    summary["setting_title"] = summary.comparison_key.map(keys.setting_title)
    return summary


def _title(setting_title: str, summary_rows: pd.DataFrame) -> str:
    repeats = summary_rows.repeat.nunique() if not summary_rows.empty else 0
    questions = summary_rows[(summary_rows.subtask == "overall") & (summary_rows.method == "vanilla")].questions
    n = f", {int(questions.max())} questions" if len(questions) else ""
    return f"{setting_title}{n}, {repeats} repeat{'s' if repeats != 1 else ''}"


def _save(fig, path_stem: Path) -> list[Path]:
    png, pdf = path_stem.with_suffix(".png"), path_stem.with_suffix(".pdf")
    fig.savefig(png, dpi=DPI, metadata=PNG_METADATA, bbox_inches="tight")
    fig.savefig(pdf, metadata=PDF_METADATA, bbox_inches="tight")
    plt.close(fig)
    return [png, pdf]


# ---------------------------------------------------------------- Table 1


def table1(df: pd.DataFrame) -> pd.DataFrame:
    """Table 1, one row per (setting, method label): speedup per subtask, overall MAT and speedup.

    Numeric columns hold the mean over repeats; `<column> std` the sample standard deviation over repeats
    (empty with one repeat); `repeats` how many repeats went in. Rows: settings sorted, methods in fixed order.
    """
    summary = summarize_settings(df)
    if summary.empty:
        return pd.DataFrame()
    summary = summary.copy()
    summary["column"] = summary.subtask.map(lambda s: SUBTASK_TITLES[s] if s != "overall" else "Overall Speedup")
    mat = summary[summary.subtask == "overall"].assign(column="Overall MAT", speedup=lambda d: d.mat)
    long = pd.concat([summary, mat], ignore_index=True)
    grouped = long.groupby(["setting", "method_label", "column"], sort=True).speedup
    stats = pd.DataFrame({"mean": grouped.mean(), "std": grouped.std(ddof=1)}).reset_index()
    rows = []
    for (setting, label), group in stats.groupby(["setting", "method_label"], sort=True):
        mine = summary[(summary.setting == setting) & (summary.method_label == label)]
        overall = mine[mine.subtask == "overall"]
        row = {"setting": setting, "setting_title": mine.setting_title.iloc[0], "model": mine.model.iloc[0],
               "max_new_tokens": mine.max_new_tokens.iloc[0], "method": mine.method.iloc[0],
               "method_label": label, "repeats": int(mine.repeat.nunique()),
               "questions": int(overall.questions.max()) if len(overall) else 0}
        by_column = group.set_index("column")
        for column in TABLE1_COLUMNS:
            row[column] = by_column["mean"].get(column, np.nan)
        for column in TABLE1_COLUMNS:
            row[f"{column} std"] = by_column["std"].get(column, np.nan)
        rows.append(row)
    table = pd.DataFrame(rows)
    table["_order"] = [method_sort_key(label, method) for label, method in zip(table.method_label, table.method)]
    table = table.sort_values(["setting", "_order"], kind="stable").drop(columns="_order").reset_index(drop=True)
    return table


def _cell(mean, std, repeats: int) -> str:
    if pd.isna(mean):
        return "–"
    if repeats > 1 and not pd.isna(std):
        return f"{mean:.2f} ± {std:.2f}"
    return f"{mean:.2f}"


def table1_display(table: pd.DataFrame, setting: str) -> pd.DataFrame:
    """The printable Table 1 of one setting: index Method, cells '1.23' or '1.23 ± 0.04' (text)."""
    rows = table[table.setting == setting]
    shown = pd.DataFrame(
        {column: [_cell(r[column], r[f"{column} std"], r.repeats) for _, r in rows.iterrows()]
         for column in TABLE1_COLUMNS},
        index=pd.Index(rows.method_label.tolist(), name="Method"))
    return shown


# ---------------------------------------------------------------- published Spec-Bench numbers


def default_published_csv() -> Path | None:
    for candidate in (ROOT / "shared" / "reference" / "specbench_leaderboard.csv",
                      ROOT.parent / "shared" / "reference" / "specbench_leaderboard.csv"):
        if candidate.is_file():
            return candidate
    return None


def load_published(path: str | Path) -> pd.DataFrame:
    """The reference CSV without `secondary_` tables and without empty values (long format)."""
    ref = pd.read_csv(path, dtype={"value": "string"}, keep_default_na=False)
    ref = ref[~ref["table"].str.startswith("secondary_") & (ref["value"].str.strip() != "")].copy()
    ref["value"] = pd.to_numeric(ref["value"], errors="coerce")
    return ref[ref["value"].notna()].reset_index(drop=True)


def published_table(published: pd.DataFrame, methods=None, model: str = PUBLISHED_MODEL) -> pd.DataFrame:
    """Spec-Bench leaderboard numbers (current RTX 3090 and A100 tables) for our methods, Table 1's layout.

    `methods`: our method names (default all of PUBLISHED_NAMES); vanilla's row is always included.
    Methods the leaderboard lacks (LogitSpec) are simply absent.
    """
    methods = list(PUBLISHED_NAMES) if methods is None else sorted({"vanilla", *methods}, key=method_sort_key)
    names = {PUBLISHED_NAMES[m]: m for m in methods if m in PUBLISHED_NAMES}
    ref = published[published["table"].isin(PUBLISHED_TABLES) & (published["model"] == model)
                    & published["method"].isin(names)]
    rows = []
    for (table_id, method), group in ref.groupby(["table", "method"], sort=True):
        row = {"source_table": table_id, "device": PUBLISHED_TABLES[table_id], "model": model,
               "published_method": method, "method": names[method]}
        for column in TABLE1_COLUMNS:
            if column == "Overall MAT":
                sel = group[(group.subtask == "Overall") & (group.metric == "mean_accepted_tokens")]
            else:
                subtask = "Overall" if column == "Overall Speedup" else column
                sel = group[(group.subtask == subtask) & (group.metric == "speedup")]
            row[column] = sel.value.iloc[0] if len(sel) else np.nan
        rows.append(row)
    table = pd.DataFrame(rows, columns=["source_table", "device", "model", "published_method", "method",
                                        *TABLE1_COLUMNS])
    if table.empty:
        return table
    table["_order"] = [method_sort_key(m) for m in table.method]
    table["_device"] = [list(PUBLISHED_TABLES).index(t) for t in table.source_table]
    table = table.sort_values(["_device", "_order"], kind="stable")
    return table.drop(columns=["_order", "_device"]).reset_index(drop=True)


# ---------------------------------------------------------------- Figure 4 analogue: time breakdown


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


# ---------------------------------------------------------------- Figure 2 analogue: LogitSpec motivation


def load_motivation(path: str | Path) -> pd.DataFrame:
    """The CSV of `python -m logitspec.motivation`: at least subtask, k, hit_rate (fraction or %)."""
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


# ---------------------------------------------------------------- everything


# ---------------------------------------------------------------- LogitSpec ablations

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
        ax.plot(x, rows.speedup, "o-", color=METHOD_COLOURS.get("logitspec", "C0"), label="speedup")
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


def _write_csv(table: pd.DataFrame, path: Path) -> None:
    table.to_csv(path, index=False, float_format=FLOAT_FORMAT, lineterminator="\n")


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


OUTPUT_PATTERNS = ("table1.md", "table1.tex", "table1.csv", "published_specbench.csv", "ablations_*.csv",
                   "ablations_*.png", "ablations_*.pdf", "breakdown_*.png",
                   "breakdown_*.pdf", "acceptance_*.png", "acceptance_*.pdf", "motivation_*.png", "motivation_*.pdf")


def _remove_old_outputs(out: Path) -> None:
    """Delete what an earlier build wrote here, so a setting or CSV that has gone leaves no stale file."""
    for pattern in OUTPUT_PATTERNS:
        for path in sorted(out.glob(pattern)):
            path.unlink()


def build_all(results_dir: str | Path, out_dir: str | Path, published_csv: str | Path | None = None,
              motivation: list[str | Path] | None = None) -> list[Path]:
    """Write every table and figure from the runs under `results_dir` into `out_dir`; returns the files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _remove_old_outputs(out)
    written: list[Path] = []
    df = report.load_runs(results_dir)
    md = ["# Tables and figures", "", f"From the saved runs under `{results_dir}` (evaluation.report's numbers).", ""]
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
            md += [f"### {heading}", "", _markdown(shown), ""]
            tex += [f"% setting {setting}",
                    _latex(shown, f"Speedup and MAT over vanilla: {heading}.", f"tab:table1-{setting}"), ""]
        (out / "table1.tex").write_text("\n".join(tex))
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
        ours = sorted(set(df.method), key=method_sort_key) if not df.empty else None
        pub = published_table(load_published(published_csv), ours)
        _write_csv(pub, out / "published_specbench.csv")
        written.append(out / "published_specbench.csv")
        md += ["## Published Spec-Bench leaderboard (published, other hardware and model)", "",
               f"{PUBLISHED_MODEL}, greedy, FP16, batch size 1, mean of 3 runs; Spec-Bench Leaderboard.md at "
               f"fd2c1cd, current RTX 3090 and A100 tables (from `{Path(published_csv).name}`). "
               "Not comparable with ours: other hardware and model. Methods not on the leaderboard "
               "(LogitSpec) are absent.", ""]
        for device in pub.device.unique() if not pub.empty else []:
            rows = pub[pub.device == device]
            shown = rows.set_index("published_method")[TABLE1_COLUMNS].rename_axis("Method")
            shown = shown.apply(lambda col: col.map(lambda v: "–" if pd.isna(v) else f"{v:.2f}"))
            md += [f"### {PUBLISHED_MODEL} on {device} (`{rows.source_table.iloc[0]}`), published", "",
                   _markdown(shown), ""]
    else:
        md += ["(Published Spec-Bench table skipped: reference CSV not found.)", ""]

    for setting in (sorted(summary.setting.unique()) if not summary.empty else []):
        title = summary[summary.setting == setting].setting_title.iloc[0]
        written += _save(plot_breakdown(df, setting), out / f"breakdown_{setting}")
        captions.append(f"- `breakdown_{setting}.png/.pdf`: share of total wall time per part (prefill, draft, tree, "
                        f"forward, verify, commit, update) per method, mean over repeats; {title}.")
        if not (summary[summary.setting == setting].method != "vanilla").any():
            continue
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

    motivation = list(motivation) if motivation else find_motivation(results_dir)
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
        md += ["(Motivation figure skipped: no results/motivation/*.csv; run `python -m logitspec.motivation`.)", ""]
    if captions:
        md += ["## Figures", "", *captions, ""]
    (out / "table1.md").write_text("\n".join(md))
    written.insert(0, out / "table1.md")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results/runs", help="folder holding the run folders")
    parser.add_argument("--out", default="results/figures", help="where the tables and figures go")
    parser.add_argument("--published", default=None, help="Spec-Bench leaderboard CSV (default: shared/reference)")
    parser.add_argument("--motivation", nargs="*", default=None,
                        help="CSV(s) of logitspec.motivation (default: results/motivation/*.csv)")
    args = parser.parse_args(argv)
    written = build_all(args.results, args.out, args.published, args.motivation)
    print((Path(args.out) / "table1.md").read_text())
    print("Written:", ", ".join(str(p) for p in written))


if __name__ == "__main__":
    main()
