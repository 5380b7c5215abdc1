"""PLD, prompt lookup decoding (docs/methods/pld.md): draft the continuation of an earlier occurrence of the last n-gram.

Each step looks up the sequence's last n-gram (longest n first) among the n-grams of prompt + output and drafts
the tokens that followed the chosen occurrence, as one chain below the pending token. Upstream rescans the whole
sequence every step; here an index from n-gram to its start positions, extended with each committed token, gives
the same answer in constant time per lookup.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from evaluation.engine.method import DecodeState, Method
from evaluation.engine.tree import DraftTree
from evaluation.engine.options import MAX_DRAFT_NODES, MAX_TOKEN_ID, require_choice, require_int_range, require_token_id

MATCH_ORDERS = ("earliest", "latest")


class NgramIndex:
    """Start positions of every n-gram (n = 1..max_n) of a growing sequence, in increasing order."""

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.tokens: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}
        self.matched = 0  # n of the last lookup's matched n-gram (0: none)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens)
            # Every n-gram that ends at the new token is new; its start is the largest so far, so lists stay sorted.
            for n in range(1, min(self.max_n, end) + 1):
                self.starts.setdefault(tuple(self.tokens[end - n:]), []).append(end - n)

    def sync(self, tokens: list[int]) -> None:
        """Catch up with `tokens`, a sequence that extends the one indexed so far."""
        if len(tokens) > len(self.tokens):
            self.extend(tokens[len(self.tokens):])

    def lookup(self, max_n: int, k: int, full_continuation: bool, order: str) -> list[int]:
        """The spec's rule: for n = max_n..1, the first (or last) usable occurrence of the last n-gram wins.

        Usable, with `full_continuation` (upstream): k tokens follow it and its continuation starts before the final
        n-gram (p + n + k <= L and p + n < L - n). Without: at least one token follows it (p + n < L, i.e. any
        occurrence but the trivial self-match), and the draft is cut at the end of the sequence, as transformers does.
        """
        length = len(self.tokens)
        for n in range(min(max_n, self.max_n, length - 1), 0, -1):
            starts = self.starts.get(tuple(self.tokens[length - n:]), ())
            if full_continuation:
                last_usable = min(length - n - k, length - 2 * n - 1)
            else:
                last_usable = length - n - 1
            if not starts or starts[0] > last_usable:
                continue
            p = starts[0] if order == "earliest" else starts[bisect.bisect_right(starts, last_usable) - 1]
            self.matched = n
            return self.tokens[p + n: p + n + k]
        self.matched = 0
        return []


class PLD(Method):
    """Prompt lookup decoding: a chain of up to `num_pred_tokens` tokens copied from the sequence itself."""


    @dataclass
    class Config:
        max_ngram_size: int = 3
        num_pred_tokens: int = 10
        # Upstream skips occurrences with fewer than K following tokens; a shorter continuation is still a guess.
        require_full_continuation: bool = False
        # Upstream drafts token 100 when nothing matches; it costs a node and is almost never right.
        dummy_draft_when_no_match: bool = False
        dummy_token_id: int = 100
        # Which occurrence wins among usable ones: "earliest" (upstream) or "latest".
        match_order: str = "earliest"

        def check(self) -> None:
            # The index holds every n-gram up to max_ngram_size: memory grows with it times the sequence length.
            require_int_range("max_ngram_size", self.max_ngram_size, 1, 32)
            require_int_range("num_pred_tokens", self.num_pred_tokens, 1, MAX_DRAFT_NODES)
            require_int_range("dummy_token_id", self.dummy_token_id, 0, MAX_TOKEN_ID)
            require_choice("match_order", self.match_order, MATCH_ORDERS)

    def __init__(self, config: Config, model):
        super().__init__(config, model)
        config.check()
        if config.dummy_draft_when_no_match:
            require_token_id("dummy_token_id", config.dummy_token_id, model)
        self.index = NgramIndex(config.max_ngram_size)

    @property
    def max_nodes(self) -> int:
        return self.config.num_pred_tokens

    def reset(self, prompt_ids: list[int], hidden_states=None) -> None:
        self.index = NgramIndex(self.config.max_ngram_size)
        self.index.extend(prompt_ids)

    def draft(self, state: DecodeState) -> DraftTree:
        cfg = self.config
        self.index.sync(state.tokens)
        tokens = self.index.lookup(cfg.max_ngram_size, cfg.num_pred_tokens, cfg.require_full_continuation,
                                   cfg.match_order)
        if not tokens and cfg.dummy_draft_when_no_match:
            tokens = [cfg.dummy_token_id]
        tree = DraftTree.chain(tokens)
        # For the draft budget: a longer matched n-gram is a likelier continuation (the dummy token scores 0).
        tree.scores = [self.index.matched / cfg.max_ngram_size] * len(tokens)
        return tree
