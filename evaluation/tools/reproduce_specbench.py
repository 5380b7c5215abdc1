"""`make reproduce-specbench MODEL=vicuna-7b`: Spec-Bench's Table 1 for one target, in one command.

Spec-Bench's settings (every question of the six subtasks, 1,024 new tokens a turn, 3 warm-ups, greedy decoding,
float16 on a GPU, batch 1; `conf/bench/spec_bench.yaml`), every method that has a checkpoint for the target
(committed here or released: conf/checkpoints.yaml) interleaved question by question with vanilla in one process.

Before anything loads it prints the plan: the methods with the checkpoint each reads, the methods left out and why,
precision and device, questions and tokens, and an estimated duration (labelled as one) from the engine's latency
curve for this model and machine when one is cached (`run.draft_budget=auto` or `make bench-engine` measures it).
Then every checkpoint, draft model and file is looked up (`evaluation.run.preflight`); offline, a missing one stops
it within seconds with one line naming all of them. It ends with the report, Table 1 and our numbers beside the
published leaderboard rows for the target, with ours/published ratios (`table1_vs_published.csv`).

A run interrupted resumes where it stopped when the same command is run again (each cell's run folder resumes).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from evaluation.engine.errors import HarnessError

ROOT = Path(__file__).resolve().parents[2]
# Spec-Bench's own settings, the ones conf/bench/spec_bench.yaml holds, stated on the command line so a local
# override file cannot change them silently.
SPEC_BENCH = ["bench=spec_bench", "bench.questions_per_subtask=null", "bench.max_new_tokens=1024", "bench.warmup=3",
              "bench.temperature=0", "model.dtype=auto", "run.draft_budget=off"]


def cells(model: str) -> tuple[list[str], dict[str, str]]:
    """The cells (one per method config, vanilla first) and the configs left out with why."""
    from evaluation.catalog import bench_plan

    settings, left_out = bench_plan(model)
    return [f"method={name}" for name in settings], left_out


def common_overrides(model: str, out: Path, repeats: int, extra: list[str]) -> list[str]:
    return [f"model={model}", *SPEC_BENCH, f"run.repeats={repeats}", f"run.results_dir={out / 'runs'}",
            "run.report=false", *extra]


def specs_for(cell_list: list[str], common: list[str]):
    from evaluation.run.interleave import compose_cell
    from evaluation.run.validation import validate

    specs = []
    for cell in cell_list:
        try:
            specs.append(validate(compose_cell(cell, common)))
        except HarnessError as exc:
            raise HarnessError(f"cell {cell!r}: {exc}") from None
    return specs


def turns(spec) -> int:
    from evaluation.run.answerers import read_questions

    return sum(len(q.turns) for q in read_questions(spec))


def estimate_seconds(spec, tokens: int) -> tuple[float | None, str]:
    """Vanilla's time for `tokens` new tokens from the cached latency curve of this model, device and dtype (an
    estimate: t(1) per token), or None with the reason there is none."""
    from types import SimpleNamespace

    import pandas as pd

    from evaluation.engine.budget.latency import calibration_key
    from evaluation.models import default_cache_dir, model_directory, prepacks, resolve_device, resolve_dtype

    device = resolve_device(spec.run.device)
    dtype = resolve_dtype(spec.model.dtype, device)
    # What the calibration key reads of a loaded model, known before it loads
    planned = SimpleNamespace(source=model_directory(spec.model), dtype=dtype, device=device,
                              prepacked=prepacks(spec.model, device, dtype))
    path = default_cache_dir() / "latency" / f"{calibration_key(planned)}.csv"
    if not path.is_file():
        return None, (f"no latency curve cached for {spec.model.name} in {str(dtype).replace('torch.', '')} on this "
                      f"{device.type} yet (one is measured by the first run with run.draft_budget=auto)")
    one = float(pd.read_csv(path).set_index("new_tokens").median_ms.loc[1]) / 1000
    return tokens * one, f"t(1) = {one * 1000:.1f} ms from {path.name}"


def published_speedups(model_name: str) -> dict[str, float]:
    """Overall speedups of the published leaderboard for the target, by our method name (empty when none)."""
    from evaluation.report.figures.tables import (default_published_csv, leaderboard_model, load_published,
                                                  published_table)

    name = leaderboard_model(model_name)
    if name is None:
        return {}
    table = published_table(load_published(default_published_csv()), model=name)
    table = table[table.model == name].dropna(subset=["Overall Speedup"])
    # The last row per method wins: A100 where both devices have it (published_table puts the A100 table last)
    return {row.method: float(row["Overall Speedup"]) for _, row in table.iterrows()}


def print_plan(model: str, specs, left_out: dict[str, str], repeats: int) -> None:
    import torch

    from evaluation.models import resolve_device, resolve_dtype

    first = specs[0]
    device = resolve_device(first.run.device)
    dtype = str(resolve_dtype(first.model.dtype, device)).replace("torch.", "")
    source = first.model.path or ("embedded" if first.model.embedded else first.model.hf_id)
    n_turns = turns(first)
    print(f"reproduce-specbench {model}: target {first.model.name} ({source}), {dtype} on "
          f"{torch.cuda.get_device_name(0) if device.type == 'cuda' else device.type}, batch 1, greedy")
    subtasks = ", ".join(first.bench.subtasks) if first.bench.subtasks else "all six subtasks"
    per = first.bench.questions_per_subtask
    print(f"  questions: {'every question' if per is None else f'{per} per subtask'} of {subtasks} "
          f"({n_turns} turns), {first.bench.max_new_tokens} new tokens a turn at most, {first.bench.warmup} "
          f"warm-ups, {repeats} repeat{'s' if repeats > 1 else ''}")
    print(f"  methods ({len(specs)}), interleaved question by question:")
    for spec in specs:
        trained = spec.method.cls.trained_source(spec.method.options, spec.model.name)
        print(f"    {spec.label():<28} {trained or ''}")
    for name, reason in left_out.items():
        print(f"  leaves out {name}: {reason}")
    tokens = n_turns * first.bench.max_new_tokens * repeats
    vanilla, how = estimate_seconds(first, tokens)
    if vanilla is None:
        print(f"  estimated duration: unknown ({how})")
        return
    speedups = published_speedups(first.model.name)
    total = sum(vanilla / speedups.get(spec.method.name, 1.0) for spec in specs)
    print(f"  estimated duration (an estimate, an upper bound: every turn at {first.bench.max_new_tokens} tokens, "
          f"{how}, methods at their published speedup or vanilla's): {total / 3600:.1f} h")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m evaluation.tools.reproduce_specbench",
                                     description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s --model MODEL [--out DIR] [--repeats N] [--dry-run] [-- OVERRIDE ...]")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", default=None, help="the bench set's folder (default results/specbench/<model>)")
    parser.add_argument("--repeats", type=int, default=1, help="Spec-Bench's leaderboard averages 3")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and check the files, run nothing")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    out = Path(args.out or ROOT / "results" / "specbench" / args.model)
    try:
        if args.repeats < 1:
            raise HarnessError(f"bad value for --repeats: {args.repeats} (allowed: an integer >= 1)")
        from evaluation.run import preflight

        cell_list, left_out = cells(args.model)
        common = common_overrides(args.model, out, args.repeats, extra)
        specs = specs_for(cell_list, common)
        print_plan(args.model, specs, left_out, args.repeats)
        preflight.check(specs, model=args.model)
        print("  every checkpoint and file found", flush=True)
        if args.dry_run:
            return
        from evaluation.run.interleave import interleave

        interleave(cell_list, common)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    for command in (["-m", "evaluation.report", "--results", str(out / "runs"), "--out", str(out)],
                    ["-m", "evaluation.report.figures", "--results", str(out / "runs"), "--out", str(out / "figures")]):
        subprocess.run([sys.executable, *command], cwd=ROOT, check=True)
    versus = out / "figures" / "table1_vs_published.csv"
    if versus.is_file():
        print(f"\nTable 1 beside the published rows ({versus}):\n{versus.read_text()}")


if __name__ == "__main__":
    from evaluation.versions import require_supported_environment

    require_supported_environment()
    main()
