"""Question sets in Spec-Bench's JSONL format, and the six Spec-Bench subtasks."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from evaluation.engine.errors import HarnessError

# MT-bench's eight categories form Spec-Bench's "multi-turn conversation" subtask.
MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
SUBTASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
SUBTASK_TITLES = {
    "mt_bench": "Multi-turn Conversation",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "Question Answering",
    "math_reasoning": "Mathematical Reasoning",
    "rag": "RAG",
    "overall": "Overall",
}


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]

    @property
    def subtask(self) -> str:
        return "mt_bench" if self.category in MT_BENCH_CATEGORIES else self.category


def load_questions(path: str | Path) -> list[Question]:
    """Read and check a question file (UTF-8 JSON lines); a bad line is reported with its file and line number."""
    path = Path(path)
    if not path.is_file():
        hint = " (run `make data` first)" if path.name == "question.jsonl" else ""
        raise HarnessError(f"question file not found: {path}{hint}")
    questions, seen = [], set()
    for number, line in enumerate(io.StringIO(read_utf8(path), newline=None), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HarnessError(f"{where}: malformed JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise HarnessError(f"{where}: expected a JSON object")
        turns = record.get("turns")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise HarnessError(f"{where}: question has no 'turns' (a non-empty list of strings)")
        if "question_id" not in record:
            raise HarnessError(f"{where}: question has no 'question_id'")
        qid = record["question_id"]
        # Ids key the answers, resumes and the report's pairing of methods: an integer or a name, nothing else.
        if not (isinstance(qid, int) and not isinstance(qid, bool) or isinstance(qid, str) and qid.strip()):
            raise HarnessError(f"{where}: question_id must be an integer or a non-empty string, not {json_kind(qid)}")
        if qid in seen:
            raise HarnessError(f"{where}: duplicate question_id {qid!r}")
        seen.add(qid)
        category = record.get("category", "default")
        if not isinstance(category, str):  # it names the subtask the report groups by ("" in Gumiho's Alpaca set)
            raise HarnessError(f"{where}: category must be a string when present, not {json_kind(category)}")
        questions.append(Question(qid, category, tuple(turns)))
    if not questions:
        raise HarnessError(f"{path}: no questions")
    return questions


def read_utf8(path: Path) -> str:
    """The file's text (a leading byte-order mark dropped); a byte that is not UTF-8 is named with its line and
    its byte offset in that line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise HarnessError(f"cannot read the question file {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = data[:exc.start].decode("utf-8-sig")  # valid up to the bad byte
        number = len(list(io.StringIO(before + "?", newline=None)))  # lines counted as `load_questions` reads them
        start = data.rfind(b"\n", 0, exc.start) + 1
        start = max(start, data.rfind(b"\r", 0, exc.start) + 1)
        raise HarnessError(f"{path}:{number}: not UTF-8 text (byte 0x{data[exc.start]:02x} at byte offset "
                           f"{exc.start - start} of the line)") from None


def json_kind(value) -> str:
    """How a refused JSON value reads in an error message: `null`, `true`, a list, ..., with the value when short."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    kind = {list: "a list", dict: "an object", float: "a number", str: "a blank string", int: "an integer"}.get(
        type(value), type(value).__name__)
    shown = json.dumps(value, ensure_ascii=False)
    return f"{kind} ({shown})" if len(shown) <= 40 else kind


def select_questions(questions: list[Question], subtasks: list[str] | None, per_subtask: int | None) -> list[Question]:
    """Keep the chosen subtasks (all when None) and the first `per_subtask` questions of each, in file order."""
    present = list(dict.fromkeys(q.subtask for q in questions))
    if subtasks:
        unknown = [s for s in subtasks if s not in present]
        if unknown:
            raise HarnessError(f"unknown subtask(s) {', '.join(unknown)}; this file has: {', '.join(present)}")
    wanted = set(subtasks or present)
    taken: dict[str, int] = {}
    selected = []
    for q in questions:
        if q.subtask in wanted and (per_subtask is None or taken.get(q.subtask, 0) < per_subtask):
            taken[q.subtask] = taken.get(q.subtask, 0) + 1
            selected.append(q)
    return selected
