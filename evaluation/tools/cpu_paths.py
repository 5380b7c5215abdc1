"""The target's forward on the CPU, path by path: what verifying k tokens costs against one, and why.

    python -m evaluation.tools.cpu_paths [model=...] [--repeats 11] [--out results/engine]
    (run by `make bench-engine` on a CPU)

For float32 and bfloat16, plain and prepacked linear layers (`model.cpu_prepack`), one thread and every thread:
1. the whole forward's t(k) for k = 1..64 new tokens over a 256-token context (cpu_paths.csv);
2. the same per layer type (the 30 layers' q/k/v/o and gate/up/down projections, and the head, each over k
   rows, weights streamed as in the model) (cpu_layers.csv);
3. where a forward's time goes at k = 1 and 16: matrix products, attention, the other operators, and what lies
   outside any operator (Python, module dispatch), from the profiler (cpu_breakdown.csv);
4. which kernel each path takes, from MKL's and oneDNN's own verbose logs (cpu_kernels.csv);
5. this machine's bounds: the read bandwidth and the float32/bfloat16 matrix-product rate measured here, and the
   t(k)/t(1) they allow the weights of this model, with the weight streaming and the arithmetic overlapped
   (roofline) or one after the other (cpu_bounds.csv, an estimate from these two rates).
Everything is summarised in cpu.md with the CPU and its flags named.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from evaluation.engine.device import REPORTED_FLAGS, cpu_flags, cpu_name
from evaluation.engine.kv_cache import cache_argument, cache_for
from evaluation.engine.tree import DraftTree, build_tree_inputs
from evaluation.files import write_text
from evaluation.models import load_model
from evaluation.provenance import commit
from evaluation.run.config import register_configs

CONF = Path(__file__).resolve().parents[2] / "conf"
WIDTHS = [1, 2, 4, 8, 16, 32, 64]
LAYER_WIDTHS = [1, 4, 8, 16, 64]
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MATRIX_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "mkldnn::_linear_pointwise", "mkl::_mkl_linear"}
ATTENTION_OPS = ("scaled_dot_product",)
CONTEXT = 256


def thread_counts() -> list[int]:
    return sorted({1, torch.get_num_threads()})


@contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def median_ms(fn, repeats: int, warmups: int = 2) -> float:
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


class Forward:
    """One target forward of k new tokens (a chain) after a fixed context, repeatable."""

    def __init__(self, lm, context: list[int], k: int):
        self.lm, self.cache = lm, cache_for(lm.model, len(context) + 65)
        with torch.inference_mode():
            prefill = build_tree_inputs(context[0], DraftTree.chain(context[1:]), 0, lm.dtype, lm.device)
            self._call(prefill)
        self.base = self.cache.length
        self.inputs = build_tree_inputs(context[-1], DraftTree.chain(context[: k - 1]), self.base, lm.dtype, lm.device)

    def _call(self, inputs):
        self.lm.model(input_ids=inputs.input_ids, position_ids=inputs.position_ids, attention_mask=inputs.attention_mask,
                      **cache_argument(self.lm.model, self.cache), use_cache=True)

    @torch.inference_mode()
    def __call__(self):
        self.cache.crop(self.base)
        self._call(self.inputs)


def curve(lm, context: list[int], repeats: int) -> list[dict]:
    """t(k) for every width, the widths taken in turn within each repeat: a machine whose speed drifts (a shared
    host) then moves every width alike, and the ratios t(k)/t(1) stay fair."""
    forwards = {k: Forward(lm, context, k) for k in WIDTHS}
    for forward in forwards.values():
        forward()
        forward()
    times: dict[int, list[float]] = {k: [] for k in WIDTHS}
    for _ in range(repeats):
        for k, forward in forwards.items():
            t0 = time.perf_counter()
            forward()
            times[k].append(time.perf_counter() - t0)
    one = statistics.median(times[1])
    return [{"new_tokens": k, "median_ms": 1000 * statistics.median(t), "vs_one_token": statistics.median(t) / one}
            for k, t in times.items()]


def breakdown(forward: Forward, repeats: int) -> dict:
    """Milliseconds per forward: matrix products, attention, other operators, outside any operator."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        forward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(repeats):
            forward()
        wall = (time.perf_counter() - t0) / repeats
    parts = collections.Counter()
    for event in prof.key_averages():
        name = event.key
        part = ("matrix products" if name in MATRIX_OPS else
                "attention" if any(a in name for a in ATTENTION_OPS) else "other operators")
        parts[part] += event.self_cpu_time_total / 1e3 / repeats  # microseconds -> ms per forward
    row = {"wall_ms": 1000 * wall, **{f"{p}_ms": parts[p] for p in ("matrix products", "attention", "other operators")}}
    row["outside operators_ms"] = max(0.0, row["wall_ms"] - sum(parts.values()))
    return row


@contextmanager
def captured_stdout():
    """What C libraries print on file descriptor 1 (MKL and oneDNN verbose logs), as a list of lines."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(1)
        os.dup2(sink.fileno(), 1)
        try:
            yield lines
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().splitlines())


def kernels(forward: Forward) -> str:
    """The matrix kernels one forward runs, by library and implementation, with their counts."""
    forward()
    with captured_stdout() as lines:
        with (torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON),
              torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON)):
            forward()
    seen = collections.Counter()
    for line in lines:
        mkl = re.match(r"MKL_VERBOSE (\w+)\(", line)
        if mkl:
            seen[f"MKL {mkl.group(1)}"] += 1
        elif line.startswith("onednn_verbose") and ",exec,cpu," in line:
            fields = line.split(",")
            at = fields.index("cpu", fields.index("exec"))
            if fields[at + 1] != "reorder" or "matmul" not in line:
                seen[f"oneDNN {fields[at + 1]} {fields[at + 2]}"] += 1
    return "; ".join(f"{name} x{count}" for name, count in seen.most_common())


def layer_times(lm, repeats: int) -> list[dict]:
    """Each projection type through all layers (and the head) over k rows, as the forward streams them."""
    modules = dict(lm.model.named_modules())
    groups = {p: [m for name, m in modules.items() if name.endswith("." + p)] for p in PROJECTIONS}
    groups["lm_head"] = [lm.model.get_output_embeddings()]
    rows = []
    for kind, layers in groups.items():
        if not layers:
            continue
        for k in LAYER_WIDTHS:
            x = torch.randn(1, k, layers[0].in_features, dtype=lm.dtype)

            def run():
                with torch.inference_mode():
                    for layer in layers:
                        layer(x)

            rows.append({"layer": kind, "layers": len(layers), "new_tokens": k, "median_ms": median_ms(run, repeats)})
    return rows


def machine_rates(repeats: int) -> list[dict]:
    """Read bandwidth (GB/s) and matrix-product rates (GFLOP/s) of this machine, per thread count."""
    rows = []
    big = torch.randn(128 * 1024 * 1024)  # 512 MiB, far beyond the caches
    for n in thread_counts():
        with threads(n):
            seconds = median_ms(big.sum, repeats, 1) / 1000
            row = {"threads": n, "read_GB_s": big.numel() * 4 / seconds / 1e9}
            for dtype in (torch.float32, torch.bfloat16):
                m = torch.randn(2048, 2048, dtype=dtype)
                seconds = median_ms(lambda: m @ m, repeats, 1) / 1000
                row[f"{str(dtype).replace('torch.', '')}_GFLOP_s"] = 2 * 2048**3 / seconds / 1e9
            rows.append(row)
    return rows


def bounds(lm, rates: list[dict]) -> pd.DataFrame:
    """t(k)/t(1) the measured rates allow this model's weights: streamed once per forward, 2 FLOP per weight per row."""
    parameters = sum(p.numel() for p in {id(p): p for p in lm.model.parameters()}.values())
    embedding = lm.model.get_input_embeddings().weight.numel()
    tied = lm.model.get_output_embeddings().weight is lm.model.get_input_embeddings().weight
    streamed = parameters - embedding + (embedding if tied else 0)  # the embedding rows read are negligible
    rows = []
    for rate in rates:
        for dtype, size in (("float32", 4), ("bfloat16", 2)):
            memory = streamed * size / (rate["read_GB_s"] * 1e9)
            for k in WIDTHS:
                compute = 2 * streamed * k / (rate[f"{dtype}_GFLOP_s"] * 1e9)
                rows.append({"dtype": dtype, "threads": rate["threads"], "new_tokens": k,
                             "memory_ms": 1000 * memory, "compute_ms": 1000 * compute,
                             "roofline_vs_one": max(memory, compute) / max(memory, compute / k),
                             "serial_vs_one": (memory + compute) / (memory + compute / k)})
    return pd.DataFrame(rows)


def load(overrides: list[str], dtype: str, prepack: bool):
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=[*overrides, f"model.dtype={dtype}", f"model.cpu_prepack={prepack}",
                                           "run.device=cpu"])
    return cfg, load_model(cfg.model, "cpu")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=smollm2-135m")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--out", default="results/engine")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    flags, checkout = cpu_flags(), commit()
    machine = (f"{cpu_name()}, {os.cpu_count()} cores; flags: "
               + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in REPORTED_FLAGS)
               + f"; torch {torch.__version__}, commit {(checkout.get('git_commit') or 'unknown')[:7]}"
               + (" with uncommitted changes" if checkout.get("git_dirty") else ""))
    curves, layers, parts, paths = [], [], [], []
    model_name = None
    for dtype in ("float32", "bfloat16"):
        for prepack in (False, True):
            cfg, lm = load(args.overrides, dtype, prepack)
            model_name = cfg.model.name
            if prepack and not lm.prepacked:  # no oneDNN path for this dtype here (bfloat16 on an AVX2-only CPU)
                print(f"{dtype}, prepacked: not on this CPU (oneDNN has no {dtype} path here); skipped", flush=True)
                continue
            context = [int(t) % lm.model.config.vocab_size for t in range(1000, 1000 + CONTEXT)]
            setting = {"dtype": dtype, "prepacked": lm.prepacked}
            for n in thread_counts():
                with threads(n):
                    print(f"{dtype}, prepacked {lm.prepacked}, {n} thread(s) ...", flush=True)
                    curves += [{**setting, "threads": n, **row} for row in curve(lm, context, args.repeats)]
                    layers += [{**setting, "threads": n, **row} for row in layer_times(lm, args.repeats)]
                    for k in (1, 16):
                        forward = Forward(lm, context, k)
                        parts.append({**setting, "threads": n, "new_tokens": k, **breakdown(forward, args.repeats)})
                        paths.append({**setting, "threads": n, "new_tokens": k, "kernels": kernels(forward)})
            del lm
    rates = machine_rates(args.repeats)
    _, lm = load(args.overrides, "float32", False)
    tables = {
        "cpu_paths.csv": pd.DataFrame(curves), "cpu_layers.csv": pd.DataFrame(layers),
        "cpu_breakdown.csv": pd.DataFrame(parts), "cpu_kernels.csv": pd.DataFrame(paths),
        "cpu_rates.csv": pd.DataFrame(rates), "cpu_bounds.csv": bounds(lm, rates),
    }
    for name, table in tables.items():
        write_text(out / name, table.to_csv(index=False, float_format="%.4g"))
    write_text(out / "cpu.md", summary(tables, machine, model_name))
    print(summary(tables, machine, model_name))


def summary(tables: dict, machine: str, model: str) -> str:
    """cpu.md: t(k)/t(1) per path, the breakdown, the kernels and the bounds, under the machine's name."""
    curves = tables["cpu_paths.csv"]
    wide = curves.pivot_table(index=["dtype", "prepacked", "threads"], columns="new_tokens", values="median_ms")
    ratio = wide.div(wide[1], axis=0)
    shown = wide.round(1).astype(str) + " (" + ratio.round(2).astype(str) + ")"
    shown.columns = [f"k={k}" for k in shown.columns]
    bounds_table = tables["cpu_bounds.csv"]
    bound = bounds_table[bounds_table.new_tokens.isin([8, 16])].pivot_table(
        index=["dtype", "threads"], columns="new_tokens", values=["roofline_vs_one", "serial_vs_one"]).round(2)
    bound.columns = [f"{kind} k={k}" for kind, k in bound.columns]
    lines = [
        f"# The forward on the CPU, path by path ({model})", "",
        f"Machine: {machine}.", "",
        "## Forward time against new tokens", "",
        f"t(k) in ms, and t(k)/t(1) in brackets: k new tokens (a chain) over a {CONTEXT}-token context, median "
        "of the repeats, the widths taken in turn within each repeat.", "",
        shown.reset_index().to_markdown(index=False), "",
        "## Where the time goes", "",
        "Milliseconds per forward, from the profiler: the linear layers' matrix products, the attention, the "
        "other operators (norms, rotary embedding, activations, copies), and the wall time outside any operator "
        "(Python and the modules' dispatch).", "",
        tables["cpu_breakdown.csv"].to_markdown(index=False, floatfmt=".1f"), "",
        "## Kernels", "",
        "What the matrix libraries' verbose logs name for one forward, with counts.", "",
        tables["cpu_kernels.csv"].to_markdown(index=False), "",
        "## Bounds", "",
        "This machine's read bandwidth and matrix-product rates, measured here, and the t(k)/t(1) they allow "
        "the model's weights (an estimate).", "",
        tables["cpu_rates.csv"].to_markdown(index=False, floatfmt=".0f"), "",
        bound.reset_index().to_markdown(index=False), "",
        "Roofline: streaming the weights and the arithmetic overlap perfectly; serial: one after the other, "
        "as a core that waits on memory while it computes. Both leave out the attention and the operators "
        "outside the matrix products.", "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    from evaluation.versions import require_supported_environment

    require_supported_environment()
    main()
