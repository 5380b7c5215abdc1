"""Draft trees: their layout for one target forward, and greedy verification over their root-to-leaf paths.

Node 0 of every tree is the pending token: the newest committed token, whose key/value is not cached yet. Its
output is the exact greedy next token. Draft node i (1-based) has a parent node `parents[i-1] < i`; a node sees
every cached position, itself and its ancestors, and sits at position `cache_length + depth`.

Side nodes (used by Lookahead's Jacobi window) ride along in the same forward but are never verified: each one
names its own position offset and the nodes it sees, and hands its logits back to the method. Tree nodes never
see side nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class SideNodes:
    """Unverified tokens placed after the tree in the same forward.

    `offsets[j]` is the position of side token j relative to the pending token; `sees[j]` lists the nodes it
    attends to besides the cache, numbered over the whole input (tree nodes 0..T-1, then side nodes T..T+S-1).
    """

    tokens: list[int]
    offsets: list[int]
    sees: list[list[int]]


@dataclass
class DraftTree:
    """Draft tokens below the pending token. An empty tree is plain autoregressive decoding."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    side: SideNodes | None = None
    # Optional per-node confidence in [0, 1] (e.g. the logit candidate's probability; None for a node without
    # one): the draft budget (`evaluation.engine.budget`) learns acceptance per score bucket when a method gives it.
    scores: list[float | None] | None = None
    # Optional per-node source, a small integer >= 0 the method defines (what drafted the node and how strong its
    # evidence was, e.g. LogitSpec's retrieval continuation by n-gram match length): the budget learns per source.
    sources: list[int] | None = None
    # Verification rows of node indices, node 0 first, that need not be parent chains (Gumiho's Full Tree
    # Attention pads short paths with nodes of other branches). None: every root-to-leaf path, as usual.
    rows: list[list[int]] | None = None
    # Optional [len(tokens), vocab] distribution each draft token was drawn from (a draft model sampling at
    # temperature > 0, SpS): the sampled rule then accepts token t with min(1, p(t) / q(t)) and leaves the residual
    # max(p - q, 0) on a rejection. None: the tokens are deterministic (q = 1 on each), the rule for every other
    # method. Unused by greedy verification.
    draft_probs: torch.Tensor | None = None

    @classmethod
    def chain(cls, tokens: list[int]) -> "DraftTree":
        """A linear draft: each token is the child of the one before it."""
        return cls(list(tokens), list(range(len(tokens))))

    @classmethod
    def star_of_chains(cls, branches: list[list[int]]) -> "DraftTree":
        """Chains that all hang off the pending token, laid out one after another."""
        tokens: list[int] = []
        parents: list[int] = []
        for branch in branches:
            for j, token in enumerate(branch):
                parents.append(0 if j == 0 else len(tokens))
                tokens.append(token)
        return cls(tokens, parents)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class TreeInputs:
    """What one target forward needs: ids, positions and the additive 4-D mask, plus the layout's depths."""

    input_ids: torch.Tensor  # [1, Q]
    position_ids: torch.Tensor  # [1, Q]
    attention_mask: torch.Tensor  # [1, 1, Q, cache_length + Q], 0 = attend, dtype-min = masked
    depths: np.ndarray  # [T] depth of each tree node
    parents: np.ndarray  # [T] parent node of each tree node (-1 for node 0)
    tokens: np.ndarray  # [T] token of each tree node
    num_tree_nodes: int


def ancestor_matrix(parents: np.ndarray) -> np.ndarray:
    """`visible[i, j]` is True when node j is node i or one of its ancestors (parents precede children)."""
    n = len(parents)
    visible = np.eye(n, dtype=bool)
    for i in range(1, n):
        visible[i] |= visible[parents[i]]
    return visible


class MaskBuffer:
    """A zeroed additive mask on one device, reused across steps: each step writes only its tree block.

    The step's mask is a view `[1, 1, width, cache_length + width]` of it. Columns before the tree stay zero (the
    cache is visible to every node), so the only per-step work is to clear the previous step's block and fill the new
    one: nothing proportional to the context is allocated, filled or copied from the host. The row stride is kept a
    multiple of 1024 elements, as fused attention kernels want aligned masks (else they copy them).
    """

    ROWS, COLUMNS = 64, 1024  # growth steps

    def __init__(self, device: torch.device, dtype: torch.dtype):
        self.device, self.dtype = device, dtype
        self.buffer = torch.zeros((1, 1, 0, 0), dtype=dtype, device=device)
        self.dirty: tuple[int, int] | None = None  # (rows, first column) of the block the last step wrote

    def view(self, visible: torch.Tensor, cache_length: int) -> torch.Tensor:
        """The mask for a `visible` [width, width] pattern (on this device) after `cache_length` cached positions.
        Valid until the next call: the next step reuses the same memory."""
        width = visible.shape[0]
        rows, columns = self.buffer.shape[2:]
        if width > rows or cache_length + width > columns:  # grow (rarely: by whole steps, doubling the columns)
            if width > rows:
                rows = -(-width // self.ROWS) * self.ROWS
            if cache_length + width > columns:
                columns = max(columns * 2, -(-(cache_length + width) // self.COLUMNS) * self.COLUMNS)
            # A normal tensor even when made under inference mode, so that later steps outside it may write it.
            with torch.inference_mode(False):
                self.buffer = torch.zeros((1, 1, rows, columns), dtype=self.dtype, device=self.device)
            self.dirty = None
        if self.dirty is not None:
            old_rows, old_start = self.dirty
            self.buffer[0, 0, :old_rows, old_start : old_start + old_rows].zero_()
            self.dirty = None
        if width > 1:  # a single node sees the cache and itself: nothing to mask
            block = self.buffer[0, 0, :width, cache_length : cache_length + width]
            block.masked_fill_(~visible, torch.finfo(self.dtype).min)
            self.dirty = (width, cache_length)
        return self.buffer[:, :, :width, : cache_length + width]


# One per (device, dtype) in this process; the decode loop is single-threaded.
_MASKS: dict[tuple[torch.device, torch.dtype], MaskBuffer] = {}


def mask_buffer(device: torch.device, dtype: torch.dtype) -> MaskBuffer:
    buffer = _MASKS.get((device, dtype))
    if buffer is None:
        buffer = _MASKS[device, dtype] = MaskBuffer(torch.device(device), dtype)
    return buffer


def build_tree_inputs(
    pending_token: int, tree: DraftTree, cache_length: int, dtype: torch.dtype, device: torch.device
) -> TreeInputs:
    """Lay the pending token, its draft tree and any side nodes out for one forward over a cache of `cache_length`.

    Built on `device` (the device of the model's input embeddings): one host-to-device copy per step carries what
    only the host knows, the ids, the positions and the width x width visibility of the tree, and the mask is a view
    of a buffer reused across steps (`MaskBuffer`). The mask is valid until the next call for the same device.
    """
    tokens = np.asarray([pending_token] + list(tree.tokens), dtype=np.int64)
    parents = np.asarray([-1] + list(tree.parents), dtype=np.int64)
    num_tree = len(tokens)
    if num_tree > 1 and not np.all(parents[1:] < np.arange(1, num_tree)):
        raise ValueError("draft tree parents must precede their children")
    depths = np.zeros(num_tree, dtype=np.int64)
    for i in range(1, num_tree):
        depths[i] = depths[parents[i]] + 1

    side = tree.side
    num_side = len(side.tokens) if side else 0
    width = num_tree + num_side
    visible = np.zeros((width, width), dtype=bool)
    visible[:num_tree, :num_tree] = ancestor_matrix(parents) if num_tree > 1 else True
    offsets = depths
    all_tokens = tokens
    if side:
        for j, seen in enumerate(side.sees):
            visible[num_tree + j, seen] = True
        offsets = np.concatenate([depths, np.asarray(side.offsets, dtype=np.int64)])
        all_tokens = np.concatenate([tokens, np.asarray(side.tokens, dtype=np.int64)])

    # ids, positions and visibility in one array: a single copy to the device
    packed = np.concatenate([all_tokens, offsets + cache_length, visible.ravel()]).astype(np.int64)
    on_device = torch.from_numpy(packed).to(device)
    return TreeInputs(
        input_ids=on_device[:width].unsqueeze(0),
        position_ids=on_device[width : 2 * width].unsqueeze(0),
        attention_mask=mask_buffer(device, dtype).view(on_device[2 * width :].view(width, width) != 0, cache_length),
        depths=depths,
        parents=parents,
        tokens=tokens,
        num_tree_nodes=num_tree,
    )


@dataclass
class Verdict:
    """The outcome of greedy verification: the accepted path (node 0 first) and the bonus token after it."""

    path: list[int]  # tree nodes root..last accepted, node 0 included
    accepted_tokens: list[int]  # draft tokens on the path (node 0 excluded)
    bonus: int  # the target's greedy token after the last accepted node
    predictions: list[int]  # argmax at every tree node


def verify_greedy(inputs: TreeInputs, tree_logits: torch.Tensor) -> Verdict:
    """Greedy tree verification: the longest root path whose every draft equals the target's argmax at its parent.

    A node is accepted when its parent is accepted and its token is the parent's argmax. The deepest accepted
    node wins; among equally deep ones the first in layout order (for a trie both hold the same tokens).
    """
    predictions = tree_logits.argmax(dim=-1).tolist()
    tokens, parents, depths = inputs.tokens, inputs.parents, inputs.depths
    accepted = [True] + [False] * (inputs.num_tree_nodes - 1)
    best = 0
    for i in range(1, inputs.num_tree_nodes):
        parent = parents[i]
        if accepted[parent] and tokens[i] == predictions[parent]:
            accepted[i] = True
            if depths[i] > depths[best]:
                best = i
    path = [best]
    while path[-1] != 0:
        path.append(int(parents[path[-1]]))
    path.reverse()
    return Verdict(
        path=path,
        accepted_tokens=[int(tokens[i]) for i in path[1:]],
        bonus=predictions[best],
        predictions=predictions,
    )


def verify_rows(inputs: TreeInputs, tree_logits: torch.Tensor, rows: list[list[int]]) -> Verdict:
    """Greedy verification over explicit rows (docs/engine.md, Bookkeeping): in each row the longest prefix whose every token
    equals the target's argmax at the previous entry of the row; the first longest row wins.

    When the rows are the tree's root-to-leaf paths this equals `verify_greedy`. Rows that are not parent chains
    (Full Tree Attention) compare a node with logits computed under another ancestry: not exact.
    """
    predictions = tree_logits.argmax(dim=-1).tolist()
    tokens = inputs.tokens
    best_row, best_length = [0], 0
    for row in rows:
        length = 0
        while length + 1 < len(row) and tokens[row[length + 1]] == predictions[row[length]]:
            length += 1
        if length > best_length:
            best_row, best_length = row, length
    path = [int(i) for i in best_row[: best_length + 1]]
    return Verdict(
        path=path,
        accepted_tokens=[int(tokens[i]) for i in path[1:]],
        bonus=predictions[path[-1]],
        predictions=predictions,
    )
