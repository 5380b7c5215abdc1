"""The run folder: one per run identity under `run.results_dir/<model>/<method>-<digest>/`.

`config.yaml` (the resolved config), `manifest.json` (identity, provenance, how the method shows) and
`answers.jsonl` (one whole line per question). The folder name is derived from everything that changes the answers
or their timing, so running the same command again resumes: questions already answered are skipped, and a line
cut off by a kill is dropped. One process at a time writes a folder (`one_writer`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import OmegaConf

from evaluation.engine.errors import HarnessError
from evaluation.files import replacing, write_text
from evaluation.provenance import commit
from evaluation.files import file_sha256
from evaluation.run.answer import sampling_params
from evaluation.records import read_answers, read_manifest

ANSWERS = "answers.jsonl"


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def content_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, or of a folder's files (each one's path inside it and its bytes, in sorted
    order; hidden files such as locks left out)."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    total = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path)
        if any(part.startswith(".") for part in relative.parts):
            continue
        total.update(f"{relative.as_posix()}\0{file_sha256(file)}\n".encode())
    return total.hexdigest()


def unwritable(path: Path, exc: OSError) -> HarnessError:
    """A write that failed (a full disk, a quota, a read-only mount) as one line; what is on disk is whole."""
    why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc.strerror or type(exc).__name__
    return HarnessError(f"cannot write {path}: {why}; the answers written so far are kept, and the same command "
                        "resumes once it can write")


class AnswerFile:
    """`answers.jsonl`, written one whole line at a time and flushed, so a kill loses at most one question."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> list[dict]:
        """The answer records, each line checked (`evaluation.records`); a trailing partial line (the question
        in flight at a kill) is cut off the file. Any other bad line stops the run in one line naming it: a
        resume never builds on a file it cannot read whole."""
        lines = read_answers(self.path)
        if lines.cut_line is not None:
            with open(self.path, "r+b") as f:
                f.truncate(lines.complete_bytes)
        if lines.problems:
            more = f" (and {len(lines.problems) - 1} more bad lines)" if len(lines.problems) > 1 else ""
            raise HarnessError(f"{lines.problems[0]}{more}; fix or remove that line, then run the same command "
                               "again to resume")
        return [record for _, record in lines.records]

    def append(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # a part of the line may be on disk: the next read cuts it off
            raise unwritable(self.path, exc) from None

    def keep_only(self, records: list[dict]) -> None:
        """Replace the file by `records` (written whole, then renamed over it)."""
        try:
            with replacing(self.path) as tmp:
                tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        except OSError as exc:
            raise unwritable(self.path, exc) from None


def run_identity(spec, model, question_sha: str, repeat: int, schedule: dict | None = None) -> tuple[dict, dict]:
    """What makes two runs comparable (`comparison`) and what makes a run itself (`comparison` + method).
    `model`: whatever has the loaded model's `source`, `dtype` and `device`. `schedule`: the runs answered in turn
    with this one, question by question (`evaluation.run.interleave`); such runs compare only among themselves."""
    comparison = {
        "model": spec.model.name,
        "model_source": model.source,
        "dtype": str(model.dtype).replace("torch.", ""),
        "device": model.device.type,
        "question_sha256": question_sha,
        "subtasks": list(spec.bench.subtasks) if spec.bench.subtasks else None,
        "questions_per_subtask": spec.bench.questions_per_subtask,
        "max_new_tokens": spec.bench.max_new_tokens,
        "repeat": repeat,
    }
    params = sampling_params(spec.bench)
    if not params.greedy:  # greedy runs keep the identity they always had
        comparison["sampling"] = {**asdict(params), "seed": spec.run.seed}
    device_map = spec.model.device_map
    if device_map is not None:  # a model split over GPUs times differently; unsplit runs keep their identity
        comparison["device_map"] = OmegaConf.to_container(device_map) if OmegaConf.is_config(device_map) else device_map
    if getattr(model, "prepacked", False):  # other kernels time differently; plain runs keep their identity
        comparison["cpu_prepack"] = True
    if schedule is not None:
        comparison["schedule"] = schedule
    run = {**comparison, "method": spec.method.name, "options": asdict(spec.method.options)}
    # The contents of what the method reads beside the model (a draft, a datastore): a draft retrained in place is a
    # new run. Methods that read nothing keep the identity they always had.
    inputs = {name: content_sha256(path) for name, path in
              spec.method.cls.input_files(spec.method.options, spec.model.name).items() if Path(path).exists()}
    if inputs:
        run["inputs_sha256"] = inputs
    # A released checkpoint the method takes for this target when its option is null (conf/checkpoints.yaml): by id,
    # so a run with a committed draft and one with a released checkpoint are never the same run.
    option = getattr(spec.method.cls, "checkpoint_option", None)
    if option and getattr(spec.method.options, option, None) is None:
        source = spec.method.cls.trained_source(spec.method.options, spec.model.name)
        if source is not None and not Path(source).is_dir():
            run["checkpoint"] = source
    if spec.uses_budget:  # off: the identity it always had
        run["draft_budget"] = {"mode": spec.run.draft_budget, "latency_curve": spec.run.latency_curve}
        if spec.run.latency_curve:  # a replayed curve by its contents as well, so a curve fixed in place is a new run
            run["draft_budget"]["latency_curve_sha256"] = file_sha256(Path(spec.run.latency_curve).expanduser())
    return comparison, run


@contextlib.contextmanager
def one_writer(folder: Path):
    """Hold the run folder's lock while writing it: a second process on the same run (the same cell twice in a
    sweep, two sweeps at once) stops with one line instead of interleaving answers. The lock goes with the process,
    so a killed run leaves none behind; `flock` also holds across the nodes of a shared NFS file system."""
    try:
        import fcntl
    except ImportError:  # no flock on this system: one writer is then the user's care
        yield
        return
    with open(folder / ".writer.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # the lock is held
            raise HarnessError(f"{folder} is being written by another process; run the report once it is done, "
                               "or the same command again after it to resume") from None
        except OSError as exc:  # e.g. ENOLCK: a file system without locks
            raise HarnessError(f"cannot lock {folder / '.writer.lock'}: {exc.strerror or exc} (does this file "
                               "system support flock? run.results_dir on a local disk avoids it)") from None
        yield


@dataclass
class OpenRun:
    """A run folder held open for writing (its lock held): the questions still to answer and where they go."""

    folder: Path
    label: str
    todo: list
    answers: AnswerFile
    produced_by: dict | None = None  # the commit and torch threads this process answers with

    def append(self, record: dict) -> None:
        """Write one answer line, stamped now and with what produced it."""
        record["tstamp"] = time.time()
        if self.produced_by is not None:
            record["produced_by"] = self.produced_by
        self.answers.append(record)


def finished_line(folder: Path) -> str:
    """The run's last line: its folder, and how many questions failed (recorded with status "error"; the same
    command asks them again), so a failure is seen without the report."""
    records = [record for _, record in read_answers(folder / ANSWERS).records]
    failed = [r for r in records if r.get("status", "ok") != "ok"]
    if not failed:
        return f"Answers: {folder}"
    first = str(failed[0].get("error") or "")[:160]
    return (f"Answers: {folder} ({len(failed)} of {len(records)} questions failed, status \"error\" in {ANSWERS}; "
            f"the first: {first}; the same command asks them again)")


def run_folder(spec, identity: dict) -> Path:
    return Path(spec.run.results_dir) / spec.model.name / f"{spec.method.name}-{digest(identity)}"


def answered(records: list[dict]) -> set:
    """The question ids a run has answered; a question recorded as an error is not, and is asked again."""
    return {record["question_id"] for record in records if record.get("status", "ok") == "ok"}


def earlier_manifest(path: Path) -> dict:
    manifest, problem = read_manifest(path)
    if problem:
        raise HarnessError(f"{path} is not a whole JSON manifest ({problem}); remove it to have the same command "
                           "write it afresh from this run's config (its answers are kept)")
    return manifest


@contextlib.contextmanager
def open_run(spec, answerer, questions, question_sha: str, repeat: int, schedule: dict | None = None):
    """The folder of this run's identity, locked, with its manifest written and the questions it still lacks
    (none when it was finished earlier: then nothing is written, its provenance stays as it was). `answerer` is
    started here, for the questions still to answer, before the folder is created. Questions recorded as errors
    are asked again (their lines are dropped first). Each answer line records the commit and torch threads of the
    process that wrote it, and the manifest lists every process that wrote the run."""
    comparison, identity = run_identity(spec, answerer.model, question_sha, repeat, schedule)
    setting = {k: v for k, v in comparison.items() if k != "repeat"}
    label = spec.label()
    folder = run_folder(spec, identity)
    answers = AnswerFile(folder / ANSWERS)
    manifest_path = folder / "manifest.json"
    done = set()
    if folder.is_dir():
        with one_writer(folder):
            done = answered(answers.read())
            if manifest_path.exists() and all(q.question_id in done for q in questions):
                yield OpenRun(folder, label, [], answers)
                return
    # Ray workers load the model here, no more of them than questions to answer; a failure leaves no folder behind.
    answerer.start(sum(q.question_id not in done for q in questions))
    folder.mkdir(parents=True, exist_ok=True)
    with one_writer(folder):
        records = answers.read()
        done = answered(records)
        todo = [q for q in questions if q.question_id not in done]
        if not todo and manifest_path.exists():
            yield OpenRun(folder, label, [], answers)
            return
        failed = [r for r in records if r.get("status", "ok") != "ok"]
        earlier = earlier_manifest(manifest_path) if manifest_path.exists() else None
        now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        environment = answerer.environment()
        process = {**commit(), "host": socket.gethostname(), "pid": os.getpid(), "started": now,
                   "torch_threads": environment.get("torch_threads")}
        display = asdict(spec.method.display)
        del display["name"]
        manifest = {
            "method": spec.method.name,
            "method_label": label,
            "method_display": display,  # how the report shows it, whatever the checkout that reads it knows
            "model": spec.model.name,
            "comparison_key": digest(comparison),
            "setting_key": digest(setting),
            "comparison": comparison,
            "options": asdict(spec.method.options),
            "inputs_sha256": identity.get("inputs_sha256"),
            "question_file": str(spec.bench.question_file),
            "seed": spec.run.seed,
            "sampling": comparison.get("sampling"),  # None: greedy
            "warmup": spec.bench.warmup,
            # the first process's machine; `processes` lists every process that wrote answers
            "environment": environment,
            "processes": [process],
            "draft_budget": {"mode": spec.run.draft_budget, "latency": answerer.latency_source}
            if spec.uses_budget else None,
            "started": now,
        }
        if answerer.workers is not None:  # Ray: who answered, on which device (each answer names its worker)
            manifest["workers"] = answerer.workers
        if earlier is not None and records:  # a resumed run keeps its first provenance and adds this process
            manifest["started"] = earlier.get("started", now)
            manifest["environment"] = earlier.get("environment", environment)
            manifest["processes"] = [*earlier.get("processes", []), process]
            manifest["resumed"] = [*earlier.get("resumed", []), now]
        try:
            if failed:  # asked again below: their lines go first, so a question has one line
                answers.keep_only([r for r in records if r.get("status", "ok") == "ok"])
            with replacing(folder / "config.yaml") as tmp:
                OmegaConf.save(spec.config, tmp, resolve=True)
            write_text(manifest_path, json.dumps(manifest, indent=1))
        except OSError as exc:
            raise unwritable(folder, exc) from None
        if records:
            retried = f" ({len(failed)} that failed asked again)" if failed else ""
            print(f"Resuming {folder}: {len(done)} answered, {len(todo)} to go{retried}", flush=True)
        produced_by = {key: process[key] for key in ("git_commit", "git_dirty", "torch_threads")}
        yield OpenRun(folder, label, todo, answers, produced_by)
