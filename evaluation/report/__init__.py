"""The report: speedup, mean accepted tokens, time breakdown and losslessness of each method against vanilla.

    python -m evaluation.report [--results results/runs [more folders]] [--out results]

Runs are compared only with a vanilla run of the same model, question file, selection, token budget, dtype,
device and repeat index (their `comparison_key`). Definitions:
- speedup: Spec-Bench's, the mean over questions of tokens/s divided by vanilla's mean tokens/s;
- token-ratio speedup (reported apart): total tokens / total time, divided by vanilla's;
- MAT (mean accepted tokens): committed tokens over decoding steps, bonus included (vanilla: exactly 1);
- tokens are counted from the generated ids, never by re-tokenizing text;
- the time breakdown: each part's share of the total wall time, and its mean milliseconds per step.
Questions that raised are listed, and left out of every statistic on both sides.

Losslessness: a greedy run's token ids must equal vanilla's; a sampled run (temperature > 0) cannot be compared
token for token, and its column names the statistical check instead (`evaluation.tools.exactness`, the tests'
goodness-of-fit of every method's output distribution against the enumerated target distribution).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from evaluation.catalog import method_display, remember_display
from evaluation.engine.timing import PARTS
from evaluation.files import replacing, write_text
from evaluation.questions import MT_BENCH_CATEGORIES, SUBTASK_TITLES

ORDER = list(SUBTASK_TITLES)
# What stands for losslessness in a sampled run's row (see the module docstring).
SAMPLED_CHECK = "χ² exactness test"

def method_sort_key(label: str, method: str | None = None) -> tuple:
    """Sort key of a method label such as `logitspec,next_next=False`, the same in every table and figure: the
    method's own `display.order` (vanilla first), then the plain method before its variants, then the label with
    its numbers compared as numbers (capacity=16 before capacity=128)."""
    base = method or label.split(",")[0]
    rank = method_display(base).order
    natural = tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", label)))
    return rank, base, label != base, natural


def load_runs(results_dir: str | Path | list[str | Path]) -> pd.DataFrame:
    """One row per answered question of every run under `results_dir` (the tidy table the figures use).

    Several folders (e.g. two sessions on one machine) are read as separate runs: each method is compared with
    the vanilla run of its own folder, never with another folder's (its `comparison_key` gets `@1`, `@2`, ...
    for the folder's place in the list)."""
    folders = [results_dir] if isinstance(results_dir, (str, Path)) else list(results_dir)
    if len(folders) > 1:
        tables = [_load_folder(folder).assign(source=str(folder)) for folder in folders]
        tables = [t.assign(comparison_key=t.comparison_key + f"@{i + 1}") if not t.empty else t  # folder 1, 2, ...
                  for i, t in enumerate(tables)]
        return pd.concat(tables, ignore_index=True)
    return _load_folder(folders[0]).assign(source=str(folders[0]))


def _load_folder(results_dir: str | Path) -> pd.DataFrame:
    rows = []
    for manifest_path in sorted(Path(results_dir).glob("**/manifest.json")):
        folder = manifest_path.parent
        manifest = json.loads(manifest_path.read_text())
        remember_display(manifest["method"], manifest.get("method_display"))
        answers = folder / "answers.jsonl"
        if not answers.exists():
            continue
        for line in answers.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut off by a kill; the next run of the same command removes it
            row = {
                "run_dir": str(folder),
                "model": manifest["model"],
                "method": manifest["method"],
                "method_label": manifest.get("method_label", manifest["method"]),
                "comparison_key": manifest["comparison_key"],
                "setting_key": manifest.get("setting_key", manifest["comparison_key"]),
                "repeat": manifest["comparison"].get("repeat", 0),
                "max_new_tokens": manifest["comparison"].get("max_new_tokens"),
                "temperature": (manifest["comparison"].get("sampling") or {}).get("temperature", 0.0),
                "interleaved": "schedule" in manifest["comparison"],  # evaluation.run.interleave: methods in turn
                "dtype": manifest["comparison"].get("dtype", ""),
                "prepacked": bool(manifest["comparison"].get("cpu_prepack")),
                "question_id": record["question_id"],
                "subtask": record.get("subtask") or _subtask(record.get("category", "")),
                "status": record.get("status", "ok"),
                "error": record.get("error"),
            }
            if row["status"] == "ok":
                choice = record["choices"][0]
                row.update(
                    new_tokens=sum(choice["new_tokens"]),
                    wall_time=sum(choice["wall_time"]),
                    steps=sum(choice["decoding_steps"]),
                    accept_lengths=choice["accept_lengths"],
                    token_ids=choice["token_ids"],
                    margins=choice.get("margins"),  # reduced-precision greedy runs: per turn, per token
                    # decode steps only (each turn's prefill step drafts nothing); absent in older runs
                    decode_steps=sum(choice["decoding_steps"]) - len(choice["decoding_steps"]),
                    proposed_nodes=sum(choice["proposed_nodes"]) if "proposed_nodes" in choice else np.nan,
                    verified_nodes=sum(choice["verified_nodes"]) if "verified_nodes" in choice else np.nan,
                )
                for part in PARTS:
                    row[f"t_{part}"] = sum(turn.get(part, 0.0) for turn in choice["time_breakdown"])
                for turn in choice.get("draft_detail", []):  # a method's split of its draft part (Gumiho)
                    for name, seconds in turn.items():
                        row[f"d_{name}"] = row.get(f"d_{name}", 0.0) + seconds
            rows.append(row)
    return pd.DataFrame(rows)


def provenance(run_dirs) -> str:
    """Where the runs `run_dirs` came from, as their manifests recorded it: the processor, torch threads, library
    versions and commit(s), one line (the report writes it under each comparison, so no table is copied by hand)."""
    seen: dict[str, set] = {"processor": set(), "threads": set(), "torch": set(), "transformers": set(),
                            "commit": set(), "schedule": set()}
    for run_dir in sorted(set(run_dirs)):
        try:
            manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        env = manifest.get("environment") or {}
        packages = env.get("packages") or {}
        seen["processor"].add(env.get("gpu") or env.get("cpu") or "unknown")
        seen["threads"].add(str(env.get("torch_threads", "?")))
        seen["torch"].add(str(packages.get("torch")))
        seen["transformers"].add(str(packages.get("transformers")))
        commit = str(env.get("git_commit") or "unknown")[:7]
        seen["commit"].add(commit + ("+uncommitted changes" if env.get("git_dirty") else ""))
        seen["schedule"].add("interleaved per question" if "schedule" in manifest.get("comparison", {})
                             else "one method after another")
    def words(key):
        return ", ".join(sorted(seen[key])) or "unknown"
    return (f"Machine: {words('processor')}, {words('threads')} torch threads; torch {words('torch')}, "
            f"transformers {words('transformers')}; commit {words('commit')}; {words('schedule')}.")


def _subtask(category: str) -> str:
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


def first_difference(ours: list[list[int]], reference: list[list[int]]) -> tuple[int, int] | None:
    """(turn, position) of the first token that differs, or None when the ids are equal."""
    for turn, (a, b) in enumerate(zip(ours, reference)):
        if a != b:
            position = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return turn, position
    if len(ours) != len(reference):
        return min(len(ours), len(reference)), 0
    return None


def lossless_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per method run and question: whether its token ids equal vanilla's, and where they first differ."""
    rows = []
    ok = df[(df.status == "ok") & (df.temperature == 0)]  # sampled runs: see SAMPLED_CHECK
    for key, group in ok.groupby("comparison_key"):
        vanilla = group[group.method == "vanilla"].set_index("question_id")
        for _, row in group[group.method != "vanilla"].iterrows():
            if row.question_id not in vanilla.index:
                continue
            reference = vanilla.loc[row.question_id]
            diff = first_difference(row.token_ids, reference.token_ids)
            rows.append({"comparison_key": key, "model": row.model, "method_label": row.method_label,
                         "question_id": row.question_id, "subtask": row.subtask, "equal": diff is None,
                         "first_diff_turn": None if diff is None else diff[0],
                         "first_diff_position": None if diff is None else diff[1],
                         # reduced precision: how near a tie each side's choice was where they first differ
                         "reduced_precision": isinstance(reference.get("margins"), list),
                         "vanilla_margin": margin_at(reference.get("margins"), diff),
                         "method_margin": margin_at(row.get("margins"), diff)})
    return pd.DataFrame(rows)


def margin_at(margins, diff: tuple[int, int] | None) -> float | None:
    """The recorded top-2 margin at (turn, position), when the run recorded margins and reached that token."""
    if diff is None or not isinstance(margins, list) or diff[0] >= len(margins) or diff[1] >= len(margins[diff[0]]):
        return None
    return margins[diff[0]][diff[1]]


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
    return pd.DataFrame(rows)


def _sampling(row) -> str:
    """The heading's note of a sampled setting ("" when greedy) and of methods run in turn per question."""
    note = f", temperature {row['temperature']:g}" if row.get("temperature", 0) > 0 else ""
    return note + (", interleaved per question" if row.get("interleaved", False) == True else "")  # noqa: E712


def _method_order(labels) -> list[str]:
    return sorted(labels, key=method_sort_key)


def to_markdown(summary: pd.DataFrame, lossless: pd.DataFrame, errors: pd.DataFrame,
                repeated: pd.DataFrame | None = None, tests: pd.DataFrame | None = None,
                unmatched: list[str] = ()) -> str:
    lines = ["# Speculative decoding report", ""]
    if unmatched:
        lines += ["Runs without a vanilla run of the same settings (not compared): " + ", ".join(unmatched), ""]
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
            lines += [provenance(group.run_dir), ""]
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
        lines += ["## Questions that raised (left out of every statistic)", ""]
        for _, e in errors.iterrows():
            lines.append(f"- {e.model} {e.method_label} question {e.question_id}: {e.error}")
        lines.append("")
    return "\n".join(lines)


def build(results_dir: str | Path | list[str | Path], out_dir: str | Path) -> tuple[pd.DataFrame, str]:
    df = load_runs(results_dir)
    if df.empty:
        return pd.DataFrame(), ""
    summary = summarize(df)
    lossless = lossless_table(df)
    errors = df[df.status != "ok"]
    repeated = across_repeats(summary) if not summary.empty else pd.DataFrame()
    tests = paired_tests(df)
    with_vanilla = set(df[df.method == "vanilla"].comparison_key)
    unmatched = sorted({f"{r.model} {r.method_label}" for r in df.itertuples() if r.comparison_key not in with_vanilla})
    markdown = to_markdown(summary, lossless, errors, repeated, tests, unmatched)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "report.md", markdown)
    for table, name, number_format in ((summary, "report.csv", "%.6g"), (lossless, "lossless.csv", None),
                                       (repeated, "report_repeats.csv", "%.6g"), (tests, "paired_tests.csv", "%.6g")):
        if name in ("report.csv", "lossless.csv") or not table.empty:
            with replacing(out / name) as tmp:
                table.to_csv(tmp, index=False, float_format=number_format)
    return summary, markdown


def missing_runs(results_dir: str | Path | list[str | Path]) -> str:
    """The one-line message for a results folder without saved runs, with the command that makes them."""
    folders = [results_dir] if isinstance(results_dir, (str, Path)) else list(results_dir)
    make = "make ablations" if "ablations" in Path(folders[0]).parts else "make bench"
    return f"no saved runs under {', '.join(map(str, folders))} (run `{make}` first)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", nargs="+", default=["results/runs"],
                        help="folder(s) holding the run folders; each folder's methods are compared with its vanilla")
    parser.add_argument("--out", default=None, help="where report.md/.csv go (default: the parent of --results)")
    parser.add_argument("--quiet-if-empty", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = args.out or str(Path(args.results[0]).parent)
    summary, markdown = build(args.results, out)
    if not markdown:  # nothing to report: what is there stays as it is
        if not args.quiet_if_empty:
            print(f"error: {missing_runs(args.results)}; {out}/report.md is left as it is", file=sys.stderr)
            sys.exit(2)
        return
    print(markdown)
    print(f"Written: {out}/report.md, report.csv, lossless.csv")


if __name__ == "__main__":
    main()
