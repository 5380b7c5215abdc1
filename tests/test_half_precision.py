"""bfloat16 on the CPU: the half-precision code paths a GPU runs, exercised before a GPU is there.

In float32 a tree forward equals causal runs to 1e-4 and every method equals vanilla token for token (the lossless
tests). bfloat16 keeps 8 significant bits, so a tree forward and a causal forward round differently: their logits
agree only to a bfloat16 tolerance, and a method may leave vanilla's path where the top two logits nearly tie.
These tests bound the first (measured, see the constants) and require the second to be the only way a lossless
method's bfloat16 answer differs from bfloat16 vanilla's (`evaluation.tools.half_precision`).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from evaluation.catalog import method_class
from evaluation.engine import DraftTree, decode_turn
from evaluation.engine.loop import _forward
from evaluation.engine.tree import ancestor_matrix, build_tree_inputs
from evaluation.tools.half_precision import (NEAR_TIE_GAP, as_table, beyond_rounding, compare_methods,
                                       first_difference_margins, method_configs)
from tests.conftest import compose_config
from tests.test_engine import causal_logits, prefill, random_tree

# |tree forward - causal forward| over every logit of every node, measured on 364 nodes (7 prompts x 4 seeds x 13
# nodes): up to 0.875 (median 0.375) with logits up to 38, i.e. 2.3% of the largest logit, a quarter of their
# standard deviation. Float32 gives 7e-5 on the same nodes; bfloat16's 16 fewer significant bits would scale that to
# 7e-5 * 2**16 = 4.6 at worst, so 0.875 is plain rounding. 1.5 leaves room for other contexts.
TREE_LOGIT_ATOL = 1.5
BF16_PROMPTS = ("q81-turn2", "q161", "q241", "q401")
BF16_TOKENS = 32


@pytest.fixture(scope="module")
def lm_bf16():
    """The embedded model in bfloat16, through the same loader as the float32 fixture."""
    from evaluation.models import load_model

    return load_model(compose_config("model=smollm2-135m", "model.dtype=bfloat16", "run.device=cpu").model, "cpu")


def test_bf16_is_prepacked_exactly_where_onednn_has_a_bf16_path(lm_bf16):
    """On a CPU without oneDNN's bfloat16 path (AVX2 only) packing would fail at load: the model keeps the plain
    layers there, and says so; where the path exists it is packed."""
    from evaluation.engine.prepack import PrepackedLinear, can_prepack

    supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert can_prepack(torch.bfloat16) == supported and can_prepack(torch.float32)
    assert lm_bf16.prepacked == supported
    assert any(isinstance(m, PrepackedLinear) for m in lm_bf16.model.modules()) == supported


def engine_forward(lm, inputs, cache) -> torch.Tensor:
    """The decode loop's own forward of laid-out tree inputs on the cache: logits [nodes, vocab]."""
    with torch.inference_mode():
        return _forward(lm.model, inputs.input_ids, inputs.position_ids, inputs.attention_mask, cache, 0, False)[0]


def assert_within_rounding(logits: torch.Tensor, causal: torch.Tensor) -> None:
    """Logits [nodes, vocab] within `TREE_LOGIT_ATOL` of the causal ones, with the same argmax except where the
    causal top two nearly tie."""
    logits, causal = logits.float(), causal.float()
    error = (logits - causal).abs().max().item()
    print(f"bf16 against causal: max |diff| {error:.3f}, {error / causal.abs().max().item():.1%} of the largest "
          f"logit, {error / causal.std().item():.2f} standard deviations of the logits")
    assert error <= TREE_LOGIT_ATOL
    top2 = causal.topk(2).values
    clear = (top2[:, 0] - top2[:, 1]) > NEAR_TIE_GAP
    assert torch.equal(logits.argmax(-1)[clear], causal.argmax(-1)[clear])


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_tree_logits_equal_causal_runs_and_commit_equals_recompute(lm_bf16, lossless_prompts, seed):
    """tests/test_engine.py's float32 check, in bfloat16 against bfloat16 causal runs."""
    lm, rng = lm_bf16, random.Random(seed)
    context = list(lossless_prompts.values())[seed * 5][:200]
    past, pending = context[:-1], context[-1]
    tree = random_tree(rng, 12, lm.model.config.vocab_size)
    cache = prefill(lm, past, 1 + len(tree))
    inputs = build_tree_inputs(pending, tree, cache.length, lm.dtype, lm.device)
    logits = engine_forward(lm, inputs, cache)
    paths = [np.flatnonzero(row).tolist() for row in ancestor_matrix(inputs.parents)]  # root path of each node
    assert_within_rounding(logits, torch.stack([causal_logits(lm, past + inputs.tokens[p].tolist()) for p in paths]))

    # Commit the deepest node's path, then one more step must match recomputing the whole sequence.
    path = paths[int(np.argmax(inputs.depths))]
    cache.commit(len(past), path)
    next_token = rng.randrange(lm.model.config.vocab_size)
    after = engine_forward(lm, build_tree_inputs(next_token, DraftTree(), cache.length, lm.dtype, lm.device), cache)
    assert_within_rounding(after, causal_logits(lm, past + inputs.tokens[path].tolist() + [next_token])[None])


@pytest.fixture(scope="module")
def bf16_comparison(lm_bf16, lossless_prompts):
    """Every method config against vanilla, both in bfloat16, on a few prompts (REST on a 300-conversation
    datastore, as tests/test_rest.py: the full one takes minutes to build). Only where bfloat16 is native (a GPU,
    or a CPU with AVX512-BF16 or AMX): emulated on an AVX2-only CPU, the dozen methods take over a quarter of an
    hour, and no run there takes bfloat16 for speed (`model.dtype=fast` stays float32)."""
    from evaluation.engine.device import native_bfloat16

    if lm_bf16.device.type == "cpu" and not native_bfloat16():
        pytest.skip("bfloat16 is emulated on this CPU (no AVX512-BF16 or AMX): every method in bfloat16 runs where "
                    "it is native")
    prompts = {name: lossless_prompts[name] for name in BF16_PROMPTS}
    return compare_methods(lm_bf16, prompts, BF16_TOKENS, method_configs(),
                           options={"rest": {"max_conversations": 300}})


def test_every_method_in_bf16_differs_from_bf16_vanilla_only_at_near_ties(bf16_comparison):
    table = bf16_comparison
    print(table.groupby("method", sort=False).equal.mean().rename("bf16 match rate").to_string())
    assert set(table.method) == set(method_configs()) - {"vanilla"}
    wrong = beyond_rounding(table)
    assert wrong.empty, f"bf16 answers differ from bf16 vanilla's beyond a near tie:\n{wrong.to_string()}"


def test_the_check_flags_a_token_the_target_did_not_prefer(lm_bf16, lossless_prompts):
    """A wrong rule's output, vanilla's answer with one token replaced, must fail the check above: a token far down
    the target's ranking, and even the runner-up where the target was far from a tie."""
    lm, prompt = lm_bf16, lossless_prompts["q241"]
    vanilla = decode_turn(lm, method_class("vanilla")(None, lm), prompt, 16).new_ids
    with torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([prompt + vanilla])).logits[0, len(prompt) - 1: -1].float()
    ranked = logits.argsort(-1, descending=True)
    top2 = logits.topk(2).values
    clear = int((top2[:, 0] - top2[:, 1]).argmax())  # the position farthest from a tie
    rows = [{"method": "vanilla itself", "lossless_by_design": True,
             **first_difference_margins(lm, prompt, vanilla, list(vanilla))}]
    for name, position, token in (("rank 1000", 5, int(ranked[5, 1000])), ("runner-up", clear, int(ranked[clear, 1]))):
        wrong = vanilla[:position] + [token] + vanilla[position + 1:]
        row = first_difference_margins(lm, prompt, vanilla, wrong)
        assert (row["position"], row["method_token"], row["vanilla_token"]) == (position, token, vanilla[position])
        rows.append({"method": name, "lossless_by_design": True, **row})
    table = as_table(rows)
    print(table.drop(columns=["prompt", "new_tokens", "seconds"]).to_string())
    assert beyond_rounding(table).method.tolist() == ["rank 1000", "runner-up"]
    assert table.causal_argmax_is_vanilla.iloc[-1]  # at the clearest position vanilla took the causal top token
