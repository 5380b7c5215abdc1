"""PLD: the n-gram matcher on hand-made sequences (against a plain rescan of the spec's rule), and losslessness."""

from __future__ import annotations

import random

import pytest
import torch

from baselines.pld import PLD, NgramIndex
from evaluation.engine.method import DecodeState
from evaluation.engine.errors import OptionError
from tests.conftest import THREE


def spec_lookup(x: list[int], max_n: int, k: int, full: bool, order: str = "earliest") -> list[int]:
    """The rule of docs/methods/pld.md written as the upstream rescan (and its truncated-continuation variant)."""
    length = len(x)
    for n in range(max_n, 0, -1):
        g = x[-n:]
        matches = [p for p in range(length - n + 1) if x[p:p + n] == g]
        if full:
            usable = [p for p in matches if p + n + k <= length and p + n < length - n]
        else:
            usable = [p for p in matches if p + n < length]
        if usable:
            p = usable[0] if order == "earliest" else usable[-1]
            return x[p + n: p + n + k]
    return []


def draft(tokens: list[int], **options) -> list[int]:
    pld = PLD(PLD.Config(**options), None)
    pld.reset(tokens[:1])
    state = DecodeState(list(tokens), 1, torch.zeros(1), 100)
    return pld.draft(state).tokens


def test_longest_ngram_first():
    # The 3-gram (5, 7, 8) recurs; the 1-gram 8 occurs earlier (it would draft [1, 2]). The 3-gram wins.
    x = [8, 1, 2, 5, 7, 8, 3, 4, 6, 5, 7, 8]
    assert draft(x, num_pred_tokens=2, require_full_continuation=True) == [3, 4]


def test_earliest_occurrence_wins_and_latest_on_request():
    x = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2]
    assert draft(x, num_pred_tokens=2) == [10, 11]
    assert draft(x, num_pred_tokens=2, match_order="latest") == [20, 21]


def test_full_continuation_rule_both_ways():
    # The 2-gram (1, 2) is followed by only 4 tokens: enough for K = 4, too few for K = 5 (and so is the 1-gram 2).
    x = [9, 9, 9, 9, 1, 2, 5, 6, 1, 2]
    assert draft(x, num_pred_tokens=4, require_full_continuation=True) == [5, 6, 1, 2]
    assert draft(x, num_pred_tokens=5, require_full_continuation=True) == []
    assert draft(x, num_pred_tokens=5, require_full_continuation=False) == [5, 6, 1, 2]  # cut at the end
    # With a full continuation required, a shorter n-gram with a long continuation is used instead.
    y = [2, 7, 7, 7, 7, 9, 1, 2, 5, 1, 2]
    assert draft(y, num_pred_tokens=4, require_full_continuation=True) == [7, 7, 7, 7]
    assert draft(y, num_pred_tokens=4, require_full_continuation=False) == [5, 1, 2]


def test_no_match_drafts_nothing_or_the_dummy():
    x = [1, 2, 3, 4]
    assert draft(x) == []
    assert draft(x, dummy_draft_when_no_match=True) == [100]
    assert draft(x, dummy_draft_when_no_match=True, dummy_token_id=7) == [7]


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("order", ["earliest", "latest"])
def test_incremental_index_equals_the_rescan(full, order):
    rng = random.Random(0)
    for trial in range(30):
        x = [rng.randrange(4) for _ in range(rng.randrange(1, 60))]
        index = NgramIndex(3)
        index.extend(x[:1])
        for end in range(1, len(x) + 1):
            index.sync(x[:end])
            k = 1 + trial % 6
            assert index.lookup(3, k, full, order) == spec_lookup(x[:end], 3, k, full, order), (x[:end], k)


def test_bad_match_order_is_refused():
    with pytest.raises(OptionError, match="match_order"):
        PLD(PLD.Config(match_order="random"), None)


def test_pld_default_is_lossless(lm, assert_lossless):
    results = assert_lossless(PLD(PLD.Config(), lm))
    tokens = sum(len(r.new_ids) for r in results.values())
    assert tokens / sum(r.steps for r in results.values()) > 1.0  # some drafts are accepted


def test_pld_with_upstream_quirks_is_lossless(lm, assert_lossless):
    assert_lossless(PLD(PLD.Config(require_full_continuation=True, dummy_draft_when_no_match=True), lm),
                    names=THREE)
