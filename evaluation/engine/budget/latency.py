"""The target's forward time t(k) for k new tokens: measured by a short calibration and cached, or replayed from a
file, and kept honest online from the forward times the loop measures anyway."""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from evaluation.engine.device import processor_name
from evaluation.engine.errors import HarnessError
from evaluation.engine.kv_cache import cache_argument, cache_for
from evaluation.engine.options import MAX_DRAFT_NODES
from evaluation.engine.tree import DraftTree, build_tree_inputs

CALIBRATION_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
MAX_WIDTH = MAX_DRAFT_NODES + 1  # the widest forward: a whole tree and its pending token
MIN_MS, MAX_MS = 1e-4, 1e7  # a forward's plausible time: from a tenth of a microsecond to under three hours



def forward_latency(lm, context: list[int], widths, repeats: int, warmups: int = 2) -> pd.DataFrame:
    """Median forward time of k new tokens (a chain) over `context`, for each k in `widths`."""
    rows = []
    cache = cache_for(lm.model, len(context) + max(widths) + 1)
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        prefill = build_tree_inputs(context[0], DraftTree.chain(context[1:]), 0, lm.dtype, lm.device)
        lm.model(input_ids=prefill.input_ids, position_ids=prefill.position_ids,
                 attention_mask=prefill.attention_mask, **cache_argument(lm.model, cache), use_cache=True)
        base = cache.length
        for k in widths:
            chain = [context[i % len(context)] for i in range(k - 1)]
            inputs = build_tree_inputs(context[-1], DraftTree.chain(chain), base, lm.dtype, lm.device)
            times = []
            for i in range(repeats + warmups):
                cache.crop(base)
                sync()
                t0 = time.perf_counter()
                lm.model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                         attention_mask=inputs.attention_mask, **cache_argument(lm.model, cache),
                         use_cache=True)
                sync()
                if i >= warmups:
                    times.append(time.perf_counter() - t0)
            rows.append({"new_tokens": k, "context": base, "median_ms": 1000 * statistics.median(times),
                         "min_ms": 1000 * min(times)})
    table = pd.DataFrame(rows)
    table["vs_one_token"] = table.median_ms / table.median_ms.iloc[0]
    table["best_case_speedup"] = table.new_tokens / table.vs_one_token
    return table


@dataclass
class LatencyCurve:
    """t(k): seconds of one target forward over k new tokens, interpolated linearly between measured k."""

    new_tokens: np.ndarray  # increasing, starting at 1
    seconds: np.ndarray
    source: str = ""  # where it came from: "calibrated <file>" or "replayed <file>"
    online: bool = True  # correct it from observed forward times (not for a curve replayed from elsewhere)
    speed: float = 1.0  # how much slower the whole machine runs now than when the curve was measured (online)

    def __post_init__(self):
        self.new_tokens = np.asarray(self.new_tokens, dtype=float)
        self.seconds = np.asarray(self.seconds, dtype=float)  # as measured: a width can cost less than a narrower one
        self._log_k = np.log2(self.new_tokens)

    def __call__(self, k) -> np.ndarray:
        """Forward seconds for k new tokens (k may be an array); beyond the last point the last slope goes on."""
        k = np.asarray(k, dtype=float)
        t = np.interp(k, self.new_tokens, self.seconds)
        if len(self.new_tokens) > 1:
            slope = (self.seconds[-1] - self.seconds[-2]) / (self.new_tokens[-1] - self.new_tokens[-2])
            t = np.where(k > self.new_tokens[-1], self.seconds[-1] + slope * (k - self.new_tokens[-1]), t)
        return t * self.speed

    def observe(self, k: int, seconds: float, weight: float = 0.05) -> None:
        """Move the curve toward what this forward of k new tokens took: first the whole curve (a machine that
        slows down, a shared VM, a CPU that heats up, slows every width alike, and a method verifies only some
        widths, so the rest, k = 1 included, would otherwise keep the speed of the calibration), then the measured
        point nearest to k (in log k) by what is left, the curve's own error at this width."""
        if not self.online or seconds <= 0:
            return
        def step_toward() -> float:  # one outlier moves the curve little
            return (1 - weight) + weight * min(max(seconds / float(self(k)), 0.25), 4.0)

        self.speed *= step_toward()
        self.seconds[int(np.argmin(np.abs(self._log_k - np.log2(k))))] *= step_toward()  # measured after the speed

    @classmethod
    def from_table(cls, table: pd.DataFrame, source: str, online: bool) -> "LatencyCurve":
        table = table.sort_values("new_tokens")
        return cls(table.new_tokens.to_numpy(), table.median_ms.to_numpy() / 1000, source, online)

    @classmethod
    def read(cls, path: str | Path, online: bool = False, model: str | None = None) -> "LatencyCurve":
        """A curve file: CSV with columns new_tokens and median_ms (what bench_engine writes), k = 1 included."""
        path = Path(path)
        try:
            table = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            raise HarnessError(f"latency curve {path}: cannot be read ({str(exc).splitlines()[0]})") from None
        problem = check_curve_table(table)
        if problem:
            raise HarnessError(f"latency curve {path}: {problem}")
        if model is not None and "model" in table and str(table.model.iloc[0]) != model:
            raise HarnessError(f"latency curve {path} was measured on model {table.model.iloc[0]!r}, not {model!r}")
        return cls.from_table(table, f"replayed {path}", online)


def check_curve_table(table: pd.DataFrame) -> str:
    """What is wrong with a latency-curve table, or "" when it can be used: at least two distinct whole widths
    from 1 up to the most nodes a tree may have, finite times a forward can take, and a last segment that does not fall (the
    curve goes on past its last point with that slope, which must never reach zero). A dip between narrow widths is
    allowed: CPUs measure one (a wider product can run faster kernels)."""
    missing = {"new_tokens", "median_ms"} - set(table.columns)
    if missing:
        return f"missing columns {sorted(missing)} (needs new_tokens and median_ms)"
    k = pd.to_numeric(table.new_tokens, errors="coerce")
    t = pd.to_numeric(table.median_ms, errors="coerce")
    if k.isna().any() or t.isna().any():
        return "new_tokens and median_ms must be numbers"
    if len(k) < 2 or not k.is_unique or 1 not in set(k):
        return "needs at least two distinct widths (new_tokens), k = 1 among them"
    if (k != k.round()).any() or (k < 1).any() or (k > MAX_WIDTH).any():
        return f"widths (new_tokens) must be whole numbers from 1 to {MAX_WIDTH}"
    if not np.isfinite(t).all() or (t < MIN_MS).any() or (t > MAX_MS).any():
        return f"times (median_ms) must be finite, from {MIN_MS:g} to {MAX_MS:,.0f} ms"
    order = np.argsort(k.to_numpy())
    widths, times = k.to_numpy()[order], t.to_numpy()[order]
    if times[-1] < times[-2]:
        return (f"the time falls from k = {widths[-2]:g} to k = {widths[-1]:g}, so wider trees would be predicted to "
                "cost ever less (measure it again: make bench-engine)")
    return ""


def calibration_key(lm) -> str:
    """What the forward time depends on: model, device, dtype, kernels, threads and library versions."""
    key = {"model": lm.source, "dtype": str(lm.dtype), "device": lm.device.type,
           "device_name": processor_name(lm.device), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "widths": CALIBRATION_WIDTHS}
    if getattr(lm, "prepacked", False):  # only when set, so the curves cached before the option keep their key
        key["prepacked"] = True
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def calibrate(lm, cache_dir: Path, repeats: int = 3, context_tokens: int = 256) -> LatencyCurve:
    """The cached curve for this model and machine, or a fresh measurement (a few seconds) written to the cache."""
    path = Path(cache_dir) / "latency" / f"{calibration_key(lm)}.csv"
    if path.is_file():
        table = pd.read_csv(path)
        if not check_curve_table(table):
            return LatencyCurve.from_table(table, f"calibrated {path} (cached)", online=True)
    context = [int(t) % lm.model.config.vocab_size for t in range(1000, 1000 + context_tokens)]
    table = forward_latency(lm, context, CALIBRATION_WIDTHS, repeats)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    table.to_csv(partial, index=False)
    partial.replace(path)
    return LatencyCurve.from_table(table, f"calibrated {path}", online=True)
