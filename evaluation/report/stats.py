"""The report's statistics, from the tidy table of `load.load_runs`: per comparison, method run and subtask, and
across repeats. Definitions:
- speedup: Spec-Bench's, the mean over questions of tokens/s divided by vanilla's mean tokens/s;
- token-ratio speedup (reported apart): total tokens / total time, divided by vanilla's;
- MAT (mean accepted tokens): committed tokens over decoding steps, bonus included (vanilla: exactly 1);
- the time breakdown: each part's share of the total wall time, and its mean milliseconds per step;
- across repeats: mean, standard deviation and 95% confidence interval; paired tests against vanilla over questions.
Questions that raised are left out of every statistic on both sides.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from evaluation.engine.timing import PARTS
from evaluation.questions import SUBTASK_TITLES
from evaluation.report.load import _method_order

ORDER = list(SUBTASK_TITLES)
PAIRED_COLUMNS = ["setting_key", "model", "method_label", "questions", "mean_speedup_per_question",
                  "faster_questions", "wilcoxon_p", "paired_t_p"]


def _stats(rows: pd.DataFrame, base: pd.DataFrame) -> dict:
    tps = rows.new_tokens / rows.wall_time
    base_tps = base.new_tokens / base.wall_time
    wall = rows.wall_time.sum()
    stats = {
        "questions": len(rows),
        "tokens_per_s": tps.mean(),
        "speedup": tps.mean() / base_tps.mean(),
        "token_ratio_speedup": (rows.new_tokens.sum() / wall) / (base.new_tokens.sum() / base.wall_time.sum()),
        "mat": rows.new_tokens.sum() / rows.steps.sum(),
        "steps": int(rows.steps.sum()),
        # draft nodes per decode step: what the method proposed, and what was verified after the draft budget
        "proposed_per_step": rows.proposed_nodes.sum(min_count=1) / rows.decode_steps.sum(),
        "verified_per_step": rows.verified_nodes.sum(min_count=1) / rows.decode_steps.sum(),
    }
    for column in (c for c in rows.columns if c.startswith("d_")):
        stats[f"ms_per_step_draft_{column[2:]}"] = 1000 * rows[column].sum(min_count=1) / rows.steps.sum()
    for part in PARTS:
        stats[f"frac_{part}"] = rows[f"t_{part}"].sum() / wall
        stats[f"ms_per_step_{part}"] = 1000 * rows[f"t_{part}"].sum() / rows.steps.sum()
    return stats


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (comparison, method run, subtask), `overall` included."""
    rows = []
    ok = df[df.status == "ok"]
    for key, group in ok.groupby("comparison_key"):
        vanilla = group[group.method == "vanilla"]
        if vanilla.empty:
            continue
        for label, runs in group.groupby("method_label", sort=False):
            common = sorted(set(runs.question_id) & set(vanilla.question_id), key=str)
            mine = runs[runs.question_id.isin(common)]
            base = vanilla[vanilla.question_id.isin(common)]
            for subtask in ORDER:
                sel = mine if subtask == "overall" else mine[mine.subtask == subtask]
                ref = base if subtask == "overall" else base[base.subtask == subtask]
                if sel.empty:
                    continue
                rows.append({"comparison_key": key, "setting_key": runs.setting_key.iloc[0],
                             "model": runs.model.iloc[0], "method": runs.method.iloc[0],
                             "method_label": label, "subtask": subtask, "max_new_tokens": runs.max_new_tokens.iloc[0],
                             "temperature": runs.temperature.iloc[0],
                             "interleaved": bool(runs.get("interleaved", pd.Series([False])).iloc[0]),
                             "dtype": runs.get("dtype", pd.Series([""])).iloc[0],
                             "prepacked": bool(runs.get("prepacked", pd.Series([False])).iloc[0]),
                             "repeat": runs.repeat.iloc[0], "run_dir": runs.run_dir.iloc[0], **_stats(sel, ref)})
    return pd.DataFrame(rows)


def across_repeats(summary: pd.DataFrame) -> pd.DataFrame:
    """Mean, sample standard deviation and 95% confidence interval (Student t) of speedup and MAT over repeats."""
    rows = []
    for (setting, label, subtask), group in summary.groupby(["setting_key", "method_label", "subtask"], sort=False):
        row = {"setting_key": setting, "model": group.model.iloc[0], "method_label": label, "subtask": subtask,
               "max_new_tokens": group.max_new_tokens.iloc[0], "temperature": group.temperature.iloc[0],
               "interleaved": bool(group.get("interleaved", pd.Series([False])).iloc[0]), "repeats": len(group)}
        for metric in ("speedup", "mat", "tokens_per_s"):
            values = group[metric]
            half = (stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
                    if len(values) > 1 else np.nan)
            row.update({metric: values.mean(), f"{metric}_std": values.std(ddof=1) if len(values) > 1 else np.nan,
                        f"{metric}_ci95": half})
        rows.append(row)
    return pd.DataFrame(rows)


def paired_tests(df: pd.DataFrame) -> pd.DataFrame:
    """Per setting, each method against vanilla over the same questions: tokens/s averaged over repeats per
    question, then the Wilcoxon signed-rank test and the paired t-test on log tokens/s."""
    rows = []
    ok = df[df.status == "ok"].assign(tps=lambda d: d.new_tokens / d.wall_time)
    for (setting, _), group in ok.groupby(["setting_key", "source"], sort=False):  # each folder with its vanilla
        per_question = group.groupby(["method_label", "question_id"]).tps.mean().unstack(0)
        if "vanilla" not in per_question:
            continue
        for label in _method_order(per_question.columns.drop("vanilla")):
            pair = per_question[["vanilla", label]].dropna()
            if len(pair) < 2:
                continue
            diff = np.log(pair[label]) - np.log(pair["vanilla"])
            rows.append({"setting_key": setting, "model": group.model.iloc[0], "method_label": label,
                         "questions": len(pair), "mean_speedup_per_question": float(np.exp(diff.mean())),
                         "faster_questions": int((diff > 0).sum()),
                         "wilcoxon_p": float(stats.wilcoxon(diff).pvalue) if diff.abs().sum() > 0 else 1.0,
                         "paired_t_p": float(stats.ttest_rel(np.log(pair[label]), np.log(pair["vanilla"])).pvalue)})
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)
