"""Table 1 (speedup per subtask, overall MAT and speedup, mean ± sd over repeats), the published Spec-Bench
leaderboard rows of the same methods in Table 1's layout, and our overall numbers beside the leaderboard's for the
same target (ratios ours/published).

The published numbers are read from `results/published/` only (its README names their sources and commits)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.catalog import available_methods, method_display, model_name
from evaluation.report.figures.common import ROOT, summarize_settings
from evaluation.questions import SUBTASK_TITLES, SUBTASKS
from evaluation.report.load import method_sort_key

PUBLISHED_DIR = ROOT / "results" / "published"
PUBLISHED_CSV = "specbench_leaderboard.csv"
GUMIHO_PAPER = "gumiho_paper.csv"
PUBLISHED_TABLES = {"specbench_leaderboard_3090": "RTX 3090", "specbench_leaderboard_A100": "A100"}
PUBLISHED_MODEL = "Vicuna-7B-v1.3"
# Our target names (conf/model's `name`) -> the leaderboard's; the only place the two namings meet. Other targets
# have no leaderboard rows.
LEADERBOARD_MODELS = {"vicuna-7b-v1.3": "Vicuna-7B-v1.3", "vicuna-13b-v1.3": "Vicuna-13B-v1.3",
                      "vicuna-33b-v1.3": "Vicuna-33B-v1.3"}

TABLE1_SPEEDUP_COLUMNS = [SUBTASK_TITLES[s] for s in SUBTASKS]
TABLE1_COLUMNS = [*TABLE1_SPEEDUP_COLUMNS, "Overall MAT", "Overall Speedup"]


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
    """The Spec-Bench leaderboard rows kept in the repository (results/published/), or None if they have gone."""
    path = PUBLISHED_DIR / PUBLISHED_CSV
    return path if path.is_file() else None


def default_gumiho_paper_csv() -> Path | None:
    """The Gumiho paper's rows kept in the repository (results/published/), or None if they have gone."""
    path = PUBLISHED_DIR / GUMIHO_PAPER
    return path if path.is_file() else None


def leaderboard_model(model: str) -> str | None:
    """The leaderboard's name of our target `model` (a conf/model name or short name: vicuna-7b and vicuna-7b-v1.3
    give Vicuna-7B-v1.3); None for a target the leaderboard does not have."""
    return LEADERBOARD_MODELS.get(model_name(str(model)))


def load_published(path: str | Path) -> pd.DataFrame:
    """The reference CSV without `secondary_` tables and without empty values (long format)."""
    ref = pd.read_csv(path, dtype={"value": "string"}, keep_default_na=False)
    ref = ref[~ref["table"].str.startswith("secondary_") & (ref["value"].str.strip() != "")].copy()
    ref["value"] = pd.to_numeric(ref["value"], errors="coerce")
    return ref[ref["value"].notna()].reset_index(drop=True)


def published_table(published: pd.DataFrame, methods=None, model: str = PUBLISHED_MODEL) -> pd.DataFrame:
    """Spec-Bench leaderboard numbers (current RTX 3090 and A100 tables) for our methods, Table 1's layout.

    `methods`: our method names (default every registered method); vanilla's row is always included. A method's
    leaderboard names are its class's `published_names`; methods the leaderboard lacks (LogitSpec) are absent.
    Rows are `model`'s; a method published only for another model (EAGLE-3: Vicuna-13B) brings that model's
    rows too, every one of our methods among them, so it is read beside its neighbours there.
    """
    methods = available_methods() if methods is None else sorted({"vanilla", *methods}, key=method_sort_key)
    names: dict[str, str] = {}  # published name -> the first of our methods (in table order) read beside it
    for m in methods:
        for name in method_display(m).published_names:
            names.setdefault(name, m)
    ref = published[published["table"].isin(PUBLISHED_TABLES) & published["method"].isin(names)]
    at_model = set(ref[ref["model"] == model].method.map(names))
    models = [model, *sorted({row.model for row in ref.itertuples()
                              if row.model != model and names[row.method] not in at_model})]
    ref = ref[ref["model"].isin(models)]
    rows = []
    for (row_model, table_id, method), group in ref.groupby(["model", "table", "method"], sort=True):
        row = {"source_table": table_id, "device": PUBLISHED_TABLES[table_id], "model": row_model,
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
    table["_model"] = [models.index(m) for m in table.model]
    table = table.sort_values(["_model", "_device", "_order"], kind="stable")
    return table.drop(columns=["_order", "_device", "_model"]).reset_index(drop=True)


COMPARISON_COLUMNS = ["setting", "setting_title", "model", "published_model", "method", "method_label", "repeats",
                      "questions", "Overall Speedup", "Overall MAT", "published_method", "device", "source_table",
                      "published Overall Speedup", "published Overall MAT", "Speedup ratio", "MAT ratio"]
COMPARISON_TABLES = ("specbench_leaderboard_A100", "specbench_leaderboard_3090")  # the first that has the method


def published_comparison(table: pd.DataFrame, published: pd.DataFrame, model: str) -> pd.DataFrame:
    """Our Table 1 rows of target `model` beside the leaderboard's for the same target: overall speedup and MAT,
    ours and published, and the ratios ours / published.

    `table`: `table1()`'s output; `published`: `load_published()`'s; `model`: a target as our runs name it
    (vicuna-7b-v1.3, or its short name). One row per row of ours (setting, method label); the published row is the
    method's first `published_names` entry on the leaderboard for that target, from the A100 table where it has one
    (it covers the three Vicuna sizes, the RTX 3090 table Vicuna-7B only), else from the RTX 3090 table (`device`
    and `source_table` say which). A method the
    leaderboard lacks (LogitSpec) keeps empty published columns. A target without leaderboard rows (every one but
    Vicuna v1.3) gives an empty table.
    """
    target = leaderboard_model(model)
    if target is None or table.empty:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    ours = table[[model_name(str(m)) == model_name(str(model)) for m in table.model]]
    ref = published[published["table"].isin(PUBLISHED_TABLES) & (published["model"] == target)
                    & (published["subtask"] == "Overall")]
    rows = []
    for _, r in ours.iterrows():
        row = {column: r[column] for column in ("setting", "setting_title", "model", "method", "method_label",
                                                "repeats", "questions", "Overall Speedup", "Overall MAT")}
        row["published_model"] = target
        candidates = [(name, table_id) for name in method_display(r["method"]).published_names
                      for table_id in COMPARISON_TABLES]
        found = next(((name, table_id) for name, table_id in candidates
                      if ((ref["method"] == name) & (ref["table"] == table_id)).any()), None)
        if found is not None:
            name, table_id = found
            sel = ref[(ref["method"] == name) & (ref["table"] == table_id)].set_index("metric").value
            row.update({"published_method": name, "device": PUBLISHED_TABLES[table_id], "source_table": table_id,
                        "published Overall Speedup": sel.get("speedup", np.nan),
                        "published Overall MAT": sel.get("mean_accepted_tokens", np.nan)})
        rows.append(row)
    result = pd.DataFrame(rows, columns=COMPARISON_COLUMNS)
    for column in ("published Overall Speedup", "published Overall MAT", "Overall Speedup", "Overall MAT"):
        result[column] = pd.to_numeric(result[column], errors="coerce")
    result["Speedup ratio"] = result["Overall Speedup"] / result["published Overall Speedup"]
    result["MAT ratio"] = result["Overall MAT"] / result["published Overall MAT"]
    return result.reset_index(drop=True)
