"""The saved runs, read and checked into one tidy table: loading, selection, provenance and losslessness.

Runs are compared only with a vanilla run of the same model, question file, selection, token budget, dtype,
device and repeat index (their `comparison_key`); tokens are counted from the generated ids, never by
re-tokenizing text.

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

Losslessness: a greedy run's token ids must equal vanilla's; a sampled run (temperature > 0) cannot be compared
token for token, and its column names the statistical check instead (`evaluation.tools.exactness`, the tests'
goodness-of-fit of every method's output distribution against the enumerated target distribution).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.catalog import method_display, remember_display
from evaluation.engine.errors import HarnessError
from evaluation.engine.timing import PARTS
from evaluation.files import file_sha256
from evaluation.questions import MT_BENCH_CATEGORIES, load_questions, select_questions
from evaluation.records import distinct_answers, read_answers, read_manifest

# What stands for losslessness in a sampled run's row (see the module docstring).
SAMPLED_CHECK = "χ² exactness test"
REPOSITORY = Path(__file__).resolve().parents[2]
LOSSLESS_COLUMNS = ["comparison_key", "model", "method_label", "question_id", "subtask", "equal", "first_diff_turn",
                    "first_diff_position", "reduced_precision", "vanilla_margin", "method_margin"]


def method_sort_key(label: str, method: str | None = None) -> tuple:
    """Sort key of a method label such as `logitspec,next_next=False`, the same in every table and figure: the
    method's own `display.order` (vanilla first), then the plain method before its variants, then the label with
    its numbers compared as numbers (capacity=16 before capacity=128)."""
    base = method or label.split(",")[0]
    rank = method_display(base).order
    natural = tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", label)))
    return rank, base, label != base, natural


def _method_order(labels) -> list[str]:
    return sorted(labels, key=method_sort_key)


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


def _sampling(row) -> str:
    """The heading's note of a sampled setting ("" when greedy) and of methods run in turn per question."""
    note = f", temperature {row['temperature']:g}" if row.get("temperature", 0) > 0 else ""
    return note + (", interleaved per question" if row.get("interleaved", False) == True else "")  # noqa: E712


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
