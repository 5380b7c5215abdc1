"""The run specification: every option of a run, checked and typed, and the decisions derived from them.

`evaluation.run.validation.validate(cfg)` builds it from the composed Hydra config; the single run, the
interleaved schedule and the Ray workers all read it, so what a run uses is decided here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from evaluation.catalog import MethodDisplay
from evaluation.run.config import BenchConfig, ModelConfig, PathsConfig, RunConfig


@dataclass(frozen=True)
class MethodSpec:
    """The method a run decodes with: its name, the class its config names, its typed options and display."""

    name: str
    cls: type
    options: Any  # an instance of `cls.Config`, checked
    display: MethodDisplay


@dataclass(frozen=True)
class RunSpec:
    config: Any  # the composed config as given (a DictConfig), saved beside the answers
    model: ModelConfig
    bench: BenchConfig
    run: RunConfig
    paths: PathsConfig
    method: MethodSpec

    @property
    def uses_budget(self) -> bool:
        """Whether the draft budget cuts this run's drafts. Vanilla drafts nothing, so a budget has nothing to cut:
        its runs stay the reference for both settings."""
        return self.method.name != "vanilla" and self.run.draft_budget != "off"

    @property
    def greedy(self) -> bool:
        return self.bench.temperature == 0

    def label(self) -> str:
        """The run's name in tables: the method, then every option and setting that differs from the defaults."""
        label = self.method.name + "".join(f",{k}={v}" for k, v in non_default_options(self.method.options).items())
        if not self.greedy:
            label += f",T={self.bench.temperature:g}" + "".join(
                f",{k}={getattr(self.bench, k)}" for k, off in (("top_p", 1), ("top_k", 0))
                if getattr(self.bench, k) != off)
        if self.uses_budget:
            label += f",draft_budget={self.run.draft_budget}" + (",replayed_curve" if self.run.latency_curve else "")
        return label


def non_default_options(options) -> dict:
    """Options that differ from the method's defaults: they label the run in the report."""
    defaults = type(options)()
    return {f.name: getattr(options, f.name) for f in fields(options)
            if getattr(options, f.name) != getattr(defaults, f.name)}
