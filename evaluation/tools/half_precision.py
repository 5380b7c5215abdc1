"""Half precision before a GPU is there: every method decoded in bfloat16 on the CPU against vanilla in bfloat16.

    python -m evaluation.tools.half_precision [--dtype bfloat16] [--prompts 1] [--max-new-tokens 64] [--out results/engine]

In float32 every method's token ids equal vanilla's (the lossless tests). In half precision they need not: a tree
forward and a one-token forward add the same products in another order and round differently, so where the
target's top two logits nearly tie, a method can take the other branch without any bug. What separates such a
flip from a wrong token is the margin at the first difference, read from a plain causal forward of the prompt and
vanilla's tokens before it: a flip's method token lies within the logits' rounding noise of the top logit
(`NEAR_TIE_GAP`), a token the target did not prefer lies far below it.

The CLI decodes the lossless tests' prompts (the first `--prompts` questions of each Spec-Bench subtask, plus the
second turn of the first, asked after vanilla's answer) with every method config in conf/method/ (the trained
drafts when one is committed for the model), and writes `half_precision_<dtype>_cpu.csv` (one row per method and
prompt) and `.md` (match rates and the margins where answers differ, with the CPU, versions and commit).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import pandas as pd
import torch

from evaluation.catalog import method_class
from evaluation.engine import decode_turn
from evaluation.files import write_text
from evaluation.questions import SUBTASKS, load_questions, select_questions
from evaluation.templates import answer_text, build_prompt_ids

ROOT = Path(__file__).resolve().parents[2]
# The largest gap (top logit minus the method's token, in a plain causal forward) that rounding alone explains.
# The method's token m was the argmax of the engine's logits c + e (c causal, e the engine's rounding error), so
# c[top] - c[m] <= e[m] - e[top]: at most the spread of the error over the tokens competing with the top. Measured
# in bfloat16 on the embedded model, 7 prompts x 64 tokens: over the tokens within 2 logits of the top that spread
# reached 0.94 (vanilla, Gumiho: 829 positions), while |e| itself reached 2.8, mostly a shift of all logits alike
# that changes no choice; the tokens the engine chose lay at most 0.25 below the causal top (vanilla, PLD,
# LogitSpec, Token Recycling, Gumiho: 2,046 positions). 1.0 is 4 bfloat16 steps at logits of 32 to 64. Tokens the
# target did not prefer lie far below: the 1000th-ranked 13.5, the runner-up where the target was far from a tie
# 8.4 (tests/test_half_precision.py).
NEAR_TIE_GAP = 1.0
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
COLUMNS = ["method", "prompt", "lossless_by_design", "equal", "position", "vanilla_token", "method_token",
           "top2_margin", "method_token_gap", "causal_argmax_is_vanilla", "near_tie", "new_tokens", "seconds"]


def token_margins(lm, context_ids: list[int], vanilla_token: int, method_token: int) -> dict:
    """At the position after `context_ids`, a plain causal forward's top-2 logit margin (how near a tie the target
    is there) and the gap from its top logit down to the method's token (how far the method strayed)."""
    with torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([context_ids], device=lm.device)).logits[0, -1].float()
    top = torch.topk(logits, 2)
    return {"vanilla_token": vanilla_token, "method_token": method_token,
            "top2_margin": float(top.values[0] - top.values[1]),
            "method_token_gap": float(top.values[0] - logits[method_token]),
            "causal_argmax_is_vanilla": int(top.indices[0]) == vanilla_token}


def first_difference_margins(lm, prompt_ids: list[int], vanilla_ids: list[int], method_ids: list[int]) -> dict:
    """`equal`, and for ids that differ: the first differing `position`, `token_margins` there, and `near_tie`,
    whether rounding explains the difference (the method's token within `NEAR_TIE_GAP` of the causal top; not so
    when one answer is a prefix of the other, with no token to compare)."""
    if method_ids == vanilla_ids:
        return {"equal": True}
    position = next((i for i, (a, b) in enumerate(zip(method_ids, vanilla_ids)) if a != b),
                    min(len(method_ids), len(vanilla_ids)))
    row = {"equal": False, "position": position}
    if position < min(len(method_ids), len(vanilla_ids)):
        row.update(token_margins(lm, prompt_ids + vanilla_ids[:position], vanilla_ids[position], method_ids[position]))
    return {**row, "near_tie": row.get("method_token_gap", math.inf) <= NEAR_TIE_GAP}


def spec_bench_prompts(lm, question_file: Path, per_subtask: int, max_new_tokens: int) -> dict[str, list[int]]:
    """The lossless tests' prompts: the first `per_subtask` questions of each subtask, plus the second turn of the
    first, asked after vanilla's own answer (decoded here, in `lm`'s dtype) to its first turn."""
    questions = select_questions(load_questions(question_file), list(SUBTASKS), per_subtask)
    prompts = {f"q{q.question_id}": build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0])
               for q in questions}
    first = questions[0]
    answer = decode_turn(lm, method_class("vanilla")(None, lm), prompts[f"q{first.question_id}"], max_new_tokens)
    prompts[f"q{first.question_id}-turn2"] = build_prompt_ids(
        lm.tokenizer, lm.chat_template, [(first.turns[0], answer_text(lm.tokenizer, answer.new_ids))], first.turns[1])
    return prompts


def method_configs() -> list[str]:
    """Every method config, vanilla first; the trained-draft ones only with a committed draft (as `make bench`)."""
    from evaluation.catalog import bench_settings

    return bench_settings("smollm2-135m")


def compose_config(*overrides: str):
    """conf/config.yaml with Hydra `overrides`, composed as `run.py` does."""
    from hydra import compose, initialize_config_dir

    from evaluation.run.config import register_configs

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return compose("config", overrides=list(overrides))


def build_method(lm, config_name: str, **options):
    """The method of conf/method/<config_name>.yaml on `lm`, with `options` replacing some of its defaults."""
    from evaluation.run.validation import method_spec

    spec = method_spec(compose_config(f"method={config_name}").method)
    return spec.cls(dataclasses.replace(spec.options, **options), lm)


def lossless_by_design(method) -> bool:
    """Gumiho's Full Tree Attention verifies padded rows that are not the target's greedy path: not exact."""
    return not getattr(method.config, "fta", False)


def compare_methods(lm, prompts: dict[str, list[int]], max_new_tokens: int, configs: list[str],
                    options: dict | None = None, progress=print) -> pd.DataFrame:
    """Decode every prompt with vanilla and with each config (`options[config]` replacing some of its defaults);
    one row per method and prompt: equal to vanilla's ids, and where not, the margins at the first difference."""
    vanilla = method_class("vanilla")(None, lm)
    reference = {name: decode_turn(lm, vanilla, prompt, max_new_tokens).new_ids for name, prompt in prompts.items()}
    rows = []
    for config in [c for c in configs if c != "vanilla"]:
        method = build_method(lm, config, **(options or {}).get(config, {}))
        for name, prompt in prompts.items():
            result = decode_turn(lm, method, prompt, max_new_tokens)
            rows.append({"method": config, "prompt": name, "lossless_by_design": lossless_by_design(method),
                         "new_tokens": len(result.new_ids), "seconds": result.wall_time,
                         **first_difference_margins(lm, prompt, reference[name], result.new_ids)})
        done = as_table(rows).query("method == @config")
        differing = done[~done.equal]
        progress(f"{config}: {int(done.equal.sum())}/{len(done)} equal to vanilla"
                 + (f"; {int(differing.near_tie.sum())} of {len(differing)} differences are near ties, largest gap "
                    f"{differing.method_token_gap.max():.3f}" if len(differing) else "")
                 + f" ({done.seconds.sum():.0f} s)")
    return as_table(rows)


def as_table(rows: list[dict]) -> pd.DataFrame:
    """The rows under `COLUMNS`; token ids and positions stay integers where equal answers leave them empty."""
    return pd.DataFrame(rows, columns=COLUMNS).astype(
        {"position": "Int64", "vanilla_token": "Int64", "method_token": "Int64", "causal_argmax_is_vanilla": "boolean",
         "near_tie": "boolean"})


def beyond_rounding(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of methods lossless by design whose answer differs from vanilla's where rounding does not explain
    it: each one a wrong token."""
    return table[table.lossless_by_design & ~table.equal & ~table.near_tie.fillna(False)]


def cpu_flags() -> dict[str, bool]:
    """Which of the instruction sets that decide half-precision speed and kernels this CPU has (Linux only)."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        flags = []
    return {flag: flag in flags for flag in CPU_FLAGS}


def summary(table: pd.DataFrame, lm, env: dict, command: str, max_new_tokens: int) -> str:
    """Match rate per method, and every first difference with its margins, under the machine and code they came
    from."""
    dtype = env["dtype"]
    flags = ", ".join(f"{flag} {'yes' if present else 'no'}" for flag, present in cpu_flags().items())

    def text(ids: pd.Series) -> list[str]:
        return [repr(lm.tokenizer.decode([int(i)])) if pd.notna(i) else "" for i in ids]

    differing = table[~table.equal]
    differing = differing.assign(vanilla_text=text(differing.vanilla_token), method_text=text(differing.method_token))
    rates = table.groupby("method", sort=False).agg(
        lossless_by_design=("lossless_by_design", "first"), prompts=("equal", "size"), equal=("equal", "sum"),
        match_rate=("equal", "mean"), near_ties=("near_tie", "sum"), largest_gap=("method_token_gap", "max"))
    rates["beyond_near_tie"] = beyond_rounding(table).groupby("method").size().reindex(rates.index, fill_value=0)
    return "\n".join([
        f"# Every method in {dtype} against vanilla in {dtype}, on the CPU", "",
        f"CPU: {env['cpu']} ({flags}); torch threads: {env['torch_threads']}; torch {env['packages']['torch']}, "
        f"transformers {env['packages']['transformers']}; commit {env['git_commit'][:7]}"
        f"{' with uncommitted changes' if env['git_dirty'] else ''}; {table.prompt.nunique()} Spec-Bench prompts, "
        f"{max_new_tokens} new tokens; `{command}`.", "",
        f"Where an answer first differs from vanilla's, `near_ties` counts the differences where the method's token "
        f"lies within {NEAR_TIE_GAP} of the top logit of a plain causal {dtype} forward there (the gap rounding "
        "can explain: `NEAR_TIE_GAP` in evaluation/tools/half_precision.py); `beyond_near_tie` counts the others of the "
        "methods lossless by design (all but gumiho-fta): each would be a wrong token.", "",
        rates.to_markdown(floatfmt=".3g"), "",
        "## First differences", "",
        differing[["method", "prompt", "position", "vanilla_token", "vanilla_text", "method_token", "method_text",
                   "top2_margin", "method_token_gap", "causal_argmax_is_vanilla", "near_tie"]].to_markdown(
            index=False, floatfmt=".3g") if len(differing) else "(none: every answer equals vanilla's)", ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--prompts", type=int, default=1,
                        help="questions per subtask (plus the second turn of the first); 1 gives the 7 prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default="results/engine")
    args = parser.parse_args(argv)
    from evaluation.models import load_model
    from evaluation.provenance import environment

    cfg = compose_config(f"model.dtype={args.dtype}", "run.device=cpu")
    lm = load_model(cfg.model, "cpu")
    prompts = spec_bench_prompts(lm, Path(cfg.bench.question_file), args.prompts, args.max_new_tokens)
    print(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, {args.dtype} on the CPU", flush=True)
    table = compare_methods(lm, prompts, args.max_new_tokens, method_configs(),
                            progress=lambda line: print(line, flush=True))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"half_precision_{args.dtype}_cpu"
    write_text(stem.with_suffix(".csv"), table.to_csv(index=False, float_format="%.4g"))
    command = (f"python -m evaluation.tools.half_precision --dtype {args.dtype} --prompts {args.prompts} "
               f"--max-new-tokens {args.max_new_tokens} --out {args.out}")
    write_text(stem.with_suffix(".md"), summary(table, lm, environment(lm), command, args.max_new_tokens))
    print(f"Written: {stem}.csv, {stem}.md")


if __name__ == "__main__":
    from evaluation.versions import require_supported_environment

    require_supported_environment()
    main()
