"""EAGLE-1's static draft tree (docs/methods/eagle.md, EAGLE-1): a fixed set of paths of ranks.

A path (c1, ..., cd) is the node whose token is the c_d-th best token of the draft's prediction at its parent. The
nodes are laid out in (depth, path) order, so a parent always comes before its children. Only nodes with children
are run through the draft (a leaf's token is read from its parent's ranking), one forward per depth.
"""

from __future__ import annotations

from dataclasses import dataclass

# EAGLE's `mc_sim_7b_63` (its name is Medusa's, its shape is not: 25 nodes, depth 5).
MC_SIM_7B_63 = (
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)
STATIC_TREES = {"mc_sim_7b_63": MC_SIM_7B_63}


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
