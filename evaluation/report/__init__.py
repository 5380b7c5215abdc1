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

What the report reads is checked, never trusted (each problem is one `warning:` line on stderr, naming the file and
line; the per-run counts also go into report.md under "Data checks"):
- every answer line against the answer record's schema (`evaluation.records`): a malformed line or a bad
  record is left out; a last line without its newline (a run killed mid-write, or still writing) is left out too;
- one answer per question and run: a later answer of a question is a duplicate and left out (except after an
  answer with status "error": a question answered again after it raised counts with its new answer);
- only the questions the run's selection asked for: the manifest's question file, when it is there and its sha256
  is the one the run recorded, gives the selected ids, and answers of other ids are left out (when the file is
  missing or changed, every answered id is kept, and a warning says so);
- a manifest that cannot be read (cut short, not JSON, missing fields) leaves its run out;
- a run answered at more than one commit (or both with and without uncommitted changes), from each answer's
  `produced_by` (older answers: the manifest's `environment`), is flagged, and its comparison's provenance line
  names every commit.
Questions still failing (status "error") are listed per run at the end of report.md.

Outputs: report.md, report.csv, lossless.csv, report_repeats.csv and paired_tests.csv are one set, replaced
together or not at all (`evaluation.files.replacing_together`). Every file of the set is written each time: a
table with nothing in it (no greedy method run to check for losslessness, a single repeat's paired tests) is
written with its header row only, so no file is ever left over from an earlier report. With no method that has a
vanilla run to compare with, nothing is written: one line names the missing vanilla run(s), exit status 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from evaluation.catalog import method_display, remember_display
from evaluation.engine.errors import HarnessError
from evaluation.engine.timing import PARTS
from evaluation.files import replacing_together
from evaluation.questions import MT_BENCH_CATEGORIES, SUBTASK_TITLES, file_sha256, load_questions, select_questions
from evaluation.records import distinct_answers, read_answers, read_manifest

ORDER = list(SUBTASK_TITLES)
# What stands for losslessness in a sampled run's row (see the module docstring).
SAMPLED_CHECK = "χ² exactness test"
REPOSITORY = Path(__file__).resolve().parents[2]
# The report's outputs, one set (see the module docstring).
OUTPUTS = ("report.md", "report.csv", "lossless.csv", "report_repeats.csv", "paired_tests.csv")
LOSSLESS_COLUMNS = ["comparison_key", "model", "method_label", "question_id", "subtask", "equal", "first_diff_turn",
                    "first_diff_position", "reduced_precision", "vanilla_margin", "method_margin"]
PAIRED_COLUMNS = ["setting_key", "model", "method_label", "questions", "mean_speedup_per_question",
                  "faster_questions", "wilcoxon_p", "paired_t_p"]


class NoRuns(HarnessError):
    """No saved run to report on."""


class NothingToCompare(HarnessError):
    """Saved runs, but no method with a vanilla run of its settings: nothing to compare (nothing is written)."""


def method_sort_key(label: str, method: str | None = None) -> tuple:
    """Sort key of a method label such as `logitspec,next_next=False`, the same in every table and figure: the
    method's own `display.order` (vanilla first), then the plain method before its variants, then the label with
    its numbers compared as numbers (capacity=16 before capacity=128)."""
    base = method or label.split(",")[0]
    rank = method_display(base).order
    natural = tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", label)))
    return rank, base, label != base, natural


@dataclass
class Loaded:
    """What `read_runs` found: the tidy table (`load_runs`), the runs' manifests, and the data checks' summary
    lines (`notes`, also in report.md; the per-line detail goes to stderr only)."""

    table: pd.DataFrame
    manifests: int = 0
    notes: list[str] = field(default_factory=list)


def load_runs(results_dir: str | Path | list[str | Path]) -> pd.DataFrame:
    """One row per answered question of every run under `results_dir` (the tidy table the figures use).

    Several folders (e.g. two sessions on one machine) are read as separate runs: each method is compared with
    the vanilla run of its own folder, never with another folder's (its `comparison_key` gets `@1`, `@2`, ...
    for the folder's place in the list). What is left out, and why, is said on stderr (see the module docstring)."""
    return read_runs(results_dir).table


def read_runs(results_dir: str | Path | list[str | Path]) -> Loaded:
    """`load_runs`, with the manifests counted and the data checks' summary lines kept."""
    folders = [results_dir] if isinstance(results_dir, (str, Path)) else list(results_dir)
    loaded = [_load_folder(folder) for folder in folders]
    tables = [one.table.assign(source=str(folder)) for one, folder in zip(loaded, folders)]
    if len(folders) > 1:
        tables = [t.assign(comparison_key=t.comparison_key + f"@{i + 1}") if not t.empty else t  # folder 1, 2, ...
                  for i, t in enumerate(tables)]
    return Loaded(pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0],
                  sum(one.manifests for one in loaded), [note for one in loaded for note in one.notes])


def warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def _load_folder(results_dir: str | Path) -> Loaded:
    rows = []
    loaded = Loaded(pd.DataFrame())
    selections = _Selections()

    def note(line: str) -> None:
        warn(line)
        loaded.notes.append(line)

    for manifest_path in sorted(Path(results_dir).glob("**/manifest.json")):
        folder = manifest_path.parent
        loaded.manifests += 1
        manifest, problem = read_manifest(manifest_path)
        if problem:
            note(f"{manifest_path}: {problem}; run left out")
            continue
        remember_display(manifest["method"], manifest.get("method_display"))
        answers = folder / "answers.jsonl"
        if not answers.exists():
            continue
        try:
            lines = read_answers(answers)
        except OSError as exc:
            note(f"{answers}: cannot be read ({exc}); run left out")
            continue
        kept, duplicates = distinct_answers(lines)
        wanted = selections.wanted(manifest, folder)
        foreign = [(n, r) for n, r in kept if wanted is not None and r["question_id"] not in wanted]
        for problem in lines.problems:
            warn(f"{problem}; left out")
        for problem in duplicates:
            warn(str(problem))
        for number, record in foreign:
            warn(f"{answers}:{number}: question_id {record['question_id']!r} is not one of the questions this "
                 f"run's selection asks for; left out")
        left_out = {"bad": len(lines.problems), "duplicate": len(duplicates), "outside the selection": len(foreign)}
        if any(left_out.values()):
            total = len(lines.records) + len(lines.problems)
            note(f"{folder}: {sum(left_out.values())} of {total} answer lines left out ("
                 + ", ".join(f"{count} {why}" for why, count in left_out.items() if count) + ")")
        if lines.cut_line is not None:
            warn(f"{answers}:{lines.cut_line}: last line has no newline (a run killed while writing it, or still "
                 "writing); left out")
        records = [(n, r) for n, r in kept if wanted is None or r["question_id"] in wanted]
        if wanted is not None:
            missing = len(wanted) - len({r["question_id"] for _, r in records})
            if missing:
                note(f"{folder}: {missing} of the {len(wanted)} selected questions not answered (yet)")
        env = manifest.get("environment") if isinstance(manifest.get("environment"), dict) else {}
        commits = run_commits(manifest, [r for _, r in records])
        if len(commits) > 1:
            note(f"{folder}: answered at more than one commit ({', '.join(commits)}): its answers mix code versions")
        comparison = manifest["comparison"]
        run = {
            "run_dir": str(folder),
            "model": manifest["model"],
            "method": manifest["method"],
            "method_label": manifest.get("method_label", manifest["method"]),
            "comparison_key": manifest["comparison_key"],
            "setting_key": manifest.get("setting_key", manifest["comparison_key"]),
            "repeat": comparison.get("repeat", 0),
            "max_new_tokens": comparison.get("max_new_tokens"),
            "temperature": (comparison.get("sampling") or {}).get("temperature", 0.0),
            "interleaved": "schedule" in comparison,  # evaluation.run.interleave: methods in turn
            "dtype": comparison.get("dtype", ""),
            "device": comparison.get("device", ""),
            "prepacked": bool(comparison.get("cpu_prepack")),
            "run_commits": commits,
        }
        for _, record in records:
            produced = record.get("produced_by") or {}
            row = {
                **run,
                "question_id": record["question_id"],
                "subtask": record.get("subtask") or _subtask(record.get("category", "")),
                "status": record.get("status", "ok"),
                "error": record.get("error"),
                # who answered it: the answer's own process, else (older runs) the manifest's
                "commit": commit_label(produced if produced else env),
                "torch_threads": produced.get("torch_threads", env.get("torch_threads")),
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
    for line in selections.unchecked():
        note(line)
    loaded.table = pd.DataFrame(rows)
    return loaded


def commit_label(env: dict) -> str:
    """`abc1234`, or `abc1234+uncommitted changes`, from a manifest's environment or an answer's `produced_by`."""
    return str(env.get("git_commit") or "unknown")[:7] + ("+uncommitted changes" if env.get("git_dirty") else "")


def run_commits(manifest: dict, records: list[dict]) -> tuple[str, ...]:
    """Every commit (with its dirty flag) a run's answers were produced at: each answer's `produced_by`; for
    answers without one (older runs), the manifest's `processes` when it lists them (any of them may have written
    such an answer), else its `environment`."""
    env = manifest.get("environment") if isinstance(manifest.get("environment"), dict) else {}
    commits = {commit_label(r["produced_by"]) for r in records if r.get("produced_by")}
    if any(not r.get("produced_by") for r in records):
        listed = manifest.get("processes")
        processes = [p for p in listed if isinstance(p, dict)] if isinstance(listed, list) else []
        commits |= {commit_label(p) for p in processes} if processes else {commit_label(env)}
    return tuple(sorted(commits))


class _Selections:
    """The question ids each run's selection asks for, from its question file when that is the file it ran on."""

    def __init__(self):
        self._files: dict[Path, tuple[str, list] | str] = {}  # path: (sha256, questions) or why it cannot be read
        self._unchecked: dict[str, list[str]] = {}  # why: the runs whose selection could not be checked

    def wanted(self, manifest: dict, folder: Path) -> set | None:
        """The selected ids, or None (every answered id kept) when the question file cannot tell."""
        comparison = manifest["comparison"]
        name, sha = manifest.get("question_file"), comparison.get("question_sha256")
        why = None
        if not name:
            why = "the manifest names no question file"
        elif not sha:
            why = "the manifest has no question_sha256"
        else:
            found = self._read(Path(name))
            if isinstance(found, str):
                why = found
            elif found[0] != sha:
                why = f"question file {name} has changed since the run (another sha256)"
            else:
                try:
                    chosen = select_questions(found[1], comparison.get("subtasks"),
                                              comparison.get("questions_per_subtask"))
                except (HarnessError, TypeError, ValueError) as exc:  # a selection this file cannot give
                    why = f"question file {name}: {exc}"
                else:
                    return {q.question_id for q in chosen}
        self._unchecked.setdefault(why, []).append(str(folder))
        return None

    def _read(self, path: Path) -> tuple[str, list] | str:
        candidates = [path] if path.is_absolute() else [path, REPOSITORY / path]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            return f"question file {path} not found"
        if found not in self._files:
            try:
                self._files[found] = (file_sha256(found), load_questions(found))
            except (OSError, HarnessError) as exc:
                self._files[found] = f"question file {path} cannot be read ({exc})"
        return self._files[found]

    def unchecked(self) -> list[str]:
        """One line per reason: the runs kept with every answered question because their selection is unknown."""
        lines = []
        for why, folders in self._unchecked.items():
            shown = ", ".join(folders[:3]) + (f" and {len(folders) - 3} more" if len(folders) > 3 else "")
            lines.append(f"{why}: every answered question kept, the selection unchecked, in {len(folders)} "
                         f"run{'s' if len(folders) > 1 else ''} ({shown})")
        return lines


def provenance(run_dirs, answers: pd.DataFrame | None = None) -> str:
    """Where the runs `run_dirs` came from, as their manifests recorded it: the processor, torch threads, library
    versions and commit(s), one line (the report writes it under each comparison, so no table is copied by hand).
    With `answers` (`load_runs`' rows), the commits and torch threads are each answer's own (`produced_by`), and a
    run answered at more than one commit is named."""
    seen: dict[str, set] = {"processor": set(), "threads": set(), "torch": set(), "transformers": set(),
                            "commit": set(), "schedule": set()}
    mixed = []
    rows = pd.DataFrame()
    if answers is not None and not answers.empty and "run_commits" in answers:
        rows = answers[answers.run_dir.isin(set(map(str, run_dirs)))]
    for run_dir in sorted(set(map(str, run_dirs))):
        try:
            manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        env = manifest.get("environment") or {}
        packages = env.get("packages") or {}
        seen["processor"].add(env.get("gpu") or env.get("cpu") or "unknown")
        seen["torch"].add(str(packages.get("torch")))
        seen["transformers"].add(str(packages.get("transformers")))
        seen["schedule"].add("interleaved per question" if "schedule" in manifest.get("comparison", {})
                             else "one method after another")
        mine = rows[rows.run_dir == run_dir] if not rows.empty else rows
        if mine.empty:
            seen["threads"].add(str(env.get("torch_threads", "?")))
            seen["commit"].add(commit_label(env))
            continue
        seen["threads"] |= {_threads(t) for t in mine.torch_threads}
        commits = mine.run_commits.iloc[0]
        seen["commit"] |= set(commits)
        if len(commits) > 1:
            mixed.append(f"the {mine.method_label.iloc[0]} run mixes commits ({', '.join(commits)})")
    def words(key):
        return ", ".join(sorted(seen[key])) or "unknown"
    line = (f"Machine: {words('processor')}, {words('threads')} torch threads; torch {words('torch')}, "
            f"transformers {words('transformers')}; commit {words('commit')}; {words('schedule')}.")
    if mixed:
        line += " Warning: " + "; ".join(mixed) + "."
    return line


def _threads(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "?"
    return str(int(value)) if isinstance(value, (int, float, np.integer, np.floating)) else str(value)


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
    return pd.DataFrame(rows, columns=LOSSLESS_COLUMNS)


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
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)


def _sampling(row) -> str:
    """The heading's note of a sampled setting ("" when greedy) and of methods run in turn per question."""
    note = f", temperature {row['temperature']:g}" if row.get("temperature", 0) > 0 else ""
    return note + (", interleaved per question" if row.get("interleaved", False) == True else "")  # noqa: E712


def _method_order(labels) -> list[str]:
    return sorted(labels, key=method_sort_key)


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


def without_vanilla(df: pd.DataFrame) -> list[str]:
    """One phrase per comparison that has no vanilla run with an answered question: its model, dtype, device,
    token budget, sampling, repeat and keys, and the method runs left without a reference."""
    ok = df[df.status == "ok"]
    with_vanilla = set(ok[ok.method == "vanilla"].comparison_key)
    phrases = []
    for key, group in df.groupby("comparison_key", sort=False):
        if key in with_vanilla:
            continue
        first = group.iloc[0]
        labels = _method_order(set(group[group.method != "vanilla"].method_label))
        what = ("a vanilla run without an answered question" if (group.method == "vanilla").any()
                else "no vanilla run")
        setting = (f"{first.model} {first.get('dtype') or 'dtype?'} on {first.get('device') or 'device?'}, "
                   f"max_new_tokens={first.max_new_tokens}{_sampling(first)}, repeat {int(first['repeat']) + 1} "
                   f"(comparison {key}, setting {first.setting_key})")
        phrases.append(f"{what} for {setting}" + (f", to compare {', '.join(labels)} with" if labels else ""))
    return phrases


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
    # After a run (run.py): no runs is no news, nothing to compare yet one line, neither an error.
    parser.add_argument("--quiet-if-empty", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = args.out or str(Path(args.results[0]).parent)
    try:
        summary, markdown = build(args.results, out)
    except HarnessError as exc:  # nothing was written: what is there stays as it is
        if args.quiet_if_empty and isinstance(exc, NoRuns):
            return
        if args.quiet_if_empty and isinstance(exc, NothingToCompare):
            print(f"Report not written: {exc}", flush=True)
            return
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # the outputs could not be written: none was replaced
        print(f"error: cannot write the report into {out}: {exc}; what was there is left as it is", file=sys.stderr)
        sys.exit(2)
    print(markdown)
    print(f"Written: {out}/" + ", ".join(OUTPUTS))


if __name__ == "__main__":
    main()
