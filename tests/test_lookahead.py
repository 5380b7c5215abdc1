"""Lookahead: the window layout, warm-up and shift, the pool on hand-made cases, and losslessness."""

from __future__ import annotations

import random

import pytest
import torch

from baselines.lookahead import Lookahead, NgramPool, advance_window, harvest, window_layout
from evaluation.engine import decode_turn
from evaluation.engine.errors import OptionError
from evaluation.engine.method import DecodeState, StepOutcome
from tests.conftest import THREE


def test_window_columns_are_contiguous_trajectories():
    # Steady state for N = 5, W = 7: level 0 has 6 tokens, levels 1..3 have 7.
    levels = [list(range(100, 106))] + [list(range(200 + 10 * l, 207 + 10 * l)) for l in range(3)]
    first = 3  # as if two guess nodes came before
    side = window_layout(levels, first)
    offsets = {0: 0, 1: 1, 2: 2}  # node 0 and the two guess nodes (unused: nobody in the window sees them)
    offsets.update({first + i: o for i, o in enumerate(side.offsets)})
    for j, seen in enumerate(side.sees):
        node = first + j
        assert node in seen and 0 in seen and not {1, 2} & set(seen)
        # A node sees exactly one token at every position from the pending token's up to its own.
        assert sorted(offsets[s] for s in seen) == list(range(offsets[node] + 1))
    # levels[2][3] sits at offset 2 + 3 and sees u, levels[0][0..2], levels[1][3], levels[2][3].
    node = first + 6 + 7 + 3
    assert side.tokens[node - first] == 213 and side.offsets[node - first] == 5
    assert side.sees[node - first] == [0, first, first + 1, first + 2, first + 6 + 3, node]


def test_warm_up_then_steady_shift():
    n, w = 5, 7
    levels = [list(range(w + n - 3))]  # 9 random prompt tokens
    sizes = []
    for step in range(5):
        sizes.append([len(level) for level in levels])
        win = [1000 * (step + 1) + j for j in range(len(levels[-1]))]
        levels = advance_window(levels, win, n - 1)
    assert sizes == [[9], [8, 9], [7, 8, 8], [6, 7, 7, 7], [6, 7, 7, 7]]
    # Steady: levels move up, level 0 drops the old level 1's first token, and win becomes the last level.
    before = [[1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]
    assert advance_window(before, [40, 41, 42, 43], 4) == [[11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33],
                                                           [40, 41, 42, 43]]


def test_harvest_and_pool_order():
    pool = NgramPool(capacity=2)
    levels = [[1, 2], [10, 11, 12], [20, 21, 22], [30, 31, 32]]
    harvest(pool, 7, levels, [40, 41, 42])
    # Column j: key at position p+j (u, then levels[0][j-1]), followers levels[1..3][j] and win[j].
    assert pool.entries == {7: [(10, 20, 30, 40)], 1: [(11, 21, 31, 41)], 2: [(12, 22, 32, 42)]}
    pool.insert(7, (5, 5, 5, 5))
    pool.insert(7, (10, 20, 30, 40))  # seen again: moves to the end
    assert pool.get(7) == [(5, 5, 5, 5), (10, 20, 30, 40)]
    pool.insert(7, (6, 6, 6, 6))  # full: the oldest goes
    assert pool.get(7) == [(10, 20, 30, 40), (6, 6, 6, 6)]


def fake_step(method: Lookahead, tokens: list[int], rng: random.Random):
    """One draft + update with random side logits; returns the drafted tree."""
    state = DecodeState(list(tokens), 1, torch.zeros(50), 100)
    tree = method.draft(state)
    assert len(tree) + len(tree.side.tokens) <= method.max_nodes
    side_logits = torch.rand(len(tree.side.tokens), 50, generator=torch.Generator().manual_seed(rng.randrange(99)))
    method.update(state, StepOutcome([tokens[-1]], None, torch.zeros(1 + len(tree), 50), side_logits, None))
    return tree


def test_guesses_come_from_the_pool_and_the_bonus_switch():
    rng = random.Random(0)
    for bonus, length in ((True, 4), (False, 3)):
        method = Lookahead(Lookahead.Config(full_match_bonus=bonus), None)
        method.reset([3, 4, 5, 6, 7])
        # Upstream's window init: random.seed(10), then W+N-3 draws from the prompt.
        random.seed(10)
        assert method.levels == [[random.choice([3, 4, 5, 6, 7]) for _ in range(9)]]
        for _ in range(4):  # warm-up: no pool yet
            assert len(fake_step(method, [3, 4, 5, 6, 7], rng)) == 0
        method.pool = NgramPool(method.config.guess)  # drop what the random steps harvested
        method.pool.insert(7, (1, 2, 3, 4))
        method.pool.insert(7, (1, 2, 3, 9))
        tree = fake_step(method, [3, 4, 5, 6, 7], rng)
        expected = [[1, 2, 3, 4], [1, 2, 3, 9]] if bonus else [[1, 2, 3]]  # cut tuples that became equal: once
        assert tree.tokens == [t for g in expected for t in g]
        assert all(len(g) == length for g in expected)


def test_prompt_seeds_the_pool_on_request():
    prompt = [1, 2, 3, 4, 5, 1, 6, 7, 8, 9]
    method = Lookahead(Lookahead.Config(seed_pool_from_prompt=True), None)
    method.reset(prompt)
    assert method.pool.get(1) == [(2, 3, 4, 5), (6, 7, 8, 9)]
    method = Lookahead(Lookahead.Config(), None)
    method.reset(prompt)
    assert method.pool.entries == {}


def test_lookahead_default_is_lossless(lm, assert_lossless):
    results = assert_lossless(Lookahead(Lookahead.Config(), lm))
    tokens = sum(len(r.new_ids) for r in results.values())
    assert tokens / sum(r.steps for r in results.values()) > 1.0


def test_lookahead_without_full_match_bonus_is_lossless(lm, assert_lossless):
    results = assert_lossless(Lookahead(Lookahead.Config(full_match_bonus=False), lm), names=THREE)
    assert max(max(r.accept_lengths) for r in results.values()) <= 4  # never more than N-1 tokens per step


@pytest.mark.parametrize("first_step,pending_at,first_window", [("prompt_end", -1, 9), ("after_prefill", 0, 9)])
def test_first_window_step(lm, lossless_prompts, first_step, pending_at, first_window):
    """prompt_end feeds the first window below the last prompt token, as upstream's prefill does; after_prefill below
    the first generated token. Either way the warm-up then takes the window sizes 9, 17, 23, 27."""
    prompt = lossless_prompts["q81"]
    method = Lookahead(Lookahead.Config(first_step=first_step), lm)
    fed = []  # (position of the pending token relative to the prompt's end, window nodes) per step
    draft = method.draft

    def recording_draft(state):
        tree = draft(state)
        fed.append((len(state.tokens) - len(prompt) - 1, len(tree.side.tokens)))
        return tree

    method.draft = recording_draft
    result = decode_turn(lm, method, prompt, 8)
    assert [position for position, _ in fed[:4]] == [pending_at + i for i in range(4)]  # nothing accepted yet
    assert [nodes for _, nodes in fed[:4]] == [first_window, 17, 23, 27]
    assert result.accept_lengths[0] == (0 if first_step == "prompt_end" else 1)  # the prefill commits nothing


def test_after_prefill_is_lossless(lm, assert_lossless):
    assert_lossless(Lookahead(Lookahead.Config(first_step="after_prefill"), lm), names=THREE)


def test_check_rejects_bad_first_step():
    with pytest.raises(OptionError, match="first_step"):
        Lookahead.Config(first_step="prefill").check()
