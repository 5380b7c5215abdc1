"""The subtree of a proposed tree that is expected to pay: the n most probable nodes for the best n."""

from __future__ import annotations

import numpy as np
import torch

from evaluation.engine.tree import DraftTree, SideNodes


def best_subtree(probabilities: np.ndarray, parents: np.ndarray, latency, side_nodes: int = 0,
                 fixed_seconds: float = 0.0, run_rate: float | None = None) -> np.ndarray:
    """Draft nodes (1-based tree indices, increasing) of the subtree that maximises expected committed tokens per
    second, (1 + sum p) / (fixed_seconds + t(1 + n + side_nodes)); empty when keeping nothing is best.

    With `run_rate` (tokens per second the run commits), the subtree that maximises the run's rate instead: a
    run's rate is its total tokens over its total time, not the mean of its steps' rates, and a step adds to it
    most when it maximises expected tokens minus the time it takes at the run's rate,
    (1 + sum p) - run_rate * (fixed_seconds + t(1 + n + side_nodes)) (Dinkelbach: at the best rate both agree).
    So a step whose drafts are likely keeps more than its own best rate would, and one whose drafts are not keeps
    less, instead of every step aiming at the same rate.

    `probabilities[i-1]` is the path probability of draft node i and never exceeds its parent's, so the best
    subtree of n nodes holds the n most probable nodes; ties go to the earlier node, which keeps parents first.
    """
    n = len(probabilities)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(-probabilities, kind="stable")
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(probabilities[order])])
    seconds = fixed_seconds + latency(1 + side_nodes + np.arange(n + 1))
    value = expected / seconds if run_rate is None else expected - run_rate * seconds
    best = int(np.argmax(value))  # the first maximum: the smallest tree among equals
    kept = np.sort(order[:best]) + 1
    keep = np.zeros(n + 1, dtype=bool)
    keep[kept] = True
    for i in kept[::-1]:  # a node only with its parent (holds by construction; kept for safety under ties)
        keep[parents[i]] = True
    return np.flatnonzero(keep[1:]) + 1


def prune(tree: DraftTree, kept: np.ndarray) -> DraftTree:
    """The tree restricted to the draft nodes `kept` (1-based, increasing, closed under parents), renumbered;
    side nodes stay, their references to tree nodes renumbered."""
    old_size = 1 + len(tree.tokens)
    new_index = np.full(old_size, -1, dtype=np.int64)
    new_index[0] = 0
    new_index[kept] = np.arange(1, len(kept) + 1)
    tokens = [tree.tokens[i - 1] for i in kept]
    parents = [int(new_index[tree.parents[i - 1]]) for i in kept]
    scores = [tree.scores[i - 1] for i in kept] if tree.scores is not None else None
    sources = [tree.sources[i - 1] for i in kept] if tree.sources is not None else None
    side = None
    if tree.side is not None:
        shift = old_size - (1 + len(kept))

        def renumber(j: int) -> int | None:
            return j - shift if j >= old_size else (int(new_index[j]) if new_index[j] >= 0 else None)

        sees = [[r for r in map(renumber, seen) if r is not None] for seen in tree.side.sees]
        side = SideNodes(list(tree.side.tokens), list(tree.side.offsets), sees)
    draft_probs = None
    if tree.draft_probs is not None:
        draft_probs = tree.draft_probs[torch.as_tensor(kept - 1, device=tree.draft_probs.device)]
    return DraftTree(tokens=tokens, parents=parents, side=side, scores=scores, sources=sources,
                     draft_probs=draft_probs)
