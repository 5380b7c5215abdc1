"""Engine benchmarks: what any speculative method can gain on this machine, and whether our baseline is fair.

    python -m evaluation.tools.bench_engine [model=...] [--repeats 9] [--prompts 6] [--max-new-tokens 96]

1. Forward latency for k = 1..64 new tokens over a ~300-token context (median of repeats): a method that
   verifies k tokens per step at latency L(k) can at best gain k * L(1) / L(k).
2. Vanilla tokens/s of our decode loop against transformers' `generate(do_sample=False)` on the same real
   Spec-Bench prompts, with a check that the tokens are identical. Our baseline must not be slower, or every
   speedup measured against it is inflated.
Writes results/engine/forward_latency.csv and vanilla_vs_generate.csv, and prints both as Markdown.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from evaluation.catalog import method_class
from evaluation.engine import decode_turn
from evaluation.engine.budget import forward_latency
from evaluation.files import write_text
from evaluation.models import load_model
from evaluation.questions import SUBTASKS, load_questions, select_questions
from evaluation.run.config import register_configs
from evaluation.templates import build_prompt_ids

CONF = Path(__file__).resolve().parents[2] / "conf"


def vanilla_vs_generate(lm, prompts: list[list[int]], max_new_tokens: int) -> pd.DataFrame:
    vanilla = method_class("vanilla")(None, lm)
    rows = []
    for prompt in prompts:
        ours = decode_turn(lm, vanilla, prompt, max_new_tokens)
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = lm.model.generate(torch.tensor([prompt], device=lm.device), max_new_tokens=max_new_tokens,
                                    do_sample=False)
            if lm.device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        theirs = out[0, len(prompt):].tolist()
        rows.append({"prompt_tokens": len(prompt), "new_tokens": len(ours.new_ids),
                     "ours_tok_s": len(ours.new_ids) / ours.wall_time, "generate_tok_s": len(theirs) / seconds,
                     "identical": ours.new_ids == theirs})
    table = pd.DataFrame(rows)
    table["ratio"] = table.ours_tok_s / table.generate_tok_s
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=vicuna-7b-v1.3")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--prompts", type=int, default=6, help="prompts for the generate() comparison")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", default="results/engine")
    args = parser.parse_args(argv)
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=args.overrides)
    lm = load_model(cfg.model, cfg.run.device)
    questions = select_questions(load_questions(cfg.bench.question_file), list(SUBTASKS), 1)
    prompts = [build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0]) for q in questions]
    context = max(prompts, key=len)[:300]
    while len(context) < 300:
        context = context + prompts[0][: 300 - len(context)]

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = f"{cfg.model.name}, {lm.dtype}, {lm.device}, {torch.get_num_threads()} threads"
    latency = forward_latency(lm, context, [1, 2, 4, 8, 16, 32, 64, 128], args.repeats)
    # The model, device and dtype ride along, so `run.latency_curve=` can replay this file on a matching run.
    latency = latency.assign(model=cfg.model.name, device=str(lm.device), dtype=str(lm.dtype).replace("torch.", ""))
    write_text(out / "forward_latency.csv", latency.to_csv(index=False, float_format="%.4g"))
    print(f"## Forward latency over a {latency.context.iloc[0]}-token context ({machine})\n")
    print(latency.drop(columns=["model", "device", "dtype"]).to_markdown(index=False, floatfmt=".2f"), "\n")
    race = vanilla_vs_generate(lm, (prompts * 2)[: args.prompts], args.max_new_tokens)
    write_text(out / "vanilla_vs_generate.csv", race.to_csv(index=False, float_format="%.4g"))
    print(f"## Vanilla: our loop against transformers generate() ({machine})\n")
    print(race.to_markdown(index=False, floatfmt=".2f"))
    print(f"\nMean tokens/s: ours {race.ours_tok_s.mean():.2f}, generate {race.generate_tok_s.mean():.2f} "
          f"(ratio {race.ours_tok_s.mean() / race.generate_tok_s.mean():.3f}); identical: "
          f"{int(race.identical.sum())}/{len(race)}")


if __name__ == "__main__":
    from evaluation.versions import require_supported_environment

    require_supported_environment()
    main()
