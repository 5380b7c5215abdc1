"""Our SpS against transformers' assisted generation, on the same draft, model and Spec-Bench prompts.

    python -m evaluation.tools.bench_sps_vs_hf [--questions-per-subtask 1] [--max-new-tokens 128] [--draft-layers 8]

The draft is the target's first `--draft-layers` layers with its final norm and head. Ours runs it in place
(`sps-self`, the target's own modules); transformers needs a model object, so the same layers are copied into a
standalone model for `generate(assistant_model=...)`, and our `sps` runs that copy too. All three start each turn
at 5 draft tokens with the +2/-1 heuristic (transformers' `heuristic_transient`, Spec-Bench's behaviour; its
confidence early stop is switched off, as in the transformers release Spec-Bench ran). Greedy: every answer must
equal vanilla's. transformers does not report accepted lengths; its mean accepted tokens is new tokens / target
forwards, counted with a forward hook (the prefill forward counts as a step, as in our loop).
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

import torch

from evaluation.catalog import method_class
from evaluation.models import load_companion_model, load_model
from evaluation.questions import SUBTASKS, load_questions, select_questions
from evaluation.templates import build_prompt_ids
from evaluation.tools.bench_pld_vs_hf import (ForwardCounter, compose_config, markdown, question_file, run_ours,
                                              summarize_groups)

GAMMA = 5


def truncated_copy(lm, layers: int, folder: Path) -> Path:
    """Save the target's first `layers` decoder layers, final norm and head as a standalone model (and the
    target's tokenizer) into `folder`."""
    from transformers import AutoModelForCausalLM

    config = lm.model.config.to_dict()
    config["num_hidden_layers"] = layers
    if config.get("layer_types"):
        config["layer_types"] = config["layer_types"][:layers]
    model = AutoModelForCausalLM.from_config(type(lm.model.config).from_dict(config))
    state = {k: v for k, v in lm.model.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


def run_hf_assisted(lm, assistant, prompt: list[int], max_new_tokens: int, gamma: int = GAMMA) -> dict:
    """transformers' assisted generation, greedy, cut after the first stop token."""
    settings = {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "heuristic_transient",
                "assistant_confidence_threshold": 0.0}
    for key, value in settings.items():  # the assistant's own generation config is what some releases read
        setattr(assistant.generation_config, key, value)
    counter = ForwardCounter(lm.model)
    try:
        start = time.perf_counter()
        with torch.inference_mode():
            out = lm.model.generate(torch.tensor([prompt], device=lm.device), max_new_tokens=max_new_tokens,
                                    do_sample=False, assistant_model=assistant, **settings)
        if lm.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        counter.handle.remove()
    ids = out[0, len(prompt):].tolist()
    for i, token in enumerate(ids):
        if token in lm.stop_ids:
            ids = ids[: i + 1]
            break
    return {"ids": ids, "seconds": seconds, "steps": counter.count}


RUNS = ("vanilla", "sps_self", "sps_copy", "hf_assisted")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions-per-subtask", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--draft-layers", type=int, default=8, help="the target's first N layers draft")
    parser.add_argument("--out", default="results/sps_vs_transformers.csv")
    args = parser.parse_args()

    cfg = compose_config(f"model={args.model}", f"model.dtype={args.dtype}", f"run.device={args.device}")
    lm = load_model(cfg.model, args.device)
    questions = select_questions(load_questions(question_file(cfg)), list(SUBTASKS), args.questions_per_subtask)
    with tempfile.TemporaryDirectory() as tmp:
        folder = truncated_copy(lm, args.draft_layers, Path(tmp))
        assistant, _ = load_companion_model(str(folder), lm)
        sps_cls, self_cls = method_class("sps"), method_class("sps-self")
        methods = {"vanilla": method_class("vanilla")(None, lm),
                   "sps_self": self_cls(self_cls.Config(draft_layers=args.draft_layers, gamma=GAMMA), lm),
                   "sps_copy": sps_cls(sps_cls.Config(draft_model=str(folder), gamma=GAMMA), lm)}

        def run(name: str, prompt: list[int], max_new_tokens: int) -> dict:
            if name == "hf_assisted":
                return run_hf_assisted(lm, assistant, prompt, max_new_tokens)
            return run_ours(lm, methods[name], prompt, max_new_tokens)

        warm = build_prompt_ids(lm.tokenizer, lm.chat_template, [], questions[0].turns[0])
        for name in RUNS:  # one untimed warm-up of every path
            run(name, warm, 8)
        rows = []
        for q in questions:
            prompt = build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0])
            runs = {name: run(name, prompt, args.max_new_tokens) for name in RUNS}
            rows.append({"subtask": q.subtask, "question_id": q.question_id, **{
                f"{name}_{key}": value for name, result in runs.items()
                for key, value in (("tokens", len(result["ids"])), ("seconds", result["seconds"]),
                                   ("steps", result["steps"]))},
                **{f"{name}_equals_vanilla": runs[name]["ids"] == runs["vanilla"]["ids"] for name in RUNS[1:]}})

    table = summarize(rows)
    print(f"model {cfg.model.name} ({lm.dtype}, {lm.device}), {len(rows)} prompts, max_new_tokens "
          f"{args.max_new_tokens}, draft: the first {args.draft_layers} layers, gamma {GAMMA} (heuristic)")
    print(markdown(table))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, data in ((out, table), (out.with_name(out.stem + "_per_prompt.csv"), rows)):
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(data[0]))
            writer.writeheader()
            writer.writerows(data)
    print(f"written: {out} and {out.with_name(out.stem + '_per_prompt.csv')}")


def summarize(rows: list[dict]) -> list[dict]:
    """Per subtask and overall: tokens/s of each run, ours over transformers', MAT, identical outputs."""
    return summarize_groups(rows, lambda g: {
        **{f"{run}_tok_s": round(g.speed(run), 2) for run in RUNS},
        "sps_self_over_hf": round(g.speed("sps_self") / g.speed("hf_assisted"), 3),
        "sps_copy_over_hf": round(g.speed("sps_copy") / g.speed("hf_assisted"), 3),
        **{f"{run}_mat": round(g.mat(run), 3) for run in RUNS[1:]},
        **{f"identical_{run}_vanilla": g.identical(f"{run}_equals_vanilla") for run in RUNS[1:]},
    })


if __name__ == "__main__":
    main()
