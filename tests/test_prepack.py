"""Prepacked linear layers on the CPU (`model.cpu_prepack`) and bfloat16 as a first-class setting: the packed
forward equals the plain one within float32 rounding, the switch off is today's plain model, and bfloat16's
tree forward equals its causal forward within bfloat16 rounding. Every method's lossless test runs on the
prepacked model, which is the `lm` fixture's default."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from evaluation.engine.budget.latency import calibration_key
from evaluation.engine.device import native_bfloat16
from evaluation.engine.kv_cache import cache_argument
from evaluation.engine.prepack import PrepackedLinear, prepack_linears
from evaluation.engine.tree import DraftTree, build_tree_inputs
from evaluation.models import load_model, resolve_dtype
from tests.conftest import TEST_DEVICE, compose_config
from tests.test_engine import causal_logits, prefill, random_tree

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu" or not torch.backends.mkldnn.is_available(),
                                reason="prepacking is for the CPU, with oneDNN")


def load(dtype: str, prepack: bool):
    cfg = compose_config("model=smollm2-135m", f"model.dtype={dtype}", f"model.cpu_prepack={prepack}")
    return load_model(cfg.model, "cpu")


@pytest.fixture(scope="module")
def plain():
    return load("float32", False)


def tree_logits(lm, past: list[int], pending: int, tree) -> torch.Tensor:
    cache = prefill(lm, past, 1 + len(tree))
    inputs = build_tree_inputs(pending, tree, cache.length, lm.dtype, lm.device)
    with torch.inference_mode():
        return lm.model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                        attention_mask=inputs.attention_mask, **cache_argument(lm.model, cache),
                        use_cache=True).logits[0]


def test_the_default_model_is_prepacked_and_the_switch_off_is_the_plain_model(lm, plain):
    assert lm.prepacked and any(isinstance(m, PrepackedLinear) for m in lm.model.modules())
    assert not plain.prepacked
    linears = [m for m in plain.model.modules() if isinstance(m, (nn.Linear, PrepackedLinear))]
    assert linears and all(type(m) is nn.Linear for m in linears)
    # the tied head still shares the embedding's weight, and the latency curve cached for one is not the other's
    assert lm.model.get_output_embeddings().weight is lm.model.get_input_embeddings().weight
    assert calibration_key(lm) != calibration_key(plain)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_prepacked_logits_equal_the_plain_ones_within_float32_rounding(lm, plain, lossless_prompts, shape):
    context = list(lossless_prompts.values())[3][:150]
    past, pending = context[:-1], context[-1]
    rng = random.Random(7)
    vocab = lm.model.config.vocab_size
    for k in (1, 2, 3, 4, 8, 16, 32, 64):
        drafts = [rng.randrange(vocab) for _ in range(k - 1)]
        tree = DraftTree() if k == 1 else random_tree(rng, k - 1, vocab) if shape == "tree" else DraftTree.chain(drafts)
        ours, reference = tree_logits(lm, past, pending, tree), tree_logits(plain, past, pending, tree)
        # Logits of magnitude ~20 after 30 layers: float32 rounding in another summation order is ~1e-4 here; a
        # wrong layout or a stale packed copy gives differences of order 1 to 10.
        torch.testing.assert_close(ours, reference, atol=1e-3, rtol=1e-5)
        assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_the_packed_layer_falls_back_where_the_plain_path_is_needed():
    torch.manual_seed(0)
    linear = nn.Linear(64, 96)
    holder = nn.Sequential(linear)
    assert prepack_linears(holder) == 1
    packed = holder[0]
    x = torch.randn(2, 5, 64)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), atol=1e-5, rtol=1e-5)
        one_row = torch.randn(1, 1, 64)
        assert torch.equal(packed(one_row), F.linear(one_row, linear.weight, linear.bias))  # the plain path itself
    # autograd (the packed op has none) takes the plain path: a draft trained through a shared head still learns
    x = torch.randn(8, 64, requires_grad=True)
    packed(x).sum().backward()
    assert x.grad is not None and linear.weight.grad is not None


def test_fast_dtype_follows_the_processor():
    assert resolve_dtype("fast", torch.device("cpu")) == (torch.bfloat16 if native_bfloat16() else torch.float32)
    assert resolve_dtype("fast", torch.device("cuda")) == torch.float16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


def test_bfloat16_tree_logits_equal_its_causal_runs_within_bfloat16_rounding(lossless_prompts):
    from evaluation.engine.prepack import can_prepack

    if not can_prepack(torch.bfloat16):  # the model keeps plain layers (tests/test_half_precision.py checks both)
        pytest.skip("oneDNN has no bfloat16 path on this CPU (AVX2 only): no prepacked bfloat16 model to check")
    bf16 = load("bfloat16", True)
    assert bf16.prepacked and bf16.dtype == torch.bfloat16
    rng = random.Random(3)
    context = list(lossless_prompts.values())[5][:120]
    past, pending = context[:-1], context[-1]
    tree = random_tree(rng, 15, bf16.model.config.vocab_size)
    logits = tree_logits(bf16, past, pending, tree)
    tokens, parents = [pending] + tree.tokens, [-1] + tree.parents
    for node in range(len(tokens)):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        reference = causal_logits(bf16, past + [tokens[i] for i in path[::-1]])
        # bfloat16 keeps 8 bits of mantissa: logits of ~20 move by ~0.1-0.3 with the summation order
        torch.testing.assert_close(logits[node].float(), reference.float(), atol=0.5, rtol=0.02)


def test_a_bfloat16_run_records_margins_and_the_report_gives_match_rate_and_margins(tmp_path):
    import json

    from evaluation.report.load import load_runs, lossless_table
    from evaluation.report.markdown import build
    from evaluation.run import orchestrate
    from tests.test_runner import QUESTIONS, write_questions

    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[1:])
    for method in ("vanilla", "pld"):
        orchestrate.run(compose_config(
            f"bench.question_file={qfile}", "bench.max_new_tokens=12", "bench.warmup=0", f"method={method}",
            f"run.results_dir={tmp_path / 'runs'}", "run.progress=false", "model.dtype=bfloat16", "run.device=cpu"))
    answers = {}
    for path in (tmp_path / "runs").glob("**/answers.jsonl"):
        method = json.loads((path.parent / "manifest.json").read_text())["method"]
        answers[method] = (path, [json.loads(line) for line in path.read_text().splitlines()])
    for _, records in answers.values():
        for record in records:
            choice = record["choices"][0]
            assert [len(m) for m in choice["margins"]] == choice["new_tokens"]
            assert all(m >= 0 for turn in choice["margins"] for m in turn)
    # Make PLD's answer to question 2 differ at token 3, as a near-tie flip would: the report says where, and how
    # near a tie each side was there, under a match-rate column rather than a lossless one.
    path, records = answers["pld"]
    records[0]["choices"][0]["token_ids"][0][3] += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    _, markdown = build(tmp_path / "runs", tmp_path / "report")
    lossless = lossless_table(load_runs(tmp_path / "runs"))
    row = lossless[~lossless.equal].iloc[0]
    vanilla = next(r for r in answers["vanilla"][1] if r["question_id"] == records[0]["question_id"])
    assert row.first_diff_position == 3 and row.vanilla_margin == vanilla["choices"][0]["margins"][0][3]
    assert row.method_margin == records[0]["choices"][0]["margins"][0][3]
    assert "matches vanilla (reduced precision)" in markdown and "top-2 margin there: vanilla" in markdown
