"""Draft-tree search and selection (docs/methods/gumiho.md, Draft tree search) and Full Tree Attention rows (Full Tree Attention), as plain tensor logic.

A step builds a *pool* of candidate nodes level by level, each with a token, a cumulative log-probability and
the pool index of its parent (-1 = the root, i.e. the pending token):
  - a serial level expands every beam by its top-k tokens (scores add up along the path);
    Gumiho keeps the global top-k of those in the pool, EAGLE-2 puts all of them in and keeps the top-k as beams;
  - an MLP level (Gumiho) expands every beam by the top-`mlptopk` tokens of its anchor's head output and keeps
    the global top-`pruning`.
Then the `budget` best nodes are chosen (`select_nodes`) and laid out in pool order (`layout`).

A static tree (EAGLE-1's, Medusa's, Hydra's) is a fixed list of rank paths instead: `StaticTree` lays them out. A
path (c1, ..., cd) is the node whose token is the c_d-th best token of the prediction at its parent; nodes are laid
out in (depth, path) order, so a parent always comes before its children.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

ROOT = -1


@dataclass
class Pool:
    """Candidate nodes in creation order: parents always come before their children."""

    tokens: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # pool index, ROOT for a child of the pending token

    def add(self, tokens, scores, parents) -> list[int]:
        start = len(self.tokens)
        self.tokens += [int(t) for t in tokens]
        self.scores += [float(s) for s in scores]
        self.parents += [int(p) for p in parents]
        return list(range(start, len(self.tokens)))

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Expansion:
    """Children chosen from a level: the beam each came from, its token and cumulative score (best first)."""

    beam: torch.Tensor  # [n] index into the expanded beams
    tokens: torch.Tensor  # [n]
    scores: torch.Tensor  # [n]


def expand(beam_scores: torch.Tensor, log_probs: torch.Tensor, per_beam: int, keep: int | None,
           vocab_ids: torch.Tensor | None = None) -> tuple[Expansion, Expansion]:
    """Each beam's top-`per_beam` tokens with cumulative scores; returns (all children in beam-major order,
    the global top-`keep` of them, best first). Ties in the global top-k go to the lower flat index, i.e. the
    earlier beam, then the better rank within it. `log_probs` are over a draft vocabulary whose index i is target
    id `vocab_ids[i]` (None: the target's own vocabulary)."""
    per_beam = min(per_beam, log_probs.shape[-1])  # a vocabulary smaller than the top-k (tiny test models)
    top = torch.topk(log_probs, per_beam, dim=-1)
    cumulative = top.values + beam_scores[:, None]
    flat_scores = cumulative.reshape(-1)
    flat_tokens = top.indices.reshape(-1)
    if vocab_ids is not None:
        flat_tokens = vocab_ids[flat_tokens]
    beams = torch.arange(log_probs.shape[0], device=log_probs.device).repeat_interleave(per_beam)
    everything = Expansion(beams, flat_tokens, flat_scores)
    if keep is None:
        return everything, everything
    keep = min(keep, flat_scores.numel())
    # A stable sort on the negated scores: ties keep the flat order (deterministic, unlike torch.topk).
    order = torch.sort(-flat_scores, stable=True).indices[:keep]
    return everything, Expansion(beams[order], flat_tokens[order], flat_scores[order])


def select_nodes(pool: Pool, budget: int) -> list[int]:
    """The `budget` best pool nodes, ancestor-closed, in pool order.

    Best-first from the root: the frontier holds the children of the root and of every chosen node; the best
    score wins, ties by the lower pool index. Scores never increase along a path, so this is the global top-
    `budget` by (score desc, pool index), and a tie at the cut-off can never take a child without its parent.
    The count is exactly min(budget, len(pool)).
    """
    children: dict[int, list[int]] = {}
    for index, parent in enumerate(pool.parents):
        children.setdefault(parent, []).append(index)
    frontier = [(-pool.scores[i], i) for i in children.get(ROOT, [])]
    heapq.heapify(frontier)
    chosen: list[int] = []
    while frontier and len(chosen) < budget:
        _, index = heapq.heappop(frontier)
        chosen.append(index)
        for child in children.get(index, []):
            heapq.heappush(frontier, (-pool.scores[child], child))
    return sorted(chosen)


def layout(pool: Pool, chosen: list[int]) -> tuple[list[int], list[int]]:
    """Draft tokens and parents for `DraftTree`: node i+1 is chosen[i]; parent 0 is the pending token."""
    tree_index = {pool_index: i + 1 for i, pool_index in enumerate(chosen)}
    tokens = [pool.tokens[i] for i in chosen]
    parents = [0 if pool.parents[i] == ROOT else tree_index[pool.parents[i]] for i in chosen]
    return tokens, parents


def root_paths(parents: list[int]) -> list[list[int]]:
    """One row per leaf, in increasing leaf index (upstream's greedy order): node 0 first, then down to the leaf.
    `parents[i]` is the parent of node i + 1 (the DraftTree convention)."""
    full = [-1] + list(parents)
    is_parent = set(full[1:])
    rows = []
    for node in range(len(full)):
        if node in is_parent:
            continue
        row = [node]
        while row[-1] != 0:
            row.append(full[row[-1]])
        rows.append(row[::-1])
    return rows


def fta_rows(paths: list[list[int]]) -> list[list[int]]:
    """Full Tree Attention (docs/methods/gumiho.md, Full Tree Attention): pad each short path, column by column, with the most frequent real node of
    that column (ties: the smallest node index). Columns from the shortest path's length on are filled.

    Upstream sorts nothing in greedy mode: its rows are in leaf order, which puts short rows first only because
    leaves with smaller tree indices tend to be shallower; it reads `first` from row 0. So does this function.
    """
    width = max(len(p) for p in paths)
    rows = [list(p) for p in paths]
    first = len(rows[0])
    for col in range(first, width):
        real = [row[col] for row in rows if len(row) > col]
        counts: dict[int, int] = {}
        for node in real:
            counts[node] = counts.get(node, 0) + 1
        star = min(counts, key=lambda node: (-counts[node], node))
        for row in rows:
            if len(row) == col:
                row.append(star)
    return rows


@dataclass(frozen=True)
class StaticTree:
    """The nodes of a list of rank paths in layout order: node i (0-based, the pending token excluded)."""

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]  # parent node index, -1 for a child of the pending token
    ranks: tuple[int, ...]  # the node's rank among its parent's predictions
    expanded_by_depth: tuple[tuple[int, ...], ...]  # per depth 1.., the nodes with children, in layout order
    children_of: tuple[tuple[int, ...], ...]  # per node, its children in layout order

    @classmethod
    def from_paths(cls, paths) -> "StaticTree":
        paths = tuple(sorted({tuple(int(c) for c in p) for p in paths}, key=lambda p: (len(p), p)))
        if not paths or any(not p or min(p) < 0 for p in paths):
            raise ValueError("a static tree is a non-empty list of non-empty paths of ranks >= 0")
        index = {p: i for i, p in enumerate(paths)}
        missing = [p for p in paths if len(p) > 1 and p[:-1] not in index]
        if missing:
            raise ValueError(f"static tree path {list(missing[0])} has no parent path {list(missing[0][:-1])}")
        parents = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths)
        has_children = set(parents)
        depth = max(len(p) for p in paths)
        expanded = tuple(tuple(i for i, p in enumerate(paths) if len(p) == d and i in has_children)
                         for d in range(1, depth))
        children = tuple(tuple(i for i, parent in enumerate(parents) if parent == node) for node in range(len(paths)))
        return cls(paths, parents, tuple(p[-1] for p in paths), expanded, children)

    @property
    def top_k(self) -> int:
        """How many ranked predictions a node needs: one more than the largest rank."""
        return max(self.ranks) + 1
