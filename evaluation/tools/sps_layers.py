"""Which of the target's layers a self-draft (`sps-self`) should run: a sweep on Alpaca prompts, outside Spec-Bench.

    python -m evaluation.tools.sps_layers [--questions 6] [--max-new-tokens 96] [--model smollm2-135m]

Layer sets, for a target of L layers: the first N for N of about L/15, L/8, L/4, L/3 and L/2; the first few and the
last few (a draft that skips the middle, as Draft & Verify and SWIFT do); every other layer. Each question is
answered by vanilla and by every layer set in turn, after one warm-up, greedily; vanilla's answer is checked
against each. Writes `sweep.csv` (one row per layer set: draft layers, MAT, tokens/s, speedup over vanilla),
`sweep.md` (machine, commit and settings, then the table) and `sweep.png` (speedup and MAT against the number of
draft layers) into `--out`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from evaluation.catalog import method_class
from evaluation.engine import decode_turn
from evaluation.files import write_text
from evaluation.models import load_model
from evaluation.provenance import environment
from evaluation.questions import load_questions
from evaluation.templates import build_prompt_ids
from evaluation.tools.bench_pld_vs_hf import ROOT, compose_config


def layer_sets(num_layers: int) -> dict[str, list[int]]:
    """The layer sets of the sweep, by label, for a target of `num_layers` layers."""
    sets: dict[str, list[int]] = {}
    for fraction in (15, 8, 4, 3, 2):
        n = max(1, round(num_layers / fraction))
        sets[f"first {n}"] = list(range(n))
    for first, last in ((max(1, round(num_layers / 8)), max(1, round(num_layers / 15))),
                        (max(1, round(num_layers / 5)), max(1, round(num_layers / 8)))):
        sets[f"first {first} + last {last}"] = [*range(first), *range(num_layers - last, num_layers)]
    sets["every other"] = list(range(0, num_layers, 2))
    return sets


def alpaca_file(cfg) -> Path:
    for candidate in (Path(cfg.paths.data_dir) / "alpaca" / "question.jsonl",
                      ROOT.parent / "shared" / "data" / "alpaca" / "question.jsonl"):
        if candidate.is_file():
            return candidate
    raise SystemExit("the Alpaca questions were not found: run `make data`")


def sweep(lm, prompts: list[list[int]], max_new_tokens: int, sets: dict[str, list[int]], progress=print):
    vanilla = method_class("vanilla")(None, lm)
    cls = method_class("sps-self")
    methods = {label: cls(cls.Config(draft_layers=layers), lm) for label, layers in sets.items()}
    for method in [vanilla, *methods.values()]:  # one untimed warm-up of every path
        decode_turn(lm, method, prompts[0], 8)
    totals = {label: {"tokens": 0, "seconds": 0.0, "steps": 0, "equal": 0} for label in ["vanilla", *sets]}
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        reference = None
        for label, method in [("vanilla", vanilla), *methods.items()]:
            result = decode_turn(lm, method, prompt, max_new_tokens)
            reference = result.new_ids if reference is None else reference
            total = totals[label]
            total["tokens"] += len(result.new_ids)
            total["seconds"] += result.wall_time
            total["steps"] += result.steps
            total["equal"] += result.new_ids == reference
        progress(f"question {i + 1}/{len(prompts)} done ({time.perf_counter() - started:.0f} s)")
    base = totals["vanilla"]["tokens"] / totals["vanilla"]["seconds"]
    rows = []
    for label, total in totals.items():
        layers = sets.get(label, [])
        rate = total["tokens"] / total["seconds"]
        rows.append({"layer_set": label, "draft_layers": len(layers), "layers": " ".join(map(str, layers)),
                     "mat": round(total["tokens"] / total["steps"], 3), "tokens_per_s": round(rate, 2),
                     "speedup": round(rate / base, 3), "equal_to_vanilla": f"{total['equal']}/{len(prompts)}"})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table[table.layer_set != "vanilla"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, column, label in ((axes[0], "speedup", "speedup over vanilla"), (axes[1], "mat", "mean accepted tokens")):
        first = rows[rows.layer_set.str.match(r"first \d+$")]
        ax.plot(first.draft_layers, first[column], marker="o", label="first N layers")
        other = rows[~rows.layer_set.str.match(r"first \d+$")]
        ax.scatter(other.draft_layers, other[column], marker="s", color="#d62728", label="skip patterns", zorder=3)
        for row in other.itertuples():
            ax.annotate(row.layer_set, (row.draft_layers, getattr(row, column)), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
        if column == "speedup":
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("draft layers")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=6, help="the first N Alpaca questions")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="results/sps_layers", type=Path)
    args = parser.parse_args(argv)
    cfg = compose_config(f"model={args.model}", f"run.device={args.device}")
    lm = load_model(cfg.model, args.device)
    questions = load_questions(alpaca_file(cfg))[: args.questions]
    prompts = [build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0]) for q in questions]
    table = sweep(lm, prompts, args.max_new_tokens, layer_sets(lm.model.config.num_hidden_layers))
    env = environment(lm)
    where = (f"Measured on {env['cpu']} ({env['cpu_count']} cores, {env['torch_threads']} torch threads, "
             f"{env['device']}) at commit `{env['git_commit'][:7]}`{' (dirty)' if env['git_dirty'] else ''}: "
             f"{cfg.model.name}, {env['dtype']}, the first {len(prompts)} Alpaca questions, max_new_tokens "
             f"{args.max_new_tokens}, greedy, gamma 5 with the heuristic, one round after a warm-up.")
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "sweep.csv", table.to_csv(index=False))
    write_text(args.out / "sweep.md", f"{where}\n\n{table.to_markdown(index=False)}\n")
    write_text(args.out / "environment.json", json.dumps(env, indent=1, default=str))
    plot(table, f"sps-self on {cfg.model.name}: draft layers (Alpaca, {len(prompts)} questions)").savefig(
        args.out / "sweep.png", dpi=150)
    print(f"{where}\n\n{table.to_markdown(index=False)}\nWritten: {args.out}/sweep.csv, sweep.md, sweep.png")


if __name__ == "__main__":
    main()
