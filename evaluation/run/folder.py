"""The run folder: one per run identity under `run.results_dir/<model>/<method>-<digest>/`.

`config.yaml` (the resolved config), `manifest.json` (identity, provenance, how the method shows) and
`answers.jsonl` (one whole line per question). The folder name is derived from everything that changes the answers
or their timing, so running the same command again resumes: questions already answered are skipped, and a line
cut off by a kill is dropped. One process at a time writes a folder (`one_writer`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import OmegaConf

from evaluation.engine.errors import HarnessError
from evaluation.run.answer import sampling_params

ANSWERS = "answers.jsonl"


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


class AnswerFile:
    """`answers.jsonl`, written one whole line at a time and flushed, so a kill loses at most one question."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> list[dict]:
        """The complete lines; a trailing partial line (the question in flight at a kill) is cut off the file."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        keep = data[: data.rfind(b"\n") + 1]
        if len(keep) != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(len(keep))
        return [json.loads(line) for line in keep.decode("utf-8").splitlines() if line.strip()]

    def append(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


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
    if spec.uses_budget:  # off: the identity it always had
        run["draft_budget"] = {"mode": spec.run.draft_budget, "latency_curve": spec.run.latency_curve}
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
        except OSError:
            raise HarnessError(f"{folder} is being written by another process; run the report once it is done, "
                               "or the same command again after it to resume") from None
        yield


@dataclass
class OpenRun:
    """A run folder held open for writing (its lock held): the questions still to answer and where they go."""

    folder: Path
    label: str
    todo: list
    answers: AnswerFile

    def append(self, record: dict) -> None:
        """Write one answer line, stamped now."""
        record["tstamp"] = time.time()
        self.answers.append(record)


def run_folder(spec, identity: dict) -> Path:
    return Path(spec.run.results_dir) / spec.model.name / f"{spec.method.name}-{digest(identity)}"


@contextlib.contextmanager
def open_run(spec, answerer, questions, question_sha: str, repeat: int, schedule: dict | None = None):
    """The folder of this run's identity, locked, with its manifest written and the questions it still lacks
    (none when it was finished earlier: then nothing is written, its provenance stays as it was). `answerer` is
    started here, for the questions still to answer, before the folder is created."""
    comparison, identity = run_identity(spec, answerer.model, question_sha, repeat, schedule)
    setting = {k: v for k, v in comparison.items() if k != "repeat"}
    label = spec.label()
    folder = run_folder(spec, identity)
    answers = AnswerFile(folder / ANSWERS)
    manifest_path = folder / "manifest.json"
    done = set()
    if folder.is_dir():
        with one_writer(folder):
            done = {record["question_id"] for record in answers.read()}
            if manifest_path.exists() and all(q.question_id in done for q in questions):
                yield OpenRun(folder, label, [], answers)
                return
    # Ray workers load the model here, no more of them than questions to answer; a failure leaves no folder behind.
    answerer.start(sum(q.question_id not in done for q in questions))
    folder.mkdir(parents=True, exist_ok=True)
    with one_writer(folder):
        done = {record["question_id"] for record in answers.read()}
        todo = [q for q in questions if q.question_id not in done]
        if not todo and manifest_path.exists():
            yield OpenRun(folder, label, [], answers)
            return
        OmegaConf.save(spec.config, folder / "config.yaml", resolve=True)
        now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
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
            "question_file": str(spec.bench.question_file),
            "seed": spec.run.seed,
            "sampling": comparison.get("sampling"),  # None: greedy
            "warmup": spec.bench.warmup,
            "environment": answerer.environment(),
            "draft_budget": {"mode": spec.run.draft_budget, "latency": answerer.latency_source}
            if spec.uses_budget else None,
            "started": now,
        }
        if answerer.workers is not None:  # Ray: who answered, on which device (each answer names its worker)
            manifest["workers"] = answerer.workers
        if done and manifest_path.exists():  # a resumed run keeps when it started and lists when it resumed
            earlier = json.loads(manifest_path.read_text())
            manifest["started"] = earlier.get("started", now)
            manifest["resumed"] = [*earlier.get("resumed", []), now]
        manifest_path.write_text(json.dumps(manifest, indent=1))
        if done:
            print(f"Resuming {folder}: {len(done)} answered, {len(todo)} to go", flush=True)
        yield OpenRun(folder, label, todo, answers)
