"""Token Recycling: the template, the adjacency update and its scopes, options, and losslessness."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from baselines.recycling import TEMPLATES, AdjacencyDrafter, Template, TokenRecycling
from evaluation.engine import decode_turn
from evaluation.engine.method import DecodeState
from evaluation.engine.errors import OptionError
from tests.conftest import THREE


def test_template_222_is_upstreams():
    paths = TEMPLATES["2.2.2"]
    assert len(paths) == 80
    assert [Counter(len(p) for p in paths)[d] for d in range(1, 7)] == [8, 21, 25, 15, 8, 3]
    assert len({tuple(p) for p in paths}) == 80
    template = Template(paths)
    assert all(template.parents[i] < i for i in range(1, 81))  # parents before children
    assert all(paths[template.parents[i] - 1] == paths[i - 1][:-1] for i in range(1, 81) if template.parents[i])
    assert template.layers == [(1, 9), (9, 30), (30, 55), (55, 70), (70, 78), (78, 81)]
    assert max(max(p) for p in paths) < 8  # every rank is a column of the adjacency matrix
    samd = Template(TEMPLATES["samd"])
    assert len(samd) == 60 and [Counter(samd.depths[1:].tolist())[d] for d in range(1, 6)] == [7, 20, 21, 8, 4]


def test_template_rejects_children_before_parents():
    with pytest.raises(ValueError):
        Template([[0, 0], [0]])


def state_of(tokens: list[int], vocab: int = 16) -> DecodeState:
    return DecodeState(list(tokens), 1, torch.zeros(vocab), 10)


def test_fill_layer_by_layer_and_learn_every_node():
    drafter = AdjacencyDrafter(16, "2.2.2")
    drafter.reset([1])
    drafter.prefill_row_due = False
    drafter.rows[3] = [4, 5, 6, 7, 8, 9, 10, 11]
    drafter.rows[4] = [12, 13, 0, 0, 0, 0, 0, 0]
    tree = drafter.draft(state_of([1, 3]))
    assert len(tree) == 80
    assert tree.tokens[:8] == [4, 5, 6, 7, 8, 9, 10, 11]  # depth 1: the row of the pending token
    assert tree.tokens[8:10] == [12, 13]  # [0, 0] and [0, 1]: the row of token 4
    assert tree.tokens[16] == 0  # [1, 0]: below token 5, never seen: upstream's zero row
    # Without unseen rows, only nodes below written rows remain, each parent before its children.
    drafter.draft_unseen = False
    drafter.seen[[3, 4]] = True
    pruned = drafter.draft(state_of([1, 3]))
    assert pruned.tokens == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 0, 0, 0, 0, 0, 0]
    assert pruned.parents == [0] * 8 + [1] * 8

    # The update: every node's row becomes its top-8; a token at two nodes keeps the later node's row.
    logits = torch.zeros(3, 16)
    logits[0, 8:16] = torch.arange(8, 0, -1.0)  # node 0 (token 2): 8, 9, ..., 15
    logits[1, 0:8] = torch.arange(8, 0, -1.0)  # node 1 (token 5): 0..7
    logits[2, 1:9] = torch.arange(8, 0, -1.0)  # node 2 (token 5 again): 1..8 wins
    drafter.learn(np.array([2, 5, 5]), logits)
    assert drafter.rows[2].tolist() == list(range(8, 16))
    assert drafter.rows[5].tolist() == list(range(1, 9))


def filled(drafter: AdjacencyDrafter) -> bool:
    return bool(drafter.rows.any())


def test_scopes_clear_at_the_right_resets():
    first, turn2, other = [1, 2, 3], [1, 2, 3, 9, 4, 5], [1, 7, 3]
    for scope, kept_after_turn2, kept_after_other in [("process", True, True), ("question", True, False),
                                                      ("turn", False, False)]:
        drafter = AdjacencyDrafter(16, scope=scope)
        drafter.reset(first)
        drafter.rows[4, 0] = 6
        drafter.reset(turn2)  # a later turn: the prompt extends the previous one
        assert filled(drafter) == kept_after_turn2, scope
        drafter.rows[4, 0] = 6
        drafter.reset(other)  # another conversation
        assert filled(drafter) == kept_after_other, scope


@pytest.mark.parametrize("option,value", [("template", "2.2"), ("adjacency_scope", "run"),
                                          ("first_step", "prefill"), ("end_of_turn", "never")])
def test_check_rejects_bad_values(option, value):
    with pytest.raises(OptionError, match=option):
        TokenRecycling.Config(**{option: value}).check()
    TokenRecycling.Config().check()


def test_recycling_is_lossless(lm, assert_lossless):
    method = TokenRecycling(TokenRecycling.Config(), lm)
    assert method.max_nodes == 80
    results = assert_lossless(method)
    tokens = sum(len(r.new_ids) for r in results.values())
    assert tokens / sum(r.steps for r in results.values()) > 1.2  # recycled successors are accepted
    assert all(r.accept_lengths[0] == 0 for r in results.values())  # upstream's first step: the prefill stops short
    # The principled setting on the same prompts: lossless too, its prefill commits a token and it never learns
    # past the answer, and it drafts otherwise than upstream's.
    principled = TokenRecycling.Config(first_step="after_prefill", end_of_turn="answer", adjacency_scope="question")
    other = assert_lossless(TokenRecycling(principled, lm), names=THREE)
    assert all(r.accept_lengths[0] == 1 and not r.past_answer_lengths for r in other.values())
    assert any(results[n].accept_lengths[1:] != other[n].accept_lengths[1:] for n in other)


def accept_lengths_in_order(lm, prompts: dict, order: list[str], scope: str) -> dict:
    method = TokenRecycling(TokenRecycling.Config(adjacency_scope=scope), lm)
    results = {name: decode_turn(lm, method, prompts[name], 16) for name in order}
    return {name: (r.new_ids, r.accept_lengths) for name, r in results.items()}


def test_question_scope_does_not_depend_on_question_order(lm, lossless_prompts):
    # A conversation's second turn extends its first turn's prompt: the question scope keeps the matrix there.
    first, second = lossless_prompts["q81"], lossless_prompts["q81-turn2"]
    assert second[: len(first)] == first
    names = ["q161", "q481"]
    # (The turn scope starts afresh at every turn, more often still: the question scope is the one at risk.)
    forward = accept_lengths_in_order(lm, lossless_prompts, names, "question")
    backward = accept_lengths_in_order(lm, lossless_prompts, names[::-1], "question")
    assert forward == backward
    # The process scope (upstream) carries the matrix over: the second question drafts differently.
    forward = accept_lengths_in_order(lm, lossless_prompts, names, "process")
    backward = accept_lengths_in_order(lm, lossless_prompts, names[::-1], "process")
    assert forward != backward
    assert all(forward[n][0] == backward[n][0] for n in names)  # the same tokens either way


UPSTREAM_NAMES = ("q81", "q161")  # in this order, one matrix for both, as upstream's process carries it
UPSTREAM_TOKENS = 24


def test_defaults_follow_upstream_step_for_step(lm, lossless_prompts):
    """Against Spec-Bench's loop written out (tests/upstream_loops.py): the same tokens, the same accepted length at
    every step (upstream counts the last prompt token in its first step's; so does ours, whose prefill commits
    nothing), upstream's extra steps past max_new_tokens, and the same matrix after each question."""
    from tests.upstream_loops import recycling as upstream_recycling

    method = TokenRecycling(TokenRecycling.Config(), lm)
    reference = torch.zeros_like(method.drafter.adjacency)
    for name in UPSTREAM_NAMES:
        prompt = lossless_prompts[name]
        ours = decode_turn(lm, method, prompt, UPSTREAM_TOKENS)
        tokens, lengths = upstream_recycling(lm.model, prompt, reference, UPSTREAM_TOKENS, set(lm.stop_ids))
        assert ours.accept_lengths[0] == 0  # the prefill stopped short
        answer_steps = ours.accept_lengths[1:]
        # upstream's loop takes at most max_new_tokens steps: with nothing accepted it ends a token short
        assert ours.new_ids[: len(tokens)] == tokens[:UPSTREAM_TOKENS], name
        assert lengths[: len(answer_steps) - 1] == answer_steps[:-1], name
        assert lengths[len(answer_steps) - 1] >= answer_steps[-1], name  # our answer's last step is cut
        assert lengths[len(answer_steps):] == ours.past_answer_lengths, name
        assert len(tokens) > UPSTREAM_TOKENS or tokens[-1] in lm.stop_ids or len(lengths) == UPSTREAM_TOKENS
        assert torch.equal(method.drafter.adjacency, reference), name


def fake_model(vocab: int = 16, stop_ids=frozenset({15})):
    """What the drafter reads of a model: its vocabulary size and stop tokens."""
    from types import SimpleNamespace

    return SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=vocab)), stop_ids=stop_ids)


def ranked_logits(rows: int, vocab: int = 16) -> torch.Tensor:
    """Row i ranks the tokens (i, i+1, ...) mod vocab first: its top-8 are i..i+7."""
    logits = torch.zeros(rows, vocab)
    for i in range(rows):
        logits[i, (torch.arange(vocab) + i) % vocab] = torch.arange(vocab, 0, -1.0)
    return logits


def top8(i: int, vocab: int = 16) -> list[int]:
    return [(i + j) % vocab for j in range(8)]


def test_first_step_rows_prompt_end_and_after_prefill():
    # prompt_end (upstream): the first tree grows below the last prompt token from an empty matrix, so every node
    # drafts token 0, and the step writes the rows of all 81 nodes: the last prompt token's from node 0, token 0's
    # from the last node (a token at several nodes keeps its last node's row).
    drafter = AdjacencyDrafter(16, "2.2.2", prefill_row=False)
    drafter.reset([1, 2, 3])
    tree = drafter.draft(DecodeState([1, 2, 3], 2, torch.zeros(16), 10))
    assert tree.tokens == [0] * 80 and not drafter.rows.any()
    drafter.learn(np.asarray([3] + tree.tokens), ranked_logits(81))
    assert drafter.rows[3].tolist() == top8(0) and drafter.rows[0].tolist() == top8(80)
    assert drafter.seen.sum() == 2
    # after_prefill: the prefill's last logits become the last prompt token's row when the first tree is drafted
    # below the first generated token.
    drafter = AdjacencyDrafter(16, "2.2.2", prefill_row=True)
    drafter.reset([1, 2, 3])
    tree = drafter.draft(DecodeState([1, 2, 3, 7], 3, ranked_logits(1)[0].roll(5), 10))
    assert drafter.rows[3].tolist() == top8(5) and drafter.seen.sum() == 1
    assert tree.tokens[:8] == [0] * 8  # token 7's row is still empty


def test_end_of_turn_upstream_learns_until_upstream_stops():
    """end_of_turn: upstream learns from every step its loop would run to the end of (no stop token among the
    accepted drafts, at most max_new_tokens committed before the bonus), and asks for another step unless the
    bonus is a stop token or the step cap is reached."""
    from evaluation.engine.method import StepOutcome
    from evaluation.engine.tree import Verdict

    def step(method, generated, accepted, bonus, max_new_tokens=10):
        prompt = [1, 2, 3]
        state = DecodeState(prompt + [4] * generated, len(prompt), torch.zeros(16), max_new_tokens)
        tree = method.draft(state)
        verdict = Verdict(list(range(len(accepted) + 1)), accepted, bonus, [0] * (len(tree) + 1))
        method.drafter.clear()
        method.update(state, StepOutcome(accepted + [bonus], verdict, ranked_logits(len(tree) + 1), None, None))
        return bool(method.drafter.rows.any()), method.more

    method = TokenRecycling(TokenRecycling.Config(), fake_model())
    method.reset([1, 2, 3])
    assert step(method, 5, [6], 7) == (True, True)  # an ordinary step
    assert step(method, 5, [15], 7) == (False, False)  # a stop token among the accepted drafts: no update
    assert step(method, 5, [6], 15) == (True, False)  # a stop token as the bonus: the update, then the end
    assert step(method, 11, [6], 7) == (True, True)  # 10 committed before the bonus: still learns
    assert step(method, 12, [6], 7) == (False, False)  # more than max_new_tokens before the bonus: stops first


@pytest.mark.parametrize("first_step,end_of_turn", [("prompt_end", "answer"), ("after_prefill", "upstream")])
def test_mixed_switches_are_lossless(lm, assert_lossless, first_step, end_of_turn):
    """The two settings the defaults and the principled test leave out."""
    config = TokenRecycling.Config(first_step=first_step, end_of_turn=end_of_turn)
    assert_lossless(TokenRecycling(config, lm), names=("q81-turn2",))
