"""Our PLD against transformers' own prompt lookup, on the same model and the same Spec-Bench prompts.

    python -m evaluation.tools.bench_pld_vs_hf [--questions-per-subtask 1] [--max-new-tokens 128] [--model smollm2-135m]

For each prompt (the first turn of the first questions of every subtask) it runs our vanilla and PLD through
`decode_turn`, and `model.generate(prompt_lookup_num_tokens=10, do_sample=False)`. transformers' matcher differs from
upstream PLD (it accepts truncated continuations, docs/methods/pld.md, Truncated continuations), so the comparison is of speed and output, not
of drafts. transformers does not report accepted lengths; its mean accepted tokens is new tokens / target forwards,
counted with a forward hook (the prefill forward counts as a step, as in our loop).
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from evaluation.run.config import register_configs
from evaluation.catalog import method_class
from evaluation.engine import decode_turn
from evaluation.models import load_model
from evaluation.questions import SUBTASKS, load_questions, select_questions
from evaluation.templates import build_prompt_ids

ROOT = Path(__file__).resolve().parents[2]


def compose_config(*overrides: str):
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=list(overrides))


def question_file(cfg) -> Path:
    for candidate in (Path(cfg.bench.question_file), ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"):
        if candidate.is_file():
            return candidate
    raise SystemExit("Spec-Bench questions not found: run `make data`")


class ForwardCounter:
    """Counts forwards of a module through a hook."""

    def __init__(self, module: torch.nn.Module):
        self.count = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.count += 1


def run_hf(lm, prompt: list[int], max_new_tokens: int, lookup_tokens: int | None) -> dict:
    counter = ForwardCounter(lm.model)
    options = {"prompt_lookup_num_tokens": lookup_tokens} if lookup_tokens else {}
    try:
        start = time.perf_counter()
        with torch.inference_mode():
            out = lm.model.generate(torch.tensor([prompt], device=lm.device), max_new_tokens=max_new_tokens,
                                    do_sample=False, **options)
        if lm.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        counter.handle.remove()
    ids = out[0, len(prompt):].tolist()
    # generate pads nothing for one sequence, but cut after the first stop token to compare like with like.
    for i, token in enumerate(ids):
        if token in lm.stop_ids:
            ids = ids[: i + 1]
            break
    return {"ids": ids, "seconds": seconds, "steps": counter.count}


def run_ours(lm, method, prompt: list[int], max_new_tokens: int) -> dict:
    result = decode_turn(lm, method, prompt, max_new_tokens)
    return {"ids": result.new_ids, "seconds": result.wall_time, "steps": result.steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions-per-subtask", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--lookup-tokens", type=int, default=10, help="K for both PLDs")
    parser.add_argument("--out", default="results/pld_vs_transformers.csv")
    args = parser.parse_args()

    cfg = compose_config(f"model={args.model}", f"model.dtype={args.dtype}", f"run.device={args.device}")
    lm = load_model(cfg.model, args.device)
    questions = select_questions(load_questions(question_file(cfg)), list(SUBTASKS), args.questions_per_subtask)
    pld_cls = method_class("pld")
    pld = pld_cls(pld_cls.Config(num_pred_tokens=args.lookup_tokens), lm)
    vanilla = method_class("vanilla")(None, lm)

    # One untimed warm-up of every path, so that lazy initialisation is not charged to the first question.
    warm = build_prompt_ids(lm.tokenizer, lm.chat_template, [], questions[0].turns[0])
    run_ours(lm, vanilla, warm, 8), run_ours(lm, pld, warm, 8), run_hf(lm, warm, 8, args.lookup_tokens)

    rows = []
    for q in questions:
        prompt = build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0])
        runs = {"vanilla": run_ours(lm, vanilla, prompt, args.max_new_tokens),
                "pld": run_ours(lm, pld, prompt, args.max_new_tokens),
                "hf_pld": run_hf(lm, prompt, args.max_new_tokens, args.lookup_tokens)}
        rows.append({"subtask": q.subtask, "question_id": q.question_id, **{
            f"{name}_{key}": value for name, run in runs.items()
            for key, value in (("tokens", len(run["ids"])), ("seconds", run["seconds"]), ("steps", run["steps"]))},
            "pld_equals_hf": runs["pld"]["ids"] == runs["hf_pld"]["ids"],
            "pld_equals_vanilla": runs["pld"]["ids"] == runs["vanilla"]["ids"],
            "hf_pld_equals_vanilla": runs["hf_pld"]["ids"] == runs["vanilla"]["ids"]})

    table = summarize(rows)
    print(f"model {cfg.model.name} ({lm.dtype}, {lm.device}), {len(rows)} prompts, max_new_tokens "
          f"{args.max_new_tokens}, K = {args.lookup_tokens}")
    print(markdown(table))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    with open(out.with_name(out.stem + "_per_prompt.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"written: {out} and {out.with_name(out.stem + '_per_prompt.csv')}")


class Group:
    """The per-prompt rows of one subtask (or of all): `<run>_tokens`, `<run>_seconds`, `<run>_steps` per run."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def speed(self, run: str) -> float:
        """Tokens per second over the group: all tokens over all seconds."""
        return sum(r[f"{run}_tokens"] for r in self.rows) / sum(r[f"{run}_seconds"] for r in self.rows)

    def mat(self, run: str) -> float:
        """Mean accepted tokens: all tokens over all target forwards (steps)."""
        return sum(r[f"{run}_tokens"] for r in self.rows) / sum(r[f"{run}_steps"] for r in self.rows)

    def identical(self, key: str) -> str:
        """How many prompts have the boolean `key` true, as `n/prompts`."""
        return f"{sum(r[key] for r in self.rows)}/{len(self.rows)}"


def summarize_groups(rows: list[dict], columns) -> list[dict]:
    """One row per subtask with prompts (in SUBTASKS order) and one `overall`: `subtask`, `prompts`, then
    `columns(group)`, the comparison's own columns from the group's speeds, MATs and identical counts."""
    groups = {s: [r for r in rows if r["subtask"] == s] for s in SUBTASKS}
    groups = {s: g for s, g in groups.items() if g}
    groups["overall"] = rows
    return [{"subtask": name, "prompts": len(group), **columns(Group(group))} for name, group in groups.items()]


def summarize(rows: list[dict]) -> list[dict]:
    """Per subtask and overall: tokens/s of each run, PLD/HF ratio, MAT, and how many outputs are identical."""
    return summarize_groups(rows, lambda g: {
        "vanilla_tok_s": round(g.speed("vanilla"), 2),
        "pld_tok_s": round(g.speed("pld"), 2),
        "hf_pld_tok_s": round(g.speed("hf_pld"), 2),
        "pld_over_hf": round(g.speed("pld") / g.speed("hf_pld"), 3),
        "pld_speedup": round(g.speed("pld") / g.speed("vanilla"), 3),
        "hf_pld_speedup": round(g.speed("hf_pld") / g.speed("vanilla"), 3),
        "pld_mat": round(g.mat("pld"), 3),
        "hf_pld_mat": round(g.mat("hf_pld"), 3),  # tokens per counted forward
        "identical_pld_hf": g.identical("pld_equals_hf"),
        "identical_pld_vanilla": g.identical("pld_equals_vanilla"),
    })


def markdown(table: list[dict]) -> str:
    keys = list(table[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in table]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
