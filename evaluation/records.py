"""The answer record: what one line of a run's `answers.jsonl` must hold, and a reader that checks every line.

`check_record(record)` returns None for a good record, or one line naming the first field that is wrong, e.g.
`choices[0].token_ids: expected a list of lists of ints`. It covers everything the report reads:

- `question_id`: an int or a non-empty str (not a bool), as in the question file;
- `status`: "ok" or "error" (absent: "ok", as the report has always read it);
- `error`: a str when the status is "error", absent or null otherwise;
- `choices`: for "ok", a non-empty list of choices (for "error" a list, usually empty, or absent). A choice has
  one entry per turn in `new_tokens` (ints >= 0), `wall_time` (seconds >= 0, more than 0 in all),
  `decoding_steps` (ints >= 0), `token_ids` (lists of ints, `new_tokens[i]` of them) and `time_breakdown`
  (objects of seconds >= 0 per part); `accept_lengths` is flat, one int >= 0 per decoding step
  (`sum(decoding_steps)` of them). Optional, because older runs lack them, and checked when present: `turns` (one
  str per turn), `proposed_nodes` and `verified_nodes` (flat lists of ints >= 0), `draft_detail` (one object of
  seconds per turn), `margins` (one list of numbers per turn), `stop_reason` (one str per turn), `prefill_time`
  (seconds per turn);
- optional: `subtask` (str or null), `category` (str), and `produced_by`: `{"git_commit": str, "git_dirty": bool,
  "torch_threads": int}`, the process that answered (older runs: the manifest's `environment` stands in).
Other fields are free.

`read_answers(path)` parses a file into `AnswerLines`: the good records with their line numbers, and an
`AnswerProblem` (path, line, message) for each malformed line or bad record. A last line without its newline is
no problem: it is what a kill in the middle of a write leaves (the run path cuts it off and answers the question
again); it is never a record either, and `cut_line` gives its number. `distinct_answers` keeps one record per
question. `read_manifest(path)` reads a run's manifest.json, or says in one line why it cannot. Standard library
only: the run path and the report both read answers and manifests through this module.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.engine.errors import HarnessError

STATUSES = ("ok", "error")
SECONDS_MAP = "an object of seconds >= 0 per part"


@dataclass(frozen=True)
class AnswerProblem:
    """One bad line of an answers file: `str()` gives `path:line: message`."""

    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class AnswerLines:
    """An answers file read and checked: `records` are (line number, record) pairs of good records in file order,
    `problems` the lines left out (malformed JSON, not UTF-8, a record `check_record` refuses). `cut_line` is the
    number of a last line without its newline (a write cut off by a kill; neither a record nor a problem), and
    `complete_bytes` the file's length up to its last newline (what the run path keeps of the file)."""

    path: Path
    records: list[tuple[int, dict]] = field(default_factory=list)
    problems: list[AnswerProblem] = field(default_factory=list)
    cut_line: int | None = None
    complete_bytes: int = 0

    def raise_for_problems(self) -> None:
        """Raise `HarnessError` with the first problem as its one line (and how many more there are)."""
        if self.problems:
            more = f" (and {len(self.problems) - 1} more bad lines)" if len(self.problems) > 1 else ""
            raise HarnessError(f"{self.problems[0]}{more}")


def read_answers(path: str | Path) -> AnswerLines:
    """Every line of the answers file `path`, checked (a missing file reads as one without lines). Blank lines are
    skipped; lines are numbered from 1 as an editor numbers them."""
    path = Path(path)
    lines = AnswerLines(path)
    if not path.exists():
        return lines
    data = path.read_bytes()
    lines.complete_bytes = data.rfind(b"\n") + 1
    chunks = data.split(b"\n")
    for number, chunk in enumerate(chunks, 1):
        if number == len(chunks):  # after the last newline: empty, or a line cut off by a kill
            if chunk.strip():
                lines.cut_line = number
            break
        if not chunk.strip():
            continue
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as exc:
            lines.problems.append(AnswerProblem(path, number, f"not UTF-8 text (byte {exc.start})"))
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            lines.problems.append(AnswerProblem(path, number, f"malformed JSON ({exc.msg} at column {exc.colno})"))
            continue
        problem = check_record(record)
        if problem is not None:
            lines.problems.append(AnswerProblem(path, number, problem))
            continue
        lines.records.append((number, record))
    return lines


def read_manifest(path: Path) -> tuple[dict, str | None]:
    """A run's manifest, or what is wrong with it (one line): unreadable, cut short, or missing what a run
    folder's manifest always has. The run path (on resume) and the report both read manifests through it."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return {}, f"cannot be read ({exc.__class__.__name__}: {exc})"
    except json.JSONDecodeError as exc:
        return {}, f"not valid JSON, cut short? ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if not isinstance(manifest, dict):
        return {}, "expected a JSON object"
    for key, kind in (("method", str), ("model", str), ("comparison_key", str), ("comparison", dict)):
        if not isinstance(manifest.get(key), kind):
            return {}, f"{key}: missing or not a {'str' if kind is str else 'JSON object'}"
    return manifest, None


def distinct_answers(lines: AnswerLines) -> tuple[list[tuple[int, dict]], list[AnswerProblem]]:
    """One record per question id, in file order, and a problem for each record left out: the first answer of a
    question is kept and a later one is a duplicate, except that a question recorded with `status: "error"` gives
    way to a later record of it (a question answered again after it raised)."""
    kept: dict[object, tuple[int, dict]] = {}
    problems = []
    for number, record in lines.records:
        key = _id_key(record["question_id"])
        earlier = kept.get(key)
        if earlier is None or earlier[1].get("status", "ok") == "error":  # new, or answered again after it raised
            kept[key] = (number, record)
            continue
        problems.append(AnswerProblem(lines.path, number, f"question_id: duplicate {record['question_id']!r} "
                                                          f"(first answered at line {earlier[0]}); left out"))
    return sorted(kept.values(), key=lambda pair: pair[0]), problems


def _id_key(question_id) -> tuple[str, object]:
    return type(question_id).__name__, question_id  # 1 and "1" are different questions


# ---- the schema ----------------------------------------------------------------------------------------------


def check_record(record) -> str | None:
    """None when `record` is a good answer record, else one line naming the first bad field and what it must be."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {_kind(record)}"
    if "question_id" not in record:
        return "question_id: missing"
    question_id = record["question_id"]
    if not _is_int(question_id) and not (isinstance(question_id, str) and question_id.strip()):
        return f"question_id: expected an int or a non-empty str, got {_kind(question_id)}"
    status = record.get("status", "ok")
    if status not in STATUSES:
        return f"status: expected \"ok\" or \"error\", got {status!r}"
    for name in ("subtask", "category"):
        if record.get(name) is not None and not isinstance(record[name], str):
            return f"{name}: expected a str, got {_kind(record[name])}"
    problem = _check_produced_by(record)
    if problem:
        return problem
    error = record.get("error")
    if status == "error":
        if not isinstance(error, str):
            return f"error: expected the error's message (a str) when status is \"error\", got {_kind(error)}"
        if "choices" in record and not isinstance(record["choices"], list):
            return f"choices: expected a list, got {_kind(record['choices'])}"
        return None
    if error is not None:
        return f"error: expected null when status is \"ok\", got {_kind(error)}"
    if "choices" not in record:
        return "choices: missing (a record with status \"ok\" has its answer there)"
    choices = record["choices"]
    if not isinstance(choices, list) or not choices:
        return f"choices: expected a non-empty list, got {_kind(choices)}"
    for index, choice in enumerate(choices):
        problem = _check_choice(choice, f"choices[{index}]")
        if problem:
            return problem
    return None


def _check_produced_by(record) -> str | None:
    if "produced_by" not in record:
        return None
    produced = record["produced_by"]
    if not isinstance(produced, dict):
        return f"produced_by: expected an object, got {_kind(produced)}"
    for key, ok, what in (("git_commit", lambda v: isinstance(v, str), "a str"),
                          ("git_dirty", lambda v: isinstance(v, bool), "a bool"),
                          ("torch_threads", _is_int, "an int")):
        if key not in produced:
            return f"produced_by.{key}: missing"
        if not ok(produced[key]):
            return f"produced_by.{key}: expected {what}, got {_kind(produced[key])}"
    return None


def _check_choice(choice, where: str) -> str | None:
    if not isinstance(choice, dict):
        return f"{where}: expected an object, got {_kind(choice)}"
    required = ("new_tokens", "wall_time", "decoding_steps", "accept_lengths", "token_ids", "time_breakdown")
    for name in required:
        if name not in choice:
            return f"{where}.{name}: missing"
    # How many turns: `turns` when it is there (the texts), else `new_tokens`.
    counted_by = "turns" if "turns" in choice else "new_tokens"
    if not isinstance(choice[counted_by], list) or not choice[counted_by]:
        return f"{where}.{counted_by}: expected a non-empty list (one entry per turn), got {_kind(choice[counted_by])}"
    turns = len(choice[counted_by])
    per_turn = [
        ("turns", _is_str, "a list of strs", False),
        ("new_tokens", _is_count, "a list of ints >= 0", True),
        ("wall_time", _is_seconds, "a list of seconds >= 0", True),
        ("decoding_steps", _is_count, "a list of ints >= 0", True),
        ("token_ids", _is_id_list, "a list of lists of ints", True),
        ("time_breakdown", _is_seconds_map, f"a list of {SECONDS_MAP}", True),
        ("prefill_time", _is_seconds, "a list of seconds >= 0", False),
        ("stop_reason", _is_str, "a list of strs", False),
        ("draft_detail", _is_seconds_map, f"a list of {SECONDS_MAP}", False),
        ("margins", _is_number_list, "a list of lists of numbers", False),
    ]
    for name, ok, what, required_here in per_turn:
        if name not in choice and not required_here:
            continue
        values = choice[name]
        if not isinstance(values, list) or not all(ok(v) for v in values):
            return f"{where}.{name}: expected {what}"
        if len(values) != turns:
            return f"{where}.{name}: expected {turns} entries (one per turn), got {len(values)}"
    for name in ("accept_lengths", "proposed_nodes", "verified_nodes"):
        if name in choice and (not isinstance(choice[name], list) or not all(_is_count(v) for v in choice[name])):
            return f"{where}.{name}: expected a flat list of ints >= 0"
    for turn, (count, ids) in enumerate(zip(choice["new_tokens"], choice["token_ids"])):
        if count != len(ids):
            return f"{where}.new_tokens[{turn}]: {count}, but token_ids[{turn}] holds {len(ids)} ids"
    if len(choice["accept_lengths"]) != sum(choice["decoding_steps"]):
        return (f"{where}.accept_lengths: expected one entry per decoding step ({sum(choice['decoding_steps'])}), "
                f"got {len(choice['accept_lengths'])}")
    if sum(choice["wall_time"]) <= 0:
        return f"{where}.wall_time: no time at all (a question's turns take more than 0 seconds)"
    return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_count(value) -> bool:
    return _is_int(value) and value >= 0


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _is_seconds(value) -> bool:
    return _is_number(value) and value >= 0


def _is_str(value) -> bool:
    return isinstance(value, str)


def _is_id_list(value) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _is_number_list(value) -> bool:
    return isinstance(value, list) and all(_is_number(v) for v in value)


def _is_seconds_map(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _is_seconds(v) for k, v in value.items())


def _kind(value) -> str:
    """A value's JSON type, for messages ("null", "a bool", "a str", ...)."""
    if value is None:
        return "null"
    if isinstance(value, (list, dict, str)) and not value:
        return {list: "an empty list", dict: "an empty object", str: "an empty str"}[type(value)]
    names = {bool: "a bool", int: "an int", float: "a number", str: "a str", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)
