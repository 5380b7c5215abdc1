"""Gumiho on the shared engine (docs/methods/gumiho.md): the serial draft's two layers give depths 1-2, its
parallel MLP heads depths 3-7 at once, expanded by beam search with pruning; the trained-draft machinery is
`drafts.method.TreeDraftMethod`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from drafts.method import DRAFT_PARTS, Beams, TreeDraftMethod, check_draft_source
from drafts.tree import Pool, expand, layout, select_nodes
from evaluation.engine.errors import HarnessError, require
from evaluation.engine.options import MAX_DRAFT_NODES, require_int_range

SIBLING_MASKS = ("causal", "tree")
MLP_FIRST_SLOTS = ("index", "parent")


@dataclass
class GumihoConfig:
    # null: the committed draft for the model (gumiho/drafts/<model>/); "random": a seeded random draft (lossless,
    # accepts almost nothing); otherwise a draft folder or a hub id (e.g. amd/Gumiho-llama3-8b).
    draft: Optional[str] = None
    seed: int = 0  # initialisation seed of a random draft
    top_k: int = 14  # branching of levels 1-2 and the number of serial beams
    total_tokens: int = 64  # tree nodes, the pending token included
    depth: int = 6  # depth - mlp_num = serial steps after level 1
    mlp_num: int = 5  # parallel heads used (depths 3..)
    mlptopk: int = 35  # tokens expanded per beam at each MLP level
    pruning: int = 35  # beams kept per MLP level
    fta: bool = False  # Full Tree Attention rows (upstream 1): not exact, see docs/methods/gumiho.md
    sibling_mask: str = "causal"  # upstream: level-2 siblings see earlier siblings; "tree": only their ancestors
    mlp_first_slot: str = "index"  # upstream: the c-th level-1 pair; "parent": the candidate's own parent's pair
    draft_vocab: Optional[int] = None  # null: the whole vocabulary; N: the N tokens most frequent in training

    def check(self) -> None:
        require_int_range("top_k", self.top_k, 1, 1024)
        require_int_range("total_tokens", self.total_tokens, 1, MAX_DRAFT_NODES)
        require(0 <= self.mlp_num <= 5, "mlp_num", self.mlp_num, "0..5 (the draft's heads)")
        require_int_range("depth", self.depth, self.mlp_num + 1, 64)
        require_int_range("mlptopk", self.mlptopk, 1, 1024)
        require_int_range("pruning", self.pruning, 1, 1024)
        require(self.sibling_mask in SIBLING_MASKS, "sibling_mask", self.sibling_mask, " or ".join(SIBLING_MASKS))
        require(self.mlp_first_slot in MLP_FIRST_SLOTS, "mlp_first_slot", self.mlp_first_slot,
                " or ".join(MLP_FIRST_SLOTS))
        check_draft_source(self.draft, self.seed, self.draft_vocab)


class Gumiho(TreeDraftMethod):
    """Serial draft layers for depths 1-2, parallel MLP heads for depths 3-7, a dynamic top-k tree."""

    Config = GumihoConfig
    draft_parts = DRAFT_PARTS

    def __init__(self, config: GumihoConfig, model):
        config.check()
        super().__init__(config, model)
        if config.mlp_num > self.draft_model.mlp_num:
            raise HarnessError(f"method.mlp_num={config.mlp_num} but the draft has {self.draft_model.mlp_num} heads")

    def _serial_steps(self) -> int:
        return self.config.depth - self.config.mlp_num

    def _grow(self, pool: Pool, beams: Beams, context: int) -> tuple[list[int], list[int]]:
        cfg = self.config
        # The pairs each serial level fed, for the MLP input: (features, tokens, parent beam in the level before).
        pairs = [(beams.features, beams.tokens, None)]
        for level in range(self.serial_steps):
            out = self._serial_level(beams, context, level, cfg.sibling_mask == "causal")
            first_row = self.cache.length - context - len(beams.pool_index)
            _, kept = expand(beams.scores, self._log_probs(out, "serial"), cfg.top_k, cfg.top_k, self.vocab_ids)
            beam = kept.beam.tolist()
            index = pool.add(kept.tokens.tolist(), kept.scores.tolist(), [beams.pool_index[b] for b in beam])
            beams = Beams(out[kept.beam], kept.tokens, kept.scores, index,
                           [beams.rows[b] + [first_row + b] for b in beam])
            pairs.append((beams.features, beams.tokens, kept.beam))
        self._lap("serial")
        if cfg.mlp_num:
            self._mlp_levels(pool, beams, pairs)
            self._lap("mlp")
        return layout(pool, select_nodes(pool, cfg.total_tokens - 1))

    def _mlp_levels(self, pool: Pool, beams: Beams, pairs) -> None:
        cfg, draft = self.config, self.draft_model
        (features1, tokens1, _), (features2, tokens2, parent) = pairs[-2], pairs[-1]
        if cfg.mlp_first_slot == "parent":
            features1, tokens1 = features1[parent], tokens1[parent]
        else:  # upstream: the c-th pair of the level before, whatever c's parent is
            count = tokens2.shape[0]
            features1, tokens1 = features1[:count], tokens1[:count]
        v = torch.cat((draft.pair_input(tokens1, features1), draft.pair_input(tokens2, features2)), dim=-1)
        # One pass through the vocabulary head for all heads: on a CPU its weights' memory traffic is the cost.
        head_lp = self._log_probs(torch.stack(draft.heads(v)[: cfg.mlp_num], dim=1), "mlp")  # [B, mlp, V]
        anchor = torch.arange(head_lp.shape[0], device=head_lp.device)
        scores, pool_index = beams.scores, beams.pool_index
        for i in range(cfg.mlp_num):
            _, kept = expand(scores, head_lp[anchor, i], cfg.mlptopk, cfg.pruning, self.vocab_ids)
            beam = kept.beam.tolist()
            pool_index = pool.add(kept.tokens.tolist(), kept.scores.tolist(), [pool_index[b] for b in beam])
            scores, anchor = kept.scores, anchor[kept.beam]
