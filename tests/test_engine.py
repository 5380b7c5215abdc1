"""The shared engine on the real embedded model: tree forward, cache commit, verification, stop rules."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from evaluation.engine import DraftTree, Method, decode_turn
from evaluation.engine.kv_cache import cache_argument, cache_for
from evaluation.engine.loop import cut_chunk
from evaluation.engine.tree import build_tree_inputs, verify_greedy
from tests.conftest import LOSSLESS_TOKENS, ONE_PER_SUBTASK


def random_tree(rng: random.Random, size: int, vocab: int) -> DraftTree:
    parents = [0] + [rng.randrange(0, i + 1) for i in range(1, size)]
    return DraftTree([rng.randrange(vocab) for _ in range(size)], parents)


def prefill(lm, ids: list[int], extra: int):
    cache = cache_for(lm.model, len(ids) + extra)
    inputs = build_tree_inputs(ids[0], DraftTree.chain(ids[1:]), 0, lm.dtype, lm.device)
    with torch.inference_mode():
        lm.model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                 attention_mask=inputs.attention_mask, **cache_argument(lm.model, cache), use_cache=True)
    return cache


def causal_logits(lm, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return lm.model(input_ids=torch.tensor([ids], device=lm.device)).logits[0, -1]


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_logits_equal_causal_runs_and_commit_equals_recompute(lm, lossless_prompts, seed):
    rng = random.Random(seed)
    context = list(lossless_prompts.values())[seed * 5 % len(lossless_prompts)][:200]  # any set of prompts
    past, pending = context[:-1], context[-1]
    tree = random_tree(rng, 12, lm.model.config.vocab_size)
    cache = prefill(lm, past, 1 + len(tree))
    inputs = build_tree_inputs(pending, tree, cache.length, lm.dtype, lm.device)
    with torch.inference_mode():
        logits = lm.model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                          attention_mask=inputs.attention_mask, **cache_argument(lm.model, cache), use_cache=True).logits[0]
    tokens = [pending] + tree.tokens
    parents = [-1] + tree.parents

    def root_path(node):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        return path[::-1]

    for node in range(len(tokens)):
        reference = causal_logits(lm, past + [tokens[i] for i in root_path(node)])
        torch.testing.assert_close(logits[node], reference, atol=2e-4, rtol=1e-4)

    # Commit the deepest node's path, then one more step must match recomputing the whole sequence.
    deepest = int(np.argmax(inputs.depths))
    path = root_path(deepest)
    cache.commit(len(past), path)
    assert cache.length == len(past) + len(path)
    next_token = rng.randrange(lm.model.config.vocab_size)
    step = build_tree_inputs(next_token, DraftTree(), cache.length, lm.dtype, lm.device)
    with torch.inference_mode():
        after = lm.model(input_ids=step.input_ids, position_ids=step.position_ids,
                         attention_mask=step.attention_mask, **cache_argument(lm.model, cache), use_cache=True).logits[0, -1]
    torch.testing.assert_close(after, causal_logits(lm, past + [tokens[i] for i in path] + [next_token]),
                               atol=2e-4, rtol=1e-4)


def test_tree_layout_on_a_hand_made_tree():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    tree = DraftTree([11, 12, 13, 14, 15], [0, 0, 1, 1, 2])
    inputs = build_tree_inputs(10, tree, cache_length=3, dtype=torch.float32, device=torch.device("cpu"))
    assert inputs.position_ids.tolist() == [[3, 4, 4, 5, 5, 5]]
    allowed = (inputs.attention_mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 1, 0],
        [1, 1, 1, 1, 0, 1, 0, 0, 1],
    ]
    # The target predicts 11 after the root, 14 after node 1: path 0-1-4, bonus = prediction at node 4.
    logits = torch.zeros(6, 20)
    for node, token in enumerate([11, 14, 15, 0, 7, 0]):
        logits[node, token] = 1
    verdict = verify_greedy(inputs, logits)
    assert verdict.path == [0, 1, 4]
    assert verdict.accepted_tokens == [12 - 1, 14]
    assert verdict.bonus == 7


def test_a_chain_gives_the_plain_causal_mask():
    inputs = build_tree_inputs(1, DraftTree.chain([2, 3, 4]), 2, torch.float32, torch.device("cpu"))
    allowed = (inputs.attention_mask[0, 0, :, 2:] == 0)
    assert torch.equal(allowed, torch.ones(4, 4, dtype=torch.bool).tril())
    assert inputs.position_ids.tolist() == [[2, 3, 4, 5]]


def test_side_nodes_are_seen_by_nobody_in_the_tree():
    from evaluation.engine.tree import SideNodes

    tree = DraftTree([5], [0], side=SideNodes(tokens=[8, 9], offsets=[1, 2], sees=[[0, 2], [0, 2, 3]]))
    inputs = build_tree_inputs(4, tree, 1, torch.float32, torch.device("cpu"))
    allowed = (inputs.attention_mask[0, 0, :, 1:] == 0).int().tolist()
    assert allowed == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]
    assert inputs.position_ids.tolist() == [[1, 2, 2, 3]]
    assert inputs.num_tree_nodes == 2


def test_vanilla_equals_transformers_generate(lm, lossless_prompts, vanilla_reference):
    names = ["q81", "q161", "q241", "q321", "q401", "q481"]  # one prompt per subtask
    for name in [n for n in names if n in lossless_prompts] or list(lossless_prompts):  # a shorter set: its own
        prompt = lossless_prompts[name]
        with torch.inference_mode():
            generated = lm.model.generate(torch.tensor([prompt], device=lm.device), max_new_tokens=LOSSLESS_TOKENS,
                                          do_sample=False)
        expected = generated[0, len(prompt):].tolist()
        assert vanilla_reference(prompt, LOSSLESS_TOKENS) == expected, name


class OracleDrafter(Method):
    """Drafts the true continuation (from a vanilla run): everything must be accepted."""

    def __init__(self, future: list[int], prompt_length: int, depth: int):
        super().__init__(None, None)
        self.future, self.prompt_length, self.depth = future, prompt_length, depth

    @property
    def max_nodes(self):
        return self.depth + 3

    def draft(self, state):
        done = len(state.tokens) - self.prompt_length
        right = self.future[done: done + self.depth]
        # A wrong sibling first, so the right branch must win on depth, not on order.
        return DraftTree([(right[0] + 1) % 1000] + right, [0] + [0] + list(range(2, len(right) + 1))) \
            if right else DraftTree()


class GarbageDrafter(Method):
    """Random trees: nearly nothing is accepted, and the output must still equal vanilla's."""

    def __init__(self, seed: int):
        super().__init__(None, None)
        self.rng = random.Random(seed)

    @property
    def max_nodes(self):
        return 10

    def draft(self, state):
        return random_tree(self.rng, self.rng.randrange(0, 10), 49152)


def test_oracle_drafter_is_accepted_whole_and_lossless(lm, lossless_prompts, vanilla_reference):
    prompt = lossless_prompts["q241"]
    expected = vanilla_reference(prompt, LOSSLESS_TOKENS)
    result = decode_turn(lm, OracleDrafter(expected, len(prompt), depth=5), prompt, LOSSLESS_TOKENS)
    assert result.new_ids == expected
    # Every step but the budget-cut last one commits 5 drafts + the bonus.
    assert result.accept_lengths[0] == 1 and set(result.accept_lengths[1:-1]) == {6}


def test_garbage_drafter_is_lossless(lm, assert_lossless):
    # Nearly every step rejects the whole tree; 32 tokens a prompt exercise that as well as 64 would.
    assert_lossless(GarbageDrafter(seed=3), max_new_tokens=32, names=ONE_PER_SUBTASK)


def test_parts_add_up_to_the_turn_time(lm, lossless_prompts):
    result = decode_turn(lm, GarbageDrafter(seed=1), lossless_prompts["q161"], 16)
    assert abs(sum(result.seconds.values()) - result.wall_time) <= 0.02 * result.wall_time
    assert result.seconds["forward"] > 0 and result.seconds["prefill"] > 0


def test_cut_chunk_stop_rules():
    stops = frozenset({2})
    assert cut_chunk([5, 6, 2, 7, 8], stops, 10) == ([5, 6, 2], "stop_token")  # EOS mid-block: nothing after it
    assert cut_chunk([5, 6, 7], stops, 2) == ([5, 6], "max_new_tokens")
    assert cut_chunk([5, 6, 2], stops, 2) == ([5, 6], "max_new_tokens")  # the stop lies beyond the budget
    assert cut_chunk([5, 6], stops, 5) == ([5, 6], "")


def test_eos_in_the_middle_of_an_accepted_block(lm, lossless_prompts, vanilla_reference):
    """An oracle drafting past the end of the answer: the turn ends at EOS, nothing after it is kept."""
    ended = [p for p in lossless_prompts.values() if vanilla_reference(p, LOSSLESS_TOKENS)[-1] in lm.stop_ids]
    assert ended, "some lossless prompt's vanilla answer should end with EOS within the budget"
    prompt = ended[0]
    expected = vanilla_reference(prompt, LOSSLESS_TOKENS)
    future = expected + [11, 12, 13, 14, 15, 16]
    result = decode_turn(lm, OracleDrafter(future, len(prompt), depth=8), prompt, LOSSLESS_TOKENS)
    assert result.new_ids == expected
    assert result.stop_reason == "stop_token"


def test_budget_is_never_exceeded(lm, lossless_prompts, vanilla_reference):
    prompt = lossless_prompts["q321"]
    expected = vanilla_reference(prompt, 64)
    for budget in (1, 2, 7):
        result = decode_turn(lm, OracleDrafter(expected, len(prompt), depth=5), prompt, budget)
        assert result.new_ids == expected[:budget]


def test_the_cache_goes_by_the_keyword_the_forward_declares(lm):
    """transformers 5.17 takes `past_key_values=` and silently drops `cache=` (every forward would run without the
    cache); 5.24 takes `cache=`. A deprecation wrapper (functools.wraps) must not hide the real signature."""
    import functools

    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, **kwargs):
            return past_key_values

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None, **kwargs):
            return cache

    def renamed(forward):
        @functools.wraps(forward)
        def wrapper(self, *args, **kwargs):
            return forward(self, *args, **kwargs)
        return wrapper

    class Wrapped(torch.nn.Module):
        forward = renamed(New.forward)

    marker = object()
    for module, keyword in ((Old(), "past_key_values"), (New(), "cache"), (Wrapped(), "cache")):
        assert cache_argument(module, marker) == {keyword: marker}
        assert module(None, **cache_argument(module, marker)) is marker
    # The real model: a forward with the cache fills it (a dropped keyword would leave it empty).
    cache = prefill(lm, [1, 2, 3, 4], 1)
    assert cache.length == 4
