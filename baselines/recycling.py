"""Token Recycling (docs/methods/recycling.md): a static tree template filled from the successors the target recently predicted.

An adjacency matrix holds, for every vocabulary token, the top-8 tokens of the target's logits the last time that
token sat at a verified tree node, in or out of the accepted path ("recycled" candidates). Each step fills a fixed
template (upstream "2.2.2": 80 nodes below the pending token, in depth order) layer by layer from the matrix: a
node of rank k below a node holding token t drafts `adj[t, k]`. After verification every node's row is rewritten.
See docs/methods/recycling.md for the scope of the matrix, the duplicate rule and what differs from upstream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from evaluation.engine.method import FIRST_STEPS, DecodeState, Method, StepOutcome
from evaluation.engine.tree import DraftTree
from evaluation.engine.errors import require

SUCCESSORS = 8  # columns of the adjacency matrix: the top-k kept per token (upstream hard-codes 8)

# Templates: each node is its path of child ranks below the pending token, parents listed before children.
TEMPLATES: dict[str, list[list[int]]] = {
    # Spec-Bench model/recycling/tree_template_.py, version "2.2.2": 80 nodes, per depth 8, 21, 25, 15, 8, 3.
    "2.2.2": [
        [0], [1], [2], [3], [4], [5], [6], [7],
        [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [1, 0], [1, 1], [1, 2], [1, 3], [2, 0],
        [2, 1], [2, 2], [3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0],
        [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 0, 6], [0, 0, 7], [0, 1, 0],
        [0, 1, 1], [0, 1, 2], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0],
        [1, 0, 0], [1, 0, 1], [1, 1, 0], [2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0],
        [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 1, 1],
        [0, 0, 2, 0], [0, 0, 3, 0], [0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0],
        [3, 0, 0, 0],
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0],
        [0, 1, 0, 0, 0], [1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0],
    ],
    # SAM-Decoding's token-recycling tree (Spec-Bench model/samd/config/token_recycle.json, children in rank
    # order): 60 nodes, per depth 7, 20, 21, 8, 4. The tree of SAM-Decoding's "SAM[TR]".
    "samd": [
        [0], [1], [2], [3], [4], [5], [6],
        [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [1, 0], [1, 1], [1, 2], [1, 3], [1, 4], [2, 0], [2, 1],
        [2, 2], [3, 0], [3, 1], [4, 0], [4, 1], [5, 0], [6, 0],
        [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0],
        [1, 0, 0], [1, 0, 1], [1, 0, 2], [1, 1, 0], [1, 1, 1], [1, 2, 0], [1, 3, 0], [2, 0, 0], [2, 1, 0],
        [3, 0, 0], [4, 0, 0], [5, 0, 0],
        [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 1], [1, 1, 0, 0],
        [2, 0, 0, 0],
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0],
    ],
}
SCOPES = ("process", "question", "turn")
ENDS_OF_TURN = ("upstream", "answer")


class Template:
    """A template as arrays: node i (1-based; 0 is the pending token) has a parent, a rank and a depth."""

    def __init__(self, paths: list[list[int]]):
        index = {(): 0}
        parents, ranks, depths = [], [], []
        for i, path in enumerate(paths, start=1):
            path = tuple(path)
            if path[:-1] not in index:
                raise ValueError(f"template node {list(path)} comes before its parent")
            if depths and len(path) < depths[-1]:
                raise ValueError("template nodes must be sorted by depth")
            index[path] = i
            parents.append(index[path[:-1]])
            ranks.append(path[-1])
            depths.append(len(path))
        self.parents = np.asarray([-1] + parents, dtype=np.int64)
        self.ranks = np.asarray([0] + ranks, dtype=np.int64)
        self.depths = np.asarray([0] + depths, dtype=np.int64)
        # [start, end) of each depth layer: a layer's parents all lie in earlier layers.
        bounds = np.flatnonzero(np.diff(self.depths)) + 1
        self.layers = list(zip(bounds.tolist(), bounds[1:].tolist() + [len(self.depths)]))

    def __len__(self) -> int:
        return len(self.parents) - 1  # draft nodes, the pending token excluded


class AdjacencyDrafter:
    """The adjacency matrix and its template: draft below the pending token, learn from every verified node.

    Also the drafter SAM-Decoding falls back on (baselines/sam.py), hence `update`'s explicit node tokens.
    """

    needs_hidden_states = False

    def __init__(self, vocab_size: int, template: str = "2.2.2", scope: str = "process",
                 draft_unseen: bool = True, prefill_row: bool = True):
        self.template = Template(TEMPLATES[template])
        self.scope = scope
        self.draft_unseen = draft_unseen
        self.adjacency = torch.zeros((vocab_size, SUCCESSORS), dtype=torch.long)  # upstream: zeros, once
        self.rows = self.adjacency.numpy()  # a view for cheap numpy gathers while drafting
        self.seen = np.zeros(vocab_size, dtype=bool)  # rows written at least once
        self.previous_prompt: list[int] | None = None
        # Whether the first step records the prefill's last logits as the last prompt token's row (`observe`):
        # false when that row comes from elsewhere (the first step's own node 0, or every prompt row).
        self.prefill_row = prefill_row
        self.prefill_row_due = False

    @property
    def max_nodes(self) -> int:
        return len(self.template)

    def clear(self) -> None:
        self.adjacency.zero_()
        self.seen[:] = False

    def reset(self, prompt_ids: list[int], hidden_states=None) -> None:
        """A new turn. `question` scope keeps the matrix when this prompt extends the previous turn's prompt (a
        later turn of the same conversation); `turn` clears it every turn; `process` never (upstream)."""
        continues = (self.previous_prompt is not None and len(prompt_ids) > len(self.previous_prompt)
                     and prompt_ids[: len(self.previous_prompt)] == self.previous_prompt)
        if self.scope == "turn" or (self.scope == "question" and not continues):
            self.clear()
        self.previous_prompt = list(prompt_ids)
        self.prefill_row_due = self.prefill_row

    def learn(self, node_tokens: np.ndarray, logits: torch.Tensor) -> None:
        """`adj[token] = topk(logits, 8)` for every node; a token at several nodes keeps its last node's row."""
        reversed_tokens = node_tokens[::-1]
        unique, first_in_reversed = np.unique(reversed_tokens, return_index=True)
        rows = len(node_tokens) - 1 - first_in_reversed
        # topk over all rows, then pick rows: cheaper than gathering the [rows, vocab] logits first.
        top = torch.topk(logits, SUCCESSORS, dim=-1).indices.cpu()
        self.adjacency.index_copy_(0, torch.from_numpy(unique), top[torch.from_numpy(rows)])
        self.seen[unique] = True

    def observe(self, state: DecodeState) -> None:
        """At a turn's first step, record the prefill's logits as the row of the last prompt token (upstream's
        first root); later rows come from `update`."""
        if self.prefill_row_due:
            self.prefill_row_due = False
            if len(state.tokens) >= 2:
                self.learn(np.asarray(state.tokens[-2:-1], dtype=np.int64), state.last_logits[None])

    def draft(self, state: DecodeState) -> DraftTree:
        self.observe(state)
        t = self.template
        tokens = np.empty(len(t.parents), dtype=np.int64)
        tokens[0] = state.tokens[-1]
        for start, end in t.layers:
            tokens[start:end] = self.rows[tokens[t.parents[start:end]], t.ranks[start:end]]
        if self.draft_unseen:
            return DraftTree(tokens[1:].tolist(), t.parents[1:].tolist())
        # Drop nodes below a token whose row was never written (upstream drafts token 0 there), and their subtrees.
        keep = np.ones(len(tokens), dtype=bool)
        for start, end in t.layers:
            parents = t.parents[start:end]
            keep[start:end] = keep[parents] & self.seen[tokens[parents]]
        new_index = np.cumsum(keep) - 1
        kept = np.flatnonzero(keep)[1:]
        return DraftTree(tokens[kept].tolist(), new_index[t.parents[kept]].tolist())

    def update(self, state: DecodeState, outcome: StepOutcome, node_tokens: np.ndarray) -> None:
        self.learn(verified_tokens(node_tokens, state, outcome), outcome.tree_logits)


def verified_tokens(node_tokens: np.ndarray, state: DecodeState, outcome: StepOutcome) -> np.ndarray:
    """The tokens of the verified nodes (the rows of `outcome.tree_logits`): all drafted nodes, the ones a draft
    budget kept, or only the pending token when the budget skipped drafting."""
    if not outcome.drafted:
        return np.asarray([state.tokens[-1 - len(outcome.committed)]], dtype=np.int64)
    kept = outcome.proposed_index
    return node_tokens if kept is None else node_tokens[np.asarray(kept)]


def stop_among(tokens, stop_ids) -> bool:
    return any(t in stop_ids for t in tokens)


class TokenRecycling(Method):
    """Token Recycling: the template "2.2.2" filled from each token's most recent top-8 successors."""


    @dataclass
    class Config:
        template: str = "2.2.2"  # upstream's tree; "samd" is SAM-Decoding's 60-node tree
        # Lifetime of the adjacency matrix: process (upstream: one matrix for the whole run, warm-up included, so
        # answers' acceptance depends on question order), question (cleared when a new conversation starts) or
        # turn (cleared every turn).
        adjacency_scope: str = "process"
        # Upstream fills nodes below never-seen tokens from the zero rows (token 0 drafts); false drops them.
        draft_unseen: bool = True
        # prompt_end (upstream): the prefill stops before the last prompt token, the first tree is drafted below it
        # and every node's row is learnt from that step; after_prefill: the first tree is drafted below the first
        # generated token, after recording the last prompt token's row from the prefill.
        first_step: str = "prompt_end"
        # upstream: decode on until more than max_new_tokens tokens are committed (the answer keeps
        # max_new_tokens), learning from every step but the last, unless it ended at a stop token drafted as the
        # bonus; answer: stop at the answer's end without learning from its last step.
        end_of_turn: str = "upstream"

        def check(self) -> None:
            require(self.template in TEMPLATES, "template", self.template, f"one of {sorted(TEMPLATES)}")
            require(self.adjacency_scope in SCOPES, "adjacency_scope", self.adjacency_scope, f"one of {SCOPES}")
            require(self.first_step in FIRST_STEPS, "first_step", self.first_step, f"one of {FIRST_STEPS}")
            require(self.end_of_turn in ENDS_OF_TURN, "end_of_turn", self.end_of_turn, f"one of {ENDS_OF_TURN}")

    def __init__(self, config: Config, model):
        super().__init__(config, model)
        self.prefill_stops_short = config.first_step == "prompt_end"
        self.learns_past_answer = config.end_of_turn == "upstream"
        self.drafter = AdjacencyDrafter(model.model.config.vocab_size, config.template, config.adjacency_scope,
                                        config.draft_unseen, prefill_row=not self.prefill_stops_short)
        self.node_tokens = np.zeros(0, dtype=np.int64)
        self.more = False  # upstream's loop would take another step (end_of_turn: upstream)
        self.steps = 0  # tree steps in this turn

    @property
    def max_nodes(self) -> int:
        return self.drafter.max_nodes

    def reset(self, prompt_ids: list[int], hidden_states=None) -> None:
        self.drafter.reset(prompt_ids)
        self.steps = 0

    def draft(self, state: DecodeState) -> DraftTree:
        tree = self.drafter.draft(state)
        self.node_tokens = np.asarray([state.tokens[-1]] + tree.tokens, dtype=np.int64)
        return tree

    def update(self, state: DecodeState, outcome: StepOutcome) -> None:
        if self.learns_past_answer:
            # Upstream's loop: a stop token among the accepted drafts, or more than max_new_tokens committed
            # (the pending bonus not counted), ends it before the update; a stop token as the bonus, or its
            # max_new_tokens-th step, after it.
            self.steps += 1
            stop_ids = self.model.stop_ids
            learns = (not stop_among(outcome.verdict.accepted_tokens, stop_ids)
                      and state.generated - 1 <= state.max_new_tokens)
            self.more = (learns and outcome.verdict.bonus not in stop_ids
                         and self.steps < state.max_new_tokens)
            if not learns:
                return
        self.drafter.update(state, outcome, self.node_tokens)

    def decodes_past_answer(self, state: DecodeState) -> bool:
        return self.more
