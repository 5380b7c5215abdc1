"""The probability that a drafted node is accepted given that its parent is, learned online per bucket."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class AcceptanceModel:
    """P(node accepted | parent accepted) per (depth, sibling rank, score, source) bucket, as Beta(accepted,
    rejected) counts; the prior says a first child at depth 1 is accepted half the time, less for later siblings
    and deeper nodes, whatever its score and source, and weighs as `prior_strength` observations."""

    max_depth: int = 8
    max_rank: int = 4
    score_buckets: int = 5  # bucket 0: no score; 1..4: score quartiles in [0, 1]
    max_sources: int = 12  # sources 0..max_sources-1 (larger ones share the last); 0 when the method names none
    prior_strength: float = 2.0
    memory: float = 0.98  # per observation of a bucket: its counts weigh about the last 1 / (1 - memory) = 50 steps
    accepted: np.ndarray = field(init=False)
    tested: np.ndarray = field(init=False)

    def __post_init__(self):
        depth = np.arange(1, self.max_depth + 1)[:, None, None, None]
        rank = np.arange(self.max_rank)[None, :, None, None]
        prior = 0.5 * 0.8 ** (depth - 1) / (1 + rank) * np.ones((1, 1, self.score_buckets, self.max_sources))
        self.accepted = prior * self.prior_strength
        self.tested = np.full_like(self.accepted, self.prior_strength)

    def buckets(self, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray | None,
                sources: np.ndarray | None = None) -> tuple:
        """Bucket indices of draft nodes 1..T-1 (node 0, the pending token, has none); a score that is NaN (a node
        the method gives no score) falls in bucket 0 as when there are no scores."""
        n = len(parents)
        ranks = np.zeros(n, dtype=np.int64)
        children = np.zeros(n, dtype=np.int64)
        for i in range(1, n):  # layout order among the children of one parent
            ranks[i] = children[parents[i]]
            children[parents[i]] += 1
        d = np.minimum(depths[1:], self.max_depth) - 1
        r = np.minimum(ranks[1:], self.max_rank - 1)
        if scores is None:
            s = np.zeros(n - 1, dtype=np.int64)
        else:
            scored = ~np.isnan(scores)
            s = np.where(scored, 1 + np.minimum((np.clip(np.nan_to_num(scores), 0.0, 1.0) * (self.score_buckets - 1))
                                                .astype(np.int64), self.score_buckets - 2), 0)
        c = np.zeros(n - 1, dtype=np.int64) if sources is None else np.clip(sources, 0, self.max_sources - 1)
        return d, r, s, c

    def path_probabilities(self, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray | None,
                           sources: np.ndarray | None = None) -> np.ndarray:
        """P(the path to node i is accepted) for draft nodes 1..T-1: products of the conditional estimates."""
        bucket = self.buckets(parents, depths, scores, sources)
        conditional = self.accepted[bucket] / self.tested[bucket]
        p = np.ones(len(parents))
        for i in range(1, len(parents)):  # parents precede children
            p[i] = p[parents[i]] * conditional[i - 1]
        return p[1:]

    def observe(self, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray | None, tokens: np.ndarray,
                committed: list[int], sources: np.ndarray | None = None) -> None:
        """Count, for every proposed node whose outcome `committed` reveals, whether its path was right.

        `committed` is what the turn went on with after the proposal's pending token. Greedy output does not
        depend on the draft, so it says it for every proposed node, verified or cut by the budget: the node at
        depth d is right when its parent is and its token is committed[d-1] (with sampling, the committed tokens
        follow the target's distribution, so the count still estimates the acceptance probability). Learning from
        cut nodes too means that a tree cut to nothing still teaches the model, so an estimate that has fallen
        too low can recover. Nodes below depth len(committed) stay unknown and are not counted.
        """
        n = len(parents)
        if n < 2:
            return
        right = np.zeros(n, dtype=bool)
        tested = np.zeros(n, dtype=bool)
        right[0] = True
        for i in range(1, n):  # parents precede children
            d = depths[i]
            if right[parents[i]] and d <= len(committed):
                tested[i] = True
                right[i] = tokens[i] == committed[d - 1]
        bucket = self.buckets(parents, depths, scores, sources)
        t = tested[1:]
        # Forget slowly: each bucket a proposal speaks for first fades by `memory`, so a question or subtask where
        # drafts are right less often (Token Recycling's template after a repetitive answer) is believed within a
        # few dozen steps, not after as many steps as came before it.
        touched = tuple(np.unique(np.stack([index[t] for index in bucket]), axis=1))
        self.tested[touched] *= self.memory
        self.accepted[touched] *= self.memory
        np.add.at(self.tested, tuple(index[t] for index in bucket), 1.0)
        hit = t & right[1:]
        np.add.at(self.accepted, tuple(index[hit] for index in bucket), 1.0)
