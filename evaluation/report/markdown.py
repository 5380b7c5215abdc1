"""report.md and the report's tables, written as one set (`build`): the statistics of `stats` per comparison, the
losslessness and provenance of `load`, the data checks, and the questions still failing, listed per run at the end.

Outputs: report.md, report.csv, lossless.csv, report_repeats.csv and paired_tests.csv are one set, replaced
together or not at all (`evaluation.files.replacing_together`). Every file of the set is written each time: a
table with nothing in it (no greedy method run to check for losslessness, a single repeat's paired tests) is
written with its header row only, so no file is ever left over from an earlier report. With no method that has a
vanilla run to compare with, nothing is written.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evaluation.catalog import method_display
from evaluation.engine.errors import HarnessError
from evaluation.engine.timing import PARTS
from evaluation.files import replacing_together
from evaluation.questions import SUBTASK_TITLES
from evaluation.report.load import (SAMPLED_CHECK, _method_order, _sampling, lossless_table, method_sort_key,
                                    missing_runs, provenance, read_runs, warn, without_vanilla)
from evaluation.report.stats import ORDER, across_repeats, paired_tests, summarize

# The report's outputs, one set (see the module docstring).
OUTPUTS = ("report.md", "report.csv", "lossless.csv", "report_repeats.csv", "paired_tests.csv")


class NoRuns(HarnessError):
    """No saved run to report on."""


class NothingToCompare(HarnessError):
    """Saved runs, but no method with a vanilla run of its settings: nothing to compare (nothing is written)."""


def to_markdown(summary: pd.DataFrame, lossless: pd.DataFrame, errors: pd.DataFrame,
                repeated: pd.DataFrame | None = None, tests: pd.DataFrame | None = None,
                unmatched: list[str] = (), answers: pd.DataFrame | None = None, notes: list[str] = ()) -> str:
    """report.md. `answers`: `load_runs`' rows (each answer's commit and threads for the provenance lines);
    `notes`: the data checks' summary lines (`read_runs`)."""
    lines = ["# Speculative decoding report", ""]
    if unmatched:
        lines += ["Runs without a vanilla run of the same settings (not compared): " + "; ".join(unmatched), ""]
    if notes:
        lines += ["## Data checks", "", "What the report left out of the saved runs, or could not check (its "
                  "warnings name the file and line of each answer left out):", ""]
        lines += [f"- {note}" for note in notes] + [""]
    if summary.empty:
        return "\n".join(lines + ["No method has a vanilla run to compare with yet."]) + "\n"
    if repeated is not None and not repeated.empty and repeated.repeats.max() > 1:
        lines += ["## Across repeats: mean ± standard deviation [95% confidence interval half-width]", ""]
        for setting, group in repeated.groupby("setting_key", sort=False):
            first = group.iloc[0]
            subtasks = [s for s in ORDER if s in set(group.subtask)]
            methods = _method_order(group.method_label.unique())
            cell = group.assign(text=[f"{m:.2f} ± {sd:.2f} [{ci:.2f}]" for m, sd, ci
                                      in zip(group.speedup, group.speedup_std, group.speedup_ci95)])
            table = cell.pivot(index="method_label", columns="subtask", values="text")
            table = table.reindex(index=methods, columns=subtasks).rename(columns=SUBTASK_TITLES)
            # vanilla's count can exceed every method's when several folders each bring their own vanilla runs
            methods_only = group[group.method_label != "vanilla"]
            repeats = int((methods_only if not methods_only.empty else group).repeats.max())
            lines += [f"**Speedup, {first['model']}, max_new_tokens={first['max_new_tokens']}{_sampling(first)}, "
                      f"{repeats} repeats (setting {setting})**", "", table.to_markdown(), ""]
            if tests is not None and not tests.empty:
                mine = tests[tests.setting_key == setting]
                if not mine.empty:
                    lines += ["**Paired tests against vanilla over questions (tokens/s, mean over repeats)**", "",
                              mine.drop(columns=["setting_key", "model"]).to_markdown(index=False, floatfmt=".3g"),
                              ""]
    in_order = summary.sort_values(["model", "setting_key", "repeat"], kind="stable")
    for key, group in in_order.groupby("comparison_key", sort=False):
        first = group.iloc[0]
        precision = f", {first['dtype']}" if first.get("dtype") else ""
        precision += ", prepacked" if first.get("prepacked") else ""
        lines += [f"## {first['model']}{precision}, max_new_tokens={first['max_new_tokens']}{_sampling(first)}, "
                  f"repeat {first['repeat'] + 1} (comparison {key})", ""]
        if "run_dir" in group:
            lines += [provenance(group.run_dir, answers), ""]
        subtasks = [s for s in ORDER if s in set(group.subtask)]
        methods = _method_order(group.method_label.unique())
        for metric, title in (("speedup", "Speedup over vanilla (mean tokens/s ratio, Spec-Bench)"),
                              ("mat", "Mean accepted tokens per step"),
                              ("token_ratio_speedup", "Speedup as total tokens / total time")):
            table = group.pivot(index="method_label", columns="subtask", values=metric)
            table = table.reindex(index=methods, columns=subtasks).rename(columns=SUBTASK_TITLES)
            lines += [f"**{title}**", "", table.to_markdown(floatfmt=".2f"), ""]
        overall = group[group.subtask == "overall"].set_index("method_label").reindex(methods)
        detail = pd.DataFrame({
            "questions": overall.questions.astype(int),
            "tokens/s": overall.tokens_per_s,
            "MAT": overall.mat,
            "proposed nodes/step": overall.proposed_per_step,
            "verified nodes/step": overall.verified_per_step,
            **{f"{part} %": 100 * overall[f"frac_{part}"] for part in PARTS},
            "forward ms/step": overall.ms_per_step_forward,
            "draft+budget+tree ms/step": (overall.ms_per_step_draft + overall.ms_per_step_budget
                                          + overall.ms_per_step_tree),
        })
        for column in sorted(c for c in overall.columns if c.startswith("ms_per_step_draft_")):
            if overall[column].notna().any():  # the methods that split their draft part (e.g. Gumiho)
                detail[f"draft: {column[len('ms_per_step_draft_'):]} ms/step"] = overall[column]
        if first["temperature"] > 0:
            detail["lossless"] = [SAMPLED_CHECK if m != "vanilla" and not m.startswith("vanilla,") else "ref"
                                  for m in methods]
        elif not lossless.empty:
            here = lossless[lossless.comparison_key == key]
            mine = here.groupby("method_label").equal
            # In reduced precision equality is a match rate, not a proof: a near-tie may flip (margins below)
            column = "matches vanilla (reduced precision)" if here.reduced_precision.any() else "lossless"
            detail[column] = [f"{int(mine.sum()[m])}/{int(mine.count()[m])}" if m in mine.groups else "ref"
                              for m in methods]
        lines += ["**Overall detail: throughput, MAT, draft nodes per decode step (proposed by the method, verified "
                  "after the draft budget), share of wall time per part, losslessness**", "",
                  detail.to_markdown(floatfmt=".1f"), ""]
        per_subtask = group[group.subtask != "overall"].assign(
            order=lambda d: d.method_label.map(methods.index) * 10 + d.subtask.map(ORDER.index))
        per_subtask = per_subtask.sort_values("order")
        breakdown = pd.DataFrame({
            "method": per_subtask.method_label, "subtask": per_subtask.subtask.map(SUBTASK_TITLES),
            **{f"{part} %": 100 * per_subtask[f"frac_{part}"] for part in PARTS},
            **{f"{part} ms/step": per_subtask[f"ms_per_step_{part}"] for part in PARTS if part != "prefill"},
        })
        lines += ["**Time breakdown per subtask: share of wall time, and milliseconds per decoding step**", "",
                  breakdown.to_markdown(index=False, floatfmt=".1f"), ""]
        if not lossless.empty:
            diffs = lossless[(lossless.comparison_key == key) & ~lossless.equal]
            for _, d in diffs.iterrows():
                margins = ("" if pd.isna(d.vanilla_margin) else
                           f" (top-2 margin there: vanilla {d.vanilla_margin:.3f}, this method "
                           + ("-" if pd.isna(d.method_margin) else f"{d.method_margin:.3f}") + ")")
                lines.append(f"- {d.method_label}: question {d.question_id} first differs from vanilla at turn "
                             f"{int(d.first_diff_turn) + 1}, token {int(d.first_diff_position)}{margins}")
            if not diffs.empty:
                lines.append("")
    names = sorted(set(summary.method), key=lambda name: method_sort_key(name))
    shown = [method_display(name) for name in names]
    lines += ["## Methods", "", pd.DataFrame({"method": names, "title": [d.title for d in shown],
                                               "family": [d.family for d in shown]}).to_markdown(index=False), ""]
    if not errors.empty:
        lines += ["## Questions still failing (status error; left out of every statistic, on both sides)", ""]
        for run_dir, failing in errors.groupby("run_dir", sort=False):
            first = failing.iloc[0]
            ids = ", ".join(str(q) for q in failing.question_id)
            lines.append(f"- {first.model} {first.method_label}, repeat {int(first['repeat']) + 1} (`{run_dir}`): "
                         f"{len(failing)} question{'s' if len(failing) > 1 else ''} ({ids})")
            lines += [f"  - {first.model} {first.method_label} question {e.question_id}: {e.error}"
                      for e in failing.itertuples()]
        lines.append("")
    return "\n".join(lines)


def build(results_dir: str | Path | list[str | Path], out_dir: str | Path) -> tuple[pd.DataFrame, str]:
    """Write the report's outputs into `out_dir`, all of them or none (see the module docstring); returns the
    summary table and report.md's text. Raises `NoRuns` or `NothingToCompare`, having written nothing."""
    out = Path(out_dir)
    left = f"{out / 'report.md'} and its tables are left as they are"
    loaded = read_runs(results_dir)
    df = loaded.table
    if df.empty:
        if loaded.manifests:
            folders = [results_dir] if isinstance(results_dir, (str, Path)) else list(results_dir)
            raise NoRuns(f"no readable answer in the {loaded.manifests} runs under {', '.join(map(str, folders))} "
                         f"(see the warnings above); {left}")
        raise NoRuns(f"{missing_runs(results_dir)}; {out / 'report.md'} is left as it is")
    summary = summarize(df)
    unmatched = without_vanilla(df)
    if summary.empty:
        raise NothingToCompare(f"nothing to compare: {'; '.join(unmatched)} (answer the same questions with "
                               f"method=vanilla and the same settings); {left}")
    for line in unmatched:
        warn(f"not compared: {line}")
    lossless = lossless_table(df)
    errors = df[df.status != "ok"]
    repeated = across_repeats(summary)
    tests = paired_tests(df)
    markdown = to_markdown(summary, lossless, errors, repeated, tests, unmatched, answers=df, notes=loaded.notes)
    tables = {"report.csv": (summary, "%.6g"), "lossless.csv": (lossless, None),
              "report_repeats.csv": (repeated, "%.6g"), "paired_tests.csv": (tests, "%.6g")}
    out.mkdir(parents=True, exist_ok=True)
    with replacing_together([out / name for name in OUTPUTS]) as temps:
        for name, tmp in zip(OUTPUTS, temps):
            if name == "report.md":
                tmp.write_text(markdown, encoding="utf-8")
            else:
                table, number_format = tables[name]
                table.to_csv(tmp, index=False, float_format=number_format)
    return summary, markdown
