"""SAM-Decoding: the suffix automaton against a brute-force search, the draft rule, options, and losslessness."""

from __future__ import annotations

import random

import pytest
import torch

from baselines.sam import SamConfig, SamDecoding
from baselines.suffix_automaton import SuffixAutomaton
from evaluation.engine.method import DecodeState
from evaluation.engine.errors import OptionError
from evaluation.engine import decode_turn
from evaluation.questions import load_questions
from tests.conftest import THREE


def common_suffix_lengths(x: list[int], target: list[int]) -> list[int]:
    """lcs[j] = length of the longest common suffix of x[:j] and `target`, for j = 0..len(x)."""
    out = [0]
    for j in range(1, len(x) + 1):
        k = 0
        while k < j and k < len(target) and x[j - 1 - k] == target[-1 - k]:
            k += 1
        out.append(k)
    return out


def brute_match(x: list[int], target: list[int]) -> tuple[int, list[int]]:
    """(length of the longest suffix of `target` that occurs in x, earliest end of each shorter suffix length)."""
    lcs = common_suffix_lengths(x, target)
    best = max(lcs)
    earliest = [next(j for j in range(len(lcs)) if lcs[j] >= n) for n in range(best + 1)]
    return best, earliest


def brute_draft(x: list[int], pending: int, n_predicts: int) -> tuple[int, list[int]]:
    """The draft of docs/methods/sam.md by brute force: the match of x + [pending], then the longest suffix of it whose earliest
    occurrence is followed by n_predicts tokens (else the one-token match's), and n_predicts - 1 tokens after it."""
    length, earliest = brute_match(x, x + [pending])
    if length == 0:
        return 0, []
    usable = [n for n in range(length, 0, -1) if len(x) - earliest[n] >= n_predicts]
    end = earliest[usable[0]] if usable else earliest[1]
    return length, x[end: end + n_predicts - 1]


def check_sequence(x: list[int], alphabet: list[int], n_predicts: int) -> None:
    sam = SuffixAutomaton()
    for i, token in enumerate(x):
        sam.extend([token])
        seq = x[: i + 1]
        # cur: the longest suffix of the sequence that ends earlier too (here: occurs in seq[:-1])
        assert sam.cur_length == brute_match(seq[:-1], seq)[0], seq
        assert len(sam.next) <= max(2, 2 * len(seq) - 1)  # the automaton's size bound
        for pending in alphabet:
            state, length = sam.lookup(pending)
            expected_length, earliest = brute_match(seq, seq + [pending])
            assert length == expected_length, (seq, pending)
            if length:
                assert sam.first_end[state] == earliest[length], (seq, pending)
                drafts = sam.continuation(sam.with_room(state, n_predicts), n_predicts - 1)
                assert (length, drafts) == brute_draft(seq, pending, n_predicts), (seq, pending)


def test_suffix_automaton_against_brute_force_on_random_sequences():
    rng = random.Random(1234)
    for case in range(2000):
        alphabet = list(range(rng.choice([2, 3, 4])))
        x = [rng.choice(alphabet) for _ in range(rng.randrange(1, 36))]
        check_sequence(x, alphabet, n_predicts=rng.choice([2, 3, 5, 8]))


def test_suffix_automaton_on_real_tokens(lm, spec_bench_file):
    questions = load_questions(spec_bench_file)
    # A summarization question repeats itself little; a math one has numbers and repeated phrases.
    texts = [questions[200].turns[0][:1500], questions[400].turns[0]]
    for text in texts:
        x = lm.tokenizer(text, add_special_tokens=False)["input_ids"][:400]
        pending_candidates = sorted(set(x[:50]))[:6]
        check_sequence(x, pending_candidates, n_predicts=40)


def test_earliest_occurrence_and_walk_up():
    # "1 2 3" occurs at 0 and 5; the earliest (end 3) is drafted. With 40 wanted, the walk stops below the root.
    sam = SuffixAutomaton()
    sam.extend([1, 2, 3, 9, 9, 1, 2, 3, 7, 1, 2])
    state, length = sam.lookup(3)
    assert (length, sam.first_end[state]) == (3, 3)
    assert sam.continuation(state, 4) == [9, 9, 1, 2]


def sam_draft(tokens: list[int], **options) -> tuple[list[int], bool]:
    method = SamDecoding(SamConfig(fallback="none", **options), None)
    method.reset(tokens[:-1])
    tree = method.draft(DecodeState(list(tokens), len(tokens) - 1, torch.zeros(4), 10))
    return tree.tokens, method.from_automaton


def test_threshold_padding_and_dynamic_length():
    x = [5, 6, 7, 8, 9, 1, 2, 3, 4, 0, 5, 6, 7, 8, 9]  # pending 9: the match 5 6 7 8 9 is 5 long
    assert sam_draft(x, dynamic_length_without_fallback=False, n_predicts=4) == ([1, 2, 3], True)
    assert sam_draft(x, dynamic_length_without_fallback=False, threshold=6) == ([], False)
    assert sam_draft(x, dynamic_length_without_fallback=False, n_predicts=14, pad_chain=True)[0] == \
        [1, 2, 3, 4, 0, 5, 6, 7, 8] + [0] * 4
    # Without a fallback, upstream's length rule: 1 + int(alpha * match) tokens counting the pending one.
    assert sam_draft(x, alpha=0.5)[0] == [1, 2]  # 1 + int(2.5) = 3 tokens: 2 drafts
    assert sam_draft([1, 2, 3, 4], alpha=4.0)[0] == []  # no match


@pytest.mark.parametrize("option,value", [("n_predicts", 1), ("threshold", 0), ("fallback", "eagle"),
                                          ("recycling_template", "1.0"), ("adjacency_scope", "run"),
                                          ("alpha", 0.0)])
def test_check_rejects_bad_values(option, value):
    with pytest.raises(OptionError, match=option):
        SamConfig(**{option: value}).check()
    SamConfig().check()


def test_max_nodes_bounds_both_drafters(lm):
    assert SamDecoding(SamConfig(), lm).max_nodes == 60  # the fallback's tree is the larger
    assert SamDecoding(SamConfig(recycling_template="2.2.2"), lm).max_nodes == 80
    assert SamDecoding(SamConfig(fallback="none", n_predicts=40), lm).max_nodes == 39


def test_sam_with_recycling_is_lossless(lm, assert_lossless):
    method = SamDecoding(SamConfig(), lm)
    results = assert_lossless(method)
    tokens = sum(len(r.new_ids) for r in results.values())
    assert tokens / sum(r.steps for r in results.values()) > 1.0


def test_sam_without_fallback_is_lossless(lm, assert_lossless):
    results = assert_lossless(SamDecoding(SamConfig(fallback="none"), lm))
    tokens = sum(len(r.new_ids) for r in results.values())
    assert tokens / sum(r.steps for r in results.values()) > 1.0



def test_sam_tr_defaults_follow_upstream_step_for_step(lm, lossless_prompts):
    """Against SAM-Decoding's loop with its token-recycling tree written out (tests/upstream_loops.py): the same
    tokens, the same accepted lengths (upstream does not count the prefill, ours counts it as a step of one token),
    upstream's step past the answer, and the same fallback matrix after each question."""
    from tests.upstream_loops import sam_tr

    method = SamDecoding(SamConfig(), lm)
    reference = torch.zeros_like(method.fallback.adjacency)
    for name in ("q81", "q161"):  # in this order, one fallback matrix for both, as upstream's process has
        prompt = lossless_prompts[name]
        ours = decode_turn(lm, method, prompt, 24)
        tokens, lengths = sam_tr(lm.model, prompt, reference, 24, set(lm.stop_ids))
        assert ours.new_ids == tokens, name
        answer_steps = ours.accept_lengths[1:]
        assert lengths[: len(answer_steps) - 1] == answer_steps[:-1], name
        assert lengths[len(answer_steps) - 1] >= answer_steps[-1], name
        assert lengths[len(answer_steps):] == ours.past_answer_lengths, name
        assert torch.equal(method.fallback.adjacency, reference), name


def test_sam_principled_setting_is_lossless(lm, assert_lossless):
    principled = SamConfig(pad_chain=False, prefill_rows="last", end_of_turn="answer", adjacency_scope="question")
    results = assert_lossless(SamDecoding(principled, lm), names=THREE)
    assert not any(r.past_answer_lengths for r in results.values())


def test_prefill_rows_all_and_last():
    """prefill_rows: all (upstream) writes the recycling row of every prompt token from the prefill's logits (a
    repeated token keeps its last position's row); last writes only the last prompt token's, at the first draft."""
    from tests.test_recycling import fake_model, ranked_logits, top8

    prompt = [1, 2, 3, 2]
    method = SamDecoding(SamConfig(prefill_rows="all"), fake_model())
    assert method.needs_prompt_logits
    method.reset(prompt)
    method.learn_from_prompt(prompt, ranked_logits(4))
    rows = method.fallback.adjacency
    assert rows[1].tolist() == top8(0) and rows[3].tolist() == top8(2) and rows[2].tolist() == top8(3)
    assert int(rows.any(dim=1).sum()) == 3

    method = SamDecoding(SamConfig(prefill_rows="last"), fake_model())
    assert not method.needs_prompt_logits
    method.reset(prompt)
    method.draft(DecodeState(prompt + [9], len(prompt), ranked_logits(1)[0].roll(4), 10))
    rows = method.fallback.adjacency
    assert rows[2].tolist() == top8(4) and int(rows.any(dim=1).sum()) == 1


@pytest.mark.parametrize("option,value", [("prefill_rows", "first"), ("end_of_turn", "never")])
def test_check_rejects_bad_switch_values(option, value):
    with pytest.raises(OptionError, match=option):
        SamConfig(**{option: value}).check()


@pytest.mark.parametrize("prefill_rows,end_of_turn,pad_chain", [
    ("all", "upstream", False), ("all", "answer", True), ("all", "answer", False),
    ("last", "upstream", True), ("last", "upstream", False), ("last", "answer", True)])
def test_mixed_switches_are_lossless(lm, assert_lossless, prefill_rows, end_of_turn, pad_chain):
    """The six settings of the three switches the defaults and the principled test leave out."""
    config = SamConfig(prefill_rows=prefill_rows, end_of_turn=end_of_turn, pad_chain=pad_chain)
    assert_lossless(SamDecoding(config, lm), names=("q81-turn2",))
