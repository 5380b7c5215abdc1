"""LogitSpec (smart-lty/LogitSpec): the last logit's top-k guess the next-next token; n-gram retrieval extends them.

Per step the draft is a star of chains below the pending token r (= argmax of the last logits):
  1. the continuation of r itself, from the longest n-gram match on the committed tokens;
  2. for each top-k token t != r of the last logits, in rank order: [t] + the pool's continuation of (ctx + [t]),
     cut to a rank-dependent length, until the tree holds `draft_tree_capacity` nodes (r included).
See docs/methods/logitspec.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from evaluation.engine.method import DecodeState, Method, StepOutcome
from evaluation.engine.tree import DraftTree
from evaluation.engine.errors import require
from evaluation.engine.options import MAX_DRAFT_NODES, require_increasing, require_int_range
from logitspec.pool import Pool


MATCH_SOURCES = 4  # draft-budget sources 1..4: the root's continuation found under an n-gram of 1, 2, 3, 4+ tokens
CANDIDATE_SOURCE = MATCH_SOURCES + 1  # a next-next candidate; its continuation: this + the match length (capped)


@dataclass
class LogitSpecConfig:
    max_ngram_size: int = 3  # N: longest n-gram in the pool (lookups try N..1)
    num_pred_tokens: int = 20  # K: continuation length stored per n-gram
    draft_tree_capacity: int = 64  # C: tree nodes, the pending token included
    topk: Optional[int] = None  # logit candidates read from the last logits; None = C
    # A candidate of rank <= rank_thresholds[j] (rank 0 = the argmax) gets a branch of at most branch_lengths[j]
    # tokens, itself included; later ranks get branch_lengths[-1]. Upstream hard-codes 4 / 3 / 1 at 8 / 32.
    branch_lengths: list[int] = field(default_factory=lambda: [4, 3, 1])
    rank_thresholds: list[int] = field(default_factory=lambda: [8, 32])
    next_next: bool = True  # false: only the retrieval continuation of the root (no logit branches)
    upstream_update_window: bool = False  # true: rescan only the last 2K positions per update, as upstream

    def check(self) -> None:
        require_int_range("max_ngram_size", self.max_ngram_size, 1, 32)
        require_int_range("num_pred_tokens", self.num_pred_tokens, 1, 1024)
        require_int_range("draft_tree_capacity", self.draft_tree_capacity, 1, MAX_DRAFT_NODES + 1)
        if self.topk is not None:  # 2^18 is above every vocabulary size; the top-k is cut to the vocabulary
            require_int_range("topk", self.topk, 1, 2**18)
        require(len(self.branch_lengths) == len(self.rank_thresholds) + 1, "branch_lengths", list(self.branch_lengths),
                f"one entry more than rank_thresholds ({len(self.rank_thresholds)} entries)")
        for i, length in enumerate(self.branch_lengths):
            require_int_range(f"branch_lengths[{i}]", length, 1, MAX_DRAFT_NODES)
        for i, rank in enumerate(self.rank_thresholds):
            require_int_range(f"rank_thresholds[{i}]", rank, 0, 2**18)
        require_increasing("rank_thresholds", list(self.rank_thresholds))


class LogitSpec(Method):
    """Top-k of the last logit guess the next-next token; n-gram retrieval extends each guess."""

    Config = LogitSpecConfig

    def __init__(self, config: LogitSpecConfig, model):
        super().__init__(config, model)
        config.check()
        # Branch length by rank, precomputed once: rank -> max tokens.
        k = config.topk if config.topk is not None else config.draft_tree_capacity
        self._topk = k if config.next_next else 0
        self._length_of_rank = [self._branch_length(rank) for rank in range(max(self._topk, 1))]
        self.pool = self._new_pool()

    def _new_pool(self) -> Pool:
        c = self.config
        return Pool(c.max_ngram_size, c.num_pred_tokens, c.upstream_update_window)

    def _branch_length(self, rank: int) -> int:
        for threshold, length in zip(self.config.rank_thresholds, self.config.branch_lengths):
            if rank <= threshold:
                return length
        return self.config.branch_lengths[-1]

    @property
    def max_nodes(self) -> int:
        return self.config.draft_tree_capacity - 1

    def reset(self, prompt_ids: list[int], hidden_states=None) -> None:
        # The pool holds the committed tokens without the pending one, as upstream (r is added only once accepted).
        self.pool.build(prompt_ids)

    def update(self, state: DecodeState, outcome: StepOutcome) -> None:
        self.pool.extend(state.tokens[len(self.pool.seq):-1])

    def draft(self, state: DecodeState) -> DraftTree:
        room_total = self.config.draft_tree_capacity - 1  # draft tokens allowed below the root
        if room_total <= 0:
            return DraftTree()
        tokens, pool = state.tokens, self.pool
        root = tokens[-1]
        branches: list[list[int]] = []
        used = 0

        # What the draft budget learns acceptance from (`evaluation.engine.budget`): each node's source, the
        # retrieval continuation by the length of its n-gram match (a 3-gram match is right far more often than a
        # 1-gram one) or a next-next branch (its candidate, then the candidate's continuation by match length),
        # and, for a next-next branch, the last logits' probability of its candidate as the score.
        probs = torch.softmax(state.last_logits.float(), dim=-1)
        scores: list[float | None] = []
        sources: list[int] = []

        # (1) the root's own continuation; cut to the capacity (upstream never needs to: K < C there).
        cont, matched = pool.match(tokens)
        if cont:
            branches.append(cont[:room_total])
            used = len(branches[0])
            scores += [None] * used
            sources += [min(matched, MATCH_SOURCES)] * used

        # (2) next-next branches from the last logits, best rank first (rank 0, normally the root, is skipped).
        if self._topk and used < room_total:
            logits = state.last_logits  # ranked by the logits themselves, as upstream (not by rounded probabilities)
            top = torch.topk(logits, min(self._topk, logits.shape[-1])).indices
            candidates, candidate_probs = top.tolist(), probs[top].tolist()
            lengths = self._length_of_rank
            for rank, t in enumerate(candidates):
                if t == root:
                    continue
                limit = lengths[rank]
                cont, matched = pool.match(tokens, extra=t) if limit > 1 else ([], 0)
                seq = [t] + cont[: limit - 1]
                seq = seq[: room_total - used]
                branches.append(seq)
                scores += [candidate_probs[rank]] * len(seq)
                sources += [CANDIDATE_SOURCE] + [CANDIDATE_SOURCE + min(matched, MATCH_SOURCES)] * (len(seq) - 1)
                used += len(seq)
                if used >= room_total:
                    break
        tree = DraftTree.star_of_chains(branches)
        tree.scores, tree.sources = scores, sources
        return tree
