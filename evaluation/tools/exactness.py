"""The statistical proof that sampling through every method's trees keeps the target's distribution.

    python -m evaluation.tools.exactness [--samples 1000] [--out results/sampling]

A greedy run is checked token for token against vanilla; a sampled one cannot be. Here the target is a tiny random
Llama (vocabulary 16, peaked logits) small enough that the exact distribution of its first three generated tokens
is computed by enumeration (16^3 sequences). Each method then decodes the same prompt many times from different
seeds through the engine's acceptance rule, and a chi-square goodness-of-fit test compares the counts of the
three-token outcomes with the exact probabilities (outcomes expected fewer than 5 times are pooled into one cell).

The check is shown to bite: the same test on a deliberately biased rule (`verify_token_match`, accept a draft
when it equals an independent sample drawn for its row, REST's rule) rejects it on Token Recycling's trees.

The tests (`tests/test_sampling.py`) run these functions; this command writes the table the README shows.
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from evaluation.catalog import method_class
from evaluation.engine import decode_turn
from evaluation.engine.sampling import Sampler, SamplingParams, verify_token_match
from evaluation.files import write_text

VOCAB = 16
GENERATED = 3  # tokens whose joint distribution is enumerated
LOGIT_SCALE = 15.0  # peaks the random head's logits: first-token top probability about 0.4, entropy ~8 bits/3 tokens
MIN_EXPECTED = 5  # outcomes expected fewer times are pooled (the chi-square approximation needs it)
# A false alarm of one method's test at this level is rare (1 in 1000); a real bias of the kind the biased rule
# has gives p-values many orders of magnitude smaller.
ALARM = 1e-3


def tiny_target(seed: int = 1234):
    """A random 2-layer Llama over 16 tokens on the CPU, wrapped like a loaded model (no tokenizer, no stop ids)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from evaluation.models import LoadedModel

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    return LoadedModel(name="tiny-random-llama", model=model, tokenizer=None, chat_template="", stop_ids=frozenset(),
                       max_context=256, device=torch.device("cpu"), dtype=torch.float32, source="random (test)")


def model_samples(lm, start: list[int], length: int, count: int, seed: int) -> list[list[int]]:
    """`count` continuations of `start` sampled from the model at temperature 1 (vanilla, no drafts)."""
    vanilla = method_class("vanilla")(None, lm)
    sampler = Sampler(SamplingParams(temperature=1.0), seed)
    return [decode_turn(lm, vanilla, start, length, sampler=sampler).new_ids for _ in range(count)]


def greedy(lm, prompt: list[int], length: int) -> list[int]:
    return decode_turn(lm, method_class("vanilla")(None, lm), prompt, length).new_ids


def exactness_prompt(lm) -> list[int]:
    """`s + c + s`, where c is the model's greedy continuation of a prompt of that shape: copy-based methods
    (PLD, SAM, Lookahead's pool seeded from the prompt, LogitSpec's pool) then draft c after s, which the model
    finds likely, so that their trees are really exercised."""
    start = [3, 7]
    continuation = greedy(lm, start + [1, 2, 4, 5, 6, 8, 9, 10] + start, 10)
    continuation = greedy(lm, start + continuation + start, 10)
    return start + continuation + start


def exact_distribution(lm, prompt: list[int], params: SamplingParams) -> np.ndarray:
    """P(t1, t2, t3) of the first three generated tokens, [V, V, V], by enumerating every prefix."""
    process = Sampler(params).probabilities
    with torch.inference_mode():
        def rows(prefixes):
            logits = lm.model(input_ids=torch.tensor([prompt + list(p) for p in prefixes])).logits[:, -1]
            return torch.stack([process(row) for row in logits])

        first = rows([()])[0]
        second = rows([(a,) for a in range(VOCAB)])
        third = rows([(a, b) for a in range(VOCAB) for b in range(VOCAB)]).view(VOCAB, VOCAB, VOCAB)
    joint = first[:, None, None] * second[:, :, None] * third
    return joint.numpy()


def rest_on_tokens(lm, corpus: list[list[int]], config):
    """REST with a datastore of token sequences (the tiny model has no tokenizer for the ShareGPT one)."""
    from baselines.rest import Rest, Retriever
    from baselines.rest_datastore import Datastore, suffix_array

    tokens = np.asarray([t for seq in corpus for t in seq], dtype=np.int32)
    starts = np.cumsum([0] + [len(seq) for seq in corpus]).astype(np.int64)
    store = Datastore(tokens=tokens, starts=starts, sa=suffix_array(tokens), manifest={"max_token_id": VOCAB - 1},
                      folder=Path("."))
    method = Rest.__new__(Rest)
    super(Rest, method).__init__(config, lm)
    method.store, method.retriever = store, Retriever(store, method.config)
    return method


# Options a method needs on a model without a committed draft or a tokenizer.
TINY_OPTIONS = {"gumiho": {"draft": "random"}, "eagle": {"draft": "random"}, "eagle2": {"draft": "random"},
                "eagle3": {"draft": "random"}, "gumiho-serial": {"draft": "random"}, "medusa": {"heads": "random"},
                "hydra": {"heads": "random"},
                "lookahead": {"seed_pool_from_prompt": True},  # three tokens are too few to fill its window
                "rest": {"no_match_token": 1},
                "sps": {"draft_model": "self"}}  # the tiny target's first layer drafts


def _sps(lm, **options):
    cls = method_class("sps")
    return cls(cls.Config(**{**TINY_OPTIONS["sps"], **options}), lm)


# Checked besides the methods' defaults: label -> builder on the tiny target.
VARIANTS = {
    "sps,sampled_drafts=False": lambda lm: _sps(lm, sampled_drafts=False),  # argmax drafts, q = 1: exact too
    # upstream's quirk: argmax drafts verified with the draft's q as if sampled from it (biased: must be rejected)
    "sps,greedy_drafts_with_q=True": lambda lm: _sps(lm, greedy_drafts_with_q=True),
}


def build_method(name: str, lm, prompt: list[int]):
    """Method `name` with its default options (or a `VARIANTS` label), on the tiny target."""
    if name in VARIANTS:
        return VARIANTS[name](lm)
    if name == "vanilla":
        return method_class(name)(None, lm)
    cls = method_class(name)
    if name == "rest":
        return rest_on_tokens(lm, model_samples(lm, prompt[-3:], 8, 40, seed=7), cls.Config(**TINY_OPTIONS[name]))
    return cls(cls.Config(**TINY_OPTIONS.get(name, {})), lm)


@dataclass
class FitResult:
    method: str
    rule: str
    temperature: float
    top_p: float
    top_k: int
    samples: int
    cells: int
    chi2: float
    p_value: float
    mat: float  # mean committed tokens per decode step: how much the trees were used
    seconds: float

    def row(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def goodness_of_fit(counts: np.ndarray, probabilities: np.ndarray) -> tuple[float, int, float]:
    """Pearson's chi-square of `counts` against `probabilities` (same shape), rare outcomes pooled.
    Returns (statistic, cells, p-value)."""
    from scipy import stats

    n = counts.sum()
    expected = (probabilities * n).ravel()
    observed = counts.ravel().astype(float)
    keep = expected >= MIN_EXPECTED
    observed = np.append(observed[keep], observed[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
    if expected[-1] < MIN_EXPECTED:  # the pooled cell itself too small: merge it into the smallest kept cell
        smallest = int(np.argmin(expected[:-1]))
        observed[smallest] += observed[-1]
        expected[smallest] += expected[-1]
        observed, expected = observed[:-1], expected[:-1]
    result = stats.chisquare(observed, expected * observed.sum() / expected.sum())
    return float(result.statistic), len(expected), float(result.pvalue)


@contextmanager
def acceptance_rule(rule: str):
    """Run the engine with another acceptance rule: "exact" (the engine's) or "token_match" (biased)."""
    import evaluation.engine.loop as loop

    original = loop.verify_sampled
    if rule == "token_match":
        loop.verify_sampled = verify_token_match
    elif rule != "exact":
        raise ValueError(f"unknown rule {rule!r}")
    try:
        yield
    finally:
        loop.verify_sampled = original


def check_method(name: str, lm, prompt: list[int], params: SamplingParams, samples: int,
                 rule: str = "exact", exact: np.ndarray | None = None) -> FitResult:
    """Decode `prompt` `samples` times (seeds 0..samples-1) with method `name` and test the three-token outcomes
    against the enumerated distribution."""
    if exact is None:
        exact = exact_distribution(lm, prompt, params)
    method = build_method(name, lm, prompt)
    sampler = Sampler(params)
    counts = np.zeros((VOCAB,) * GENERATED)
    committed = steps = 0
    started = time.perf_counter()
    with acceptance_rule(rule):
        for seed in range(samples):
            sampler.reseed(seed)
            result = decode_turn(lm, method, prompt, GENERATED, sampler=sampler)
            counts[tuple(result.new_ids)] += 1
            committed += sum(result.accept_lengths[1:])
            steps += len(result.accept_lengths) - 1
    seconds = time.perf_counter() - started
    chi2, cells, p_value = goodness_of_fit(counts, exact)
    return FitResult(name, rule, params.temperature, params.top_p, params.top_k, samples, cells, chi2, p_value,
                     committed / max(steps, 1), seconds)


def main(argv: list[str] | None = None) -> None:
    import pandas as pd

    from evaluation.catalog import available_methods

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--out", default="results/sampling")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lm = tiny_target()
    prompt = exactness_prompt(lm)
    results = []
    settings = [(SamplingParams(temperature=1.0), "exact", available_methods()),
                (SamplingParams(temperature=0.7, top_p=0.9, top_k=8), "exact", ["recycling", "gumiho"]),
                (SamplingParams(temperature=1.0), "exact", list(VARIANTS)),
                (SamplingParams(temperature=1.0), "token_match", ["recycling"])]
    for params, rule, names in settings:
        exact = exact_distribution(lm, prompt, params)
        for name in names:
            result = check_method(name, lm, prompt, params, args.samples, rule, exact)
            print(f"{name:10s} {rule:11s} T={params.temperature} top_p={params.top_p} top_k={params.top_k}: "
                  f"chi2 {result.chi2:.1f} over {result.cells} cells, p = {result.p_value:.3g}, "
                  f"MAT {result.mat:.2f}", flush=True)
            results.append(result.row())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "exactness.csv", pd.DataFrame(results).to_csv(index=False))
    print(f"Written: {out / 'exactness.csv'}")


if __name__ == "__main__":
    from evaluation.versions import require_supported_environment

    require_supported_environment()
    main()
