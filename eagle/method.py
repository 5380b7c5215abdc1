"""The EAGLE family on the shared trained-draft machinery (docs/methods/eagle.md; `drafts.method.TreeDraftMethod`).

  - `Eagle` (EAGLE-1): EAGLE's one-layer draft and a static tree of rank paths (`eagle/tree.py`): one draft
    forward per depth over the nodes that have children; a leaf's token is its parent's ranked prediction.
  - `Eagle2` (EAGLE-2): the same draft and a dynamic tree: `depth` serial levels on the `top_k` best beams, every
    expansion a candidate, the `total_tokens - 1` best by cumulative log-probability kept.
  - `GumihoSerial`: EAGLE-2's tree on the Gumiho draft with its MLP heads unused (an ablation of Gumiho).
  - `Eagle3` (EAGLE-3): EAGLE-2's tree on the EAGLE-3 draft (`eagle/draft_model.py`), which reads three target
    layers' hidden states side by side and proposes from its own, possibly reduced, vocabulary.
Every tree is verified by the engine, so greedy output equals the target's whatever the draft proposes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from drafts.method import Beams, TreeDraftMethod, check_draft_source
from drafts.serial_draft import SerialDraft
from drafts.tree import Pool, StaticTree, expand, layout, select_nodes
from eagle.tree import STATIC_TREES
from evaluation.engine.errors import HarnessError, require
from evaluation.engine.method import DecodeState
from evaluation.engine.options import MAX_DRAFT_NODES, require_int_range
from evaluation.engine.tree import DraftTree

EAGLE_LAYERS = 1  # EAGLE-1/2's draft: one decoder layer


class EagleDrafts(TreeDraftMethod):
    """EAGLE's draft (fc, one decoder layer, the target's head), committed under eagle/drafts/eagle/."""

    trained_family = "eagle"
    checkpoint_kind = "eagle"

    @classmethod
    def random_draft(cls, lm):
        return SerialDraft.for_target(lm.model, mlp_num=0, layers=EAGLE_LAYERS)

    @classmethod
    def load_draft(cls, source: str, lm):
        from drafts.checkpoint import load_draft

        draft = load_draft(source, lm.model)
        if draft.mlp_num:
            draft.mlp = draft.mlp[:0]  # a Gumiho checkpoint: its serial part is an EAGLE-style draft
            draft.mlp_num = 0
        return draft


# ----------------------------------------------------------------------------------------------- EAGLE-1
@dataclass
class EagleConfig:
    # null: the committed EAGLE draft for the model (eagle/drafts/eagle/<model>/); random; a folder or a hub id of
    # an EAGLE checkpoint (yuhuili/EAGLE-Vicuna-7B-v1.3, ...)
    draft: Optional[str] = None
    seed: int = 0
    tree: str = "mc_sim_7b_63"  # the static tree (eagle/tree.py)
    draft_vocab: Optional[int] = None  # null: the whole vocabulary; N: the N tokens most frequent in training

    def check(self) -> None:
        require(self.tree in STATIC_TREES, "tree", self.tree, " or ".join(STATIC_TREES))
        check_draft_source(self.draft, self.seed, self.draft_vocab)


class Eagle(EagleDrafts):
    """EAGLE-1: a static tree of ranked predictions."""

    Config = EagleConfig

    def __init__(self, config: EagleConfig, model):
        config.check()
        self.tree = StaticTree.from_paths(STATIC_TREES[config.tree])
        super().__init__(config, model)
        vocab = self.vocab_ids.numel() if self.vocab_ids is not None else model.model.config.vocab_size
        if vocab < self.tree.top_k:
            raise HarnessError(f"tree {config.tree} ranks {self.tree.top_k} tokens per node; the draft has {vocab}")

    def _serial_steps(self) -> int:
        return len(self.tree.expanded_by_depth)

    def _tree_rows(self) -> int:
        return sum(len(nodes) for nodes in self.tree.expanded_by_depth)

    @property
    def max_nodes(self) -> int:
        return len(self.tree.paths)

    def draft(self, state: DecodeState) -> DraftTree:
        tree = self.tree
        context = len(state.tokens) - 1
        self._lap(None)
        last = self._extend_context(state.tokens)
        tokens = [0] * len(tree.paths)
        ranked = self._top(self._log_probs(last, "serial"), tree.top_k)[1].tolist()
        for node, parent in enumerate(tree.parents):
            if parent < 0:
                tokens[node] = ranked[tree.ranks[node]]
        outputs = {-1: last}
        rows = {-1: []}  # draft-cache rows (after the context) of a node's ancestors and itself
        try:
            for level, nodes in enumerate(tree.expanded_by_depth):
                parents = [tree.parents[n] for n in nodes]
                beams = Beams(torch.stack([outputs[p] for p in parents]),
                              torch.tensor([tokens[n] for n in nodes], device=self.lm.device),
                              torch.zeros(len(nodes)), list(nodes), [rows[p] for p in parents])
                out = self._serial_level(beams, context, level, sibling_causal=False)
                first_row = self.cache.length - context - len(nodes)
                ranked = self._top(self._log_probs(out, "serial"), tree.top_k)[1].tolist()
                for b, node in enumerate(nodes):
                    outputs[node] = out[b]
                    rows[node] = rows[tree.parents[node]] + [first_row + b]
                    for child in tree.children_of[node]:
                        tokens[child] = ranked[b][tree.ranks[child]]
        finally:
            self.cache.crop(context)
        self._lap("serial")
        return DraftTree(tokens, [p + 1 for p in tree.parents])


# ----------------------------------------------------------------------------------------------- EAGLE-2
@dataclass
class Eagle2Config:
    # null: the committed draft for the model; random; a folder or a hub id of an EAGLE checkpoint
    draft: Optional[str] = None
    seed: int = 0
    top_k: int = 10  # EAGLE-2's defaults: top-k 10, 60 tree tokens, depth 5
    total_tokens: int = 60
    depth: int = 5  # serial steps after level 1
    draft_vocab: Optional[int] = None  # null: the whole vocabulary; N: the N tokens most frequent in training

    def check(self) -> None:
        require_int_range("top_k", self.top_k, 1, 1024)
        require_int_range("total_tokens", self.total_tokens, 1, MAX_DRAFT_NODES)
        require_int_range("depth", self.depth, 0, 64)
        check_draft_source(self.draft, self.seed, self.draft_vocab)


class DynamicTree(TreeDraftMethod):
    """EAGLE-2's dynamic tree: `depth` serial steps on `top_k` beams; every expansion is a candidate."""

    Config = Eagle2Config

    def __init__(self, config: Eagle2Config, model):
        config.check()
        super().__init__(config, model)

    def _serial_steps(self) -> int:
        return self.config.depth

    def _grow(self, pool: Pool, beams: Beams, context: int) -> tuple[list[int], list[int]]:
        cfg = self.config
        for level in range(self.serial_steps):
            out = self._serial_level(beams, context, level, sibling_causal=False)
            first_row = self.cache.length - context - len(beams.pool_index)
            everything, _ = expand(beams.scores, self._log_probs(out, "serial"), cfg.top_k, None, self.vocab_ids)
            index = pool.add(everything.tokens.tolist(), everything.scores.tolist(),
                             [beams.pool_index[b] for b in everything.beam.tolist()])
            order = torch.sort(-everything.scores, stable=True).indices[: cfg.top_k]
            beam = everything.beam[order].tolist()
            beams = Beams(out[everything.beam[order]], everything.tokens[order], everything.scores[order],
                          [index[i] for i in order.tolist()], [beams.rows[b] + [first_row + b] for b in beam])
        self._lap("serial")
        return layout(pool, select_nodes(pool, cfg.total_tokens - 1))


class Eagle2(DynamicTree, EagleDrafts):
    """EAGLE-2: the dynamic tree on EAGLE's draft."""


class GumihoSerial(DynamicTree):
    """EAGLE-2's dynamic tree on the committed Gumiho draft, its MLP heads unused: what Gumiho's heads add."""

    trained_family = "gumiho"


# ----------------------------------------------------------------------------------------------- EAGLE-3
class Eagle3(DynamicTree):
    """EAGLE-2's dynamic tree on the EAGLE-3 draft: fused low, middle and high target features."""

    trained_family = "eagle3"
    checkpoint_kind = "eagle3"

    @classmethod
    def load_draft(cls, source: str, lm):
        from eagle.checkpoint import load_eagle3_draft

        return load_eagle3_draft(source, lm.model)

    def _build_draft(self, config, lm):
        """A random draft's head has `draft_vocab` rows over a seeded random set of target ids (all of them by
        default); a trained draft's vocabulary is its head's, so `draft_vocab` must be null or that size."""
        from eagle.draft_model import Eagle3Draft

        if config.draft == "random":
            ids = self.draft_vocabulary(config, lm)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                draft = Eagle3Draft.for_target(lm.model, None if ids is None else ids.numel())
            if ids is not None:
                draft.set_vocabulary(ids)
            return draft.to(device=lm.device, dtype=lm.dtype).eval()
        draft = self.load_draft(self.draft_source(config, lm), lm)
        if config.draft_vocab is not None and config.draft_vocab != draft.draft_vocab_size:
            raise HarnessError(f"method.draft_vocab={config.draft_vocab}, but this EAGLE-3 draft's head has "
                               f"{draft.draft_vocab_size} tokens (fixed when it was trained): set null")
        return draft
