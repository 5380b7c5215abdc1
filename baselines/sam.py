"""SAM-Decoding (docs/methods/sam.md): draft the continuation of the sequence's longest earlier match, from a suffix automaton.

A suffix automaton over prompt + output (baselines/suffix_automaton.py) is extended with every committed token.
Each step looks up the longest suffix of the sequence plus the pending token that occurred before. When it is at
least `threshold` tokens long, the tokens after its earliest occurrence are drafted as one chain (upstream first
walks up suffix links to a match with `n_predicts` tokens after it). Otherwise an auxiliary drafter drafts the
step: Token Recycling's adjacency tree (SAM-Decoding's "SAM[TR]"), or nothing. See docs/methods/sam.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from baselines.recycling import ENDS_OF_TURN, SCOPES, TEMPLATES, AdjacencyDrafter, stop_among
from baselines.suffix_automaton import SuffixAutomaton
from evaluation.engine.method import DecodeState, Method, StepOutcome
from evaluation.engine.tree import DraftTree
from evaluation.engine.errors import require
from evaluation.engine.options import MAX_DRAFT_NODES, require_int_range, require_number_range


class FallbackDrafter(Protocol):
    """What SAM-Decoding needs of its auxiliary drafter. A trained draft model (upstream's EAGLE-2) fits here too:
    it would set `needs_hidden_states` and read `outcome.hidden_states` in `update`."""

    needs_hidden_states: bool
    max_nodes: int

    def reset(self, prompt_ids: list[int], hidden_states=None) -> None:
        """A new turn, with the full prompt."""

    def observe(self, state: DecodeState) -> None:
        """Every step before drafting, whoever drafts: the pending token and the logits behind it."""

    def learn(self, node_tokens: np.ndarray, logits) -> None:
        """Learn from the target's logits [tokens, vocab] at these tokens (the prefill's, with `prefill_rows: all`)."""

    def draft(self, state: DecodeState) -> DraftTree:
        """The tree below the pending token, used when the automaton's match is too short."""

    def update(self, state: DecodeState, outcome: StepOutcome, node_tokens: np.ndarray) -> None:
        """Every step, whoever drafted it: `node_tokens` are the verified nodes (pending token first)."""


def _recycling(config: "SamConfig", model) -> FallbackDrafter:
    return AdjacencyDrafter(model.model.config.vocab_size, config.recycling_template, config.adjacency_scope,
                            prefill_row=config.prefill_rows == "last")


# Auxiliary drafters by name; None = no fallback.
FALLBACKS: dict[str, Callable[["SamConfig", object], FallbackDrafter] | None] = {
    "recycling": _recycling,
    "none": None,
}


PREFILL_ROWS = ("all", "last")


@dataclass
class SamConfig:
    n_predicts: int = 40  # chain length counting the pending token: at most n_predicts - 1 drafts
    threshold: int = 5  # shortest match (pending token included) that drafts from the automaton
    fallback: str = "recycling"  # auxiliary drafter below the threshold: recycling (SAM[TR]) or none
    recycling_template: str = "samd"  # the fallback's tree: SAM-Decoding's 60-node tree, or "2.2.2"
    adjacency_scope: str = "process"  # the fallback matrix's lifetime, as Token Recycling's option
    # Upstream pads the chain with token 0 up to n_predicts tokens, and the fallback learns rows at the padding:
    # extra compute that changes what the fallback drafts later (false: principled).
    pad_chain: bool = True
    # Which prompt tokens the fallback learns rows for from the prefill: all (upstream: every prompt position's
    # logits) or last (only the last prompt token's, from the logits the first token is chosen from).
    prefill_rows: str = "all"
    # upstream: the fallback learns from every step, the last included, and decoding goes on as upstream's loop
    # does (one more step when exactly max_new_tokens are committed, or when the bonus is a stop token; the answer
    # keeps max_new_tokens); answer: stop at the answer's end without learning from its last step.
    end_of_turn: str = "upstream"
    # Without a fallback upstream drafts from every match, 1 + int(alpha * length) tokens long (pending token
    # included, at most n_predicts) and without the walk up suffix links; false applies the threshold rule.
    dynamic_length_without_fallback: bool = True
    alpha: float = 4.0

    def check(self) -> None:
        require_int_range("n_predicts", self.n_predicts, 2, MAX_DRAFT_NODES + 1)
        require_int_range("threshold", self.threshold, 1, 1_000_000)
        require(self.fallback in FALLBACKS, "fallback", self.fallback, f"one of {sorted(FALLBACKS)}")
        require(self.recycling_template in TEMPLATES, "recycling_template", self.recycling_template,
                f"one of {sorted(TEMPLATES)}")
        require(self.adjacency_scope in SCOPES, "adjacency_scope", self.adjacency_scope, f"one of {SCOPES}")
        require(self.prefill_rows in PREFILL_ROWS, "prefill_rows", self.prefill_rows, f"one of {PREFILL_ROWS}")
        require(self.end_of_turn in ENDS_OF_TURN, "end_of_turn", self.end_of_turn, f"one of {ENDS_OF_TURN}")
        require(self.alpha > 0, "alpha", self.alpha, "a number > 0")
        require_number_range("alpha", self.alpha, 1e-6, 1e6)


class SamDecoding(Method):
    """Suffix-automaton retrieval from the sequence itself, with an auxiliary drafter for short matches."""


    Config = SamConfig

    def __init__(self, config: SamConfig, model):
        super().__init__(config, model)
        make = FALLBACKS[config.fallback]
        self.fallback: FallbackDrafter | None = make(config, model) if make else None
        self.needs_hidden_states = bool(self.fallback and self.fallback.needs_hidden_states)
        self.needs_prompt_logits = bool(self.fallback) and config.prefill_rows == "all"
        self.learns_past_answer = bool(self.fallback) and config.end_of_turn == "upstream"
        self.more = False  # upstream's loop would take another step (end_of_turn: upstream)
        self.automaton = SuffixAutomaton()
        self.node_tokens = np.zeros(0, dtype=np.int64)
        self.from_automaton = False  # whether the last draft came from the automaton (for tests and analysis)

    @property
    def max_nodes(self) -> int:
        return max(self.config.n_predicts - 1, self.fallback.max_nodes if self.fallback else 0)

    def reset(self, prompt_ids: list[int], hidden_states=None) -> None:
        self.automaton = SuffixAutomaton()
        self.automaton.extend(prompt_ids)
        if self.fallback:
            self.fallback.reset(prompt_ids)

    def learn_from_prompt(self, token_ids: list[int], logits) -> None:
        self.fallback.learn(np.asarray(token_ids, dtype=np.int64), logits)

    def _sync(self, tokens: list[int]) -> None:
        """Add the committed tokens the automaton lacks; the pending token (tokens[-1]) stays out."""
        if len(tokens) - 1 > len(self.automaton):
            self.automaton.extend(tokens[len(self.automaton): -1])

    def chain(self, pending: int) -> list[int] | None:
        """The automaton's draft after `pending`, or None when the match is too short (the fallback's turn)."""
        cfg, sam = self.config, self.automaton
        state, length = sam.lookup(pending)
        # For the draft budget: automaton drafts score by match length, in (0.25, 1]; the fallback's score 0.
        self.match_score = 0.25 + 0.75 * min(length, 16) / 16
        if self.fallback is None and cfg.dynamic_length_without_fallback:
            size = min(cfg.n_predicts, 1 + int(length * cfg.alpha))
            return sam.continuation(state, size - 1) if length > 0 else []
        if length < cfg.threshold:
            return None
        drafts = sam.continuation(sam.with_room(state, cfg.n_predicts), cfg.n_predicts - 1)
        if cfg.pad_chain:
            drafts = drafts + [0] * (cfg.n_predicts - 1 - len(drafts))
        return drafts

    def draft(self, state: DecodeState) -> DraftTree:
        self._sync(state.tokens)
        if self.fallback is not None:
            self.fallback.observe(state)
        drafts = self.chain(state.tokens[-1])
        self.from_automaton = drafts is not None
        if drafts is not None:
            tree = DraftTree.chain(drafts)
            tree.scores = [self.match_score] * len(drafts)
        elif self.fallback is not None:
            tree = self.fallback.draft(state)
            tree.scores = [0.0] * len(tree.tokens)
        else:
            tree = DraftTree()
        self.node_tokens = np.asarray([state.tokens[-1]] + list(tree.tokens), dtype=np.int64)
        return tree

    def update(self, state: DecodeState, outcome: StepOutcome) -> None:
        self._sync(state.tokens)
        if self.fallback is not None:
            self.fallback.update(state, outcome, self.node_tokens)
        if self.learns_past_answer:
            # Upstream's loop commits the pending token and the accepted drafts each step (the bonus waits) and
            # ends after a stop token among them or once max_new_tokens are committed.
            pending = state.tokens[-1 - len(outcome.committed)]
            stop_ids = self.model.stop_ids
            self.more = (not stop_among([pending, *outcome.verdict.accepted_tokens], stop_ids)
                         and state.generated - 1 < state.max_new_tokens)

    def decodes_past_answer(self, state: DecodeState) -> bool:
        return self.more
