"""LogitSpec: the n-gram pool, the draft tree layout, and lossless decoding on the real embedded model."""

from __future__ import annotations

import random

import pytest
import torch

from evaluation.engine import DecodeState
from logitspec.method import LogitSpec
from logitspec.pool import Pool
from tests.conftest import ONE_PER_SUBTASK


# ---------------------------------------------------------------------------------------------------------------
# Pool


def test_pool_longest_ngram_first():
    pool = Pool(max_ngram_size=3, num_pred_tokens=2)
    pool.build([1, 2, 3, 9, 8, 2, 3, 7, 6, 4, 3, 5, 5])
    assert pool.lookup([1, 2, 3]) == [9, 8]  # trigram, although (2, 3) alone would give [7, 6]
    assert pool.lookup([0, 2, 3]) == [7, 6]  # bigram, although (3,) alone would give [5, 5]
    assert pool.lookup([0, 0, 3]) == [5, 5]  # unigram
    assert pool.lookup([0, 0, 42]) == []


def test_pool_recency_and_cap():
    pool = Pool(max_ngram_size=1, num_pred_tokens=2)
    pool.build([1, 5, 6, 1, 7, 8, 0])
    assert pool.lookup([1]) == [7, 8]  # both occurrences have K tokens after them: the latest wins
    pool.build([1, 5, 6, 1, 7])
    assert pool.lookup([1]) == [5, 6]  # the latest has only 1 token after it: the longer one wins
    pool = Pool(max_ngram_size=2, num_pred_tokens=3)
    pool.build(list(range(10)))
    assert pool.lookup([0]) == [1, 2, 3]  # capped at K
    assert pool.lookup([7, 8]) == [9]  # shorter near the end
    assert pool.lookup([9]) == []  # the last token has no continuation
    assert pool.lookup([5], extra=6) == [7, 8, 9]  # ctx + [t] without copying


def _tables_equal(a: Pool, b: Pool) -> bool:
    return a.tables == b.tables


@pytest.mark.parametrize("seed", range(5))
def test_incremental_update_equals_rebuild(seed):
    rng = random.Random(seed)
    upstream_misses = 0
    for _ in range(40):
        n, k = rng.randint(1, 4), rng.randint(1, 8)
        start = [rng.randrange(5) for _ in range(rng.randint(0, 30))]
        exact, upstream = Pool(n, k), Pool(n, k, upstream_update_window=True)
        exact.build(start)
        upstream.build(start)
        for _ in range(15):
            accepted = [rng.randrange(5) for _ in range(rng.randint(1, 3 * k))]  # long accepts (> K) included
            exact.extend(accepted)
            upstream.extend(accepted)
            rebuilt = Pool(n, k)
            rebuilt.build(exact.seq)
            assert _tables_equal(exact, rebuilt)
            upstream_misses += not _tables_equal(upstream, rebuilt)
    assert upstream_misses > 0  # the upstream window really differs, so the switch matters


def test_upstream_window_misses_a_refresh_after_a_long_accept():
    # N = 1, K = 2: (1,) starts with the truncated continuation [2]; an accept of 6 tokens (>= K - l + 2 = 3)
    # moves the end past the 2K = 4 rescanned positions, so upstream never refreshes it to [2, 3].
    exact, upstream = Pool(1, 2), Pool(1, 2, upstream_update_window=True)
    for pool in (exact, upstream):
        pool.build([1, 2])
        assert pool.lookup([1]) == [2]
        pool.extend([3, 4, 5, 6, 7, 8])
    assert exact.lookup([1]) == [2, 3]
    assert upstream.lookup([1]) == [2]  # still valid, just shorter than it could be


# ---------------------------------------------------------------------------------------------------------------
# Draft tree layout

PROMPT = [1, 2, 3, 4, 5, 6, 7, 40, 41, 42, 43, 44, 45, 50, 51, 52, 60, 61, 62, 63, 1, 2]
ROOT = 3  # pending token: (1, 2, 3) is in the pool -> continuation [4, 5, 6, 7, 40]
VOCAB = 200


def _state(order: list[int], tokens: list[int] = PROMPT + [ROOT]) -> DecodeState:
    """Logits whose ranking starts with `order` (rank 0 first); every other token ranks below."""
    rest = [t for t in range(VOCAB) if t not in order]
    logits = torch.empty(VOCAB)
    logits[torch.tensor(order + rest)] = -torch.arange(VOCAB, dtype=torch.float32)
    return DecodeState(list(tokens), len(tokens) - 1, logits, 64)


FILLER = list(range(100, 200))  # tokens absent from the prompt: single-token branches
# rank: 0 = root, 1 = 40, 2 = 50, 3..8 filler, 9 = 60, 10..32 filler, 33 = 41, then filler
ORDER = [ROOT, 40, 50] + FILLER[:6] + [60] + FILLER[6:29] + [41] + FILLER[29:60]


def _method(**options) -> LogitSpec:
    method = LogitSpec(LogitSpec.Config(num_pred_tokens=5, **options), None)
    method.reset(PROMPT)
    return method


def _branches(tree) -> list[list[int]]:
    branches = []
    for token, parent in zip(tree.tokens, tree.parents):
        if parent == 0:
            branches.append([])
        branches[-1].append(token)
    return branches


def test_draft_branch_order_and_rank_lengths():
    method = _method()
    tree = method.draft(_state(ORDER))
    branches = _branches(tree)
    assert branches[0] == [4, 5, 6, 7, 40]  # root continuation first, K tokens
    assert branches[1] == [40, 41, 42, 43]  # rank 1: 4 tokens (candidate included)
    assert branches[2] == [50, 51, 52, 60]  # rank 2
    assert branches[3:9] == [[t] for t in FILLER[:6]]  # ranks 3..8: lookups fail -> just [t]
    assert branches[9] == [60, 61, 62]  # rank 9: 3 tokens
    assert branches[33] == [41]  # rank 33: 1 token although the pool has more
    assert len(tree) == method.max_nodes == 63  # filled up to the capacity, root excluded
    assert all(p == 0 or p == i for i, p in enumerate(tree.parents))  # chains hang off the root


def test_draft_capacity_cut():
    tree = _method(draft_tree_capacity=12).draft(_state(ORDER))
    assert tree.tokens == [4, 5, 6, 7, 40, 40, 41, 42, 43, 50, 51]  # third branch cut to the 2 nodes left
    assert tree.parents == [0, 1, 2, 3, 4, 0, 6, 7, 8, 0, 10]
    tiny = _method(draft_tree_capacity=3).draft(_state(ORDER))
    assert tiny.tokens == [4, 5]  # even the root continuation respects the capacity


def test_draft_without_next_next_is_the_root_branch_only():
    tree = _method(next_next=False).draft(_state(ORDER))
    assert tree.tokens == [4, 5, 6, 7, 40]
    assert tree.parents == [0, 1, 2, 3, 4]


def test_draft_custom_schedule_and_next_next_trigram():
    # K = 2: (50,) alone would give its latest full continuation [51, 2]; the trigram (2, 3, 50) of ctx + [t] wins.
    method = LogitSpec(LogitSpec.Config(num_pred_tokens=2, branch_lengths=[2, 1], rank_thresholds=[1]), None)
    prompt = [2, 3, 50, 77, 78, 9, 50, 51, 2]
    method.reset(prompt)
    tree = method.draft(_state([ROOT, 50, 9], prompt + [ROOT]))
    assert _branches(tree)[:3] == [[50, 77], [50, 77], [9]]  # root branch; rank 1: 2 tokens; rank 2: 1 token
    # What the draft budget learns from: the root branch's source is its match length (the bigram (2, ROOT)), a
    # candidate is source 5 and its continuation 5 + its match length (the trigram); scores are the candidates'
    # probabilities, none for the root branch.
    assert tree.sources[:5] == [2, 2, 5, 8, 5]
    assert tree.scores[:2] == [None, None] and tree.scores[2] == tree.scores[3] > tree.scores[4] > 0


# ---------------------------------------------------------------------------------------------------------------
# Lossless decoding on the real model


def _mat(results: dict, names: list[str]) -> float:
    lengths = [n for name in names for n in results[name].accept_lengths]
    return sum(lengths) / len(lengths)


@pytest.mark.parametrize("options", [{}, {"next_next": False}, {"draft_tree_capacity": 8}],
                         ids=["default", "no-next-next", "capacity-8"])
def test_lossless(lm, assert_lossless, options):
    method = LogitSpec(LogitSpec.Config(**options), lm)
    # The default on every lossless prompt; the variants, which share its code, on one prompt per subtask.
    results = assert_lossless(method, names=None if not options else ONE_PER_SUBTASK)
    mat = _mat(results, [name for name in ("q241", "q242") if name in results])  # summarization
    print(f"\nLogitSpec {options or 'default'}: summarization MAT {mat:.2f}, all prompts "
          f"{_mat(results, list(results)):.2f}")
    assert mat > 1.3
