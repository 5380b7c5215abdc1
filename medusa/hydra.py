"""Hydra on the engine (docs/methods/hydra.md): Medusa's static tree, filled by sequentially dependent heads.

After each step the prefix layer (Hydra++) reads the target's last hidden states of the newly committed tokens
into its own KV cache, which always holds exactly the committed tokens. Drafting goes depth by depth: head d reads
the prefix state of the last committed token and the embeddings of the pending token and of the path drafted down
to the node, so each node's children depend on its own tokens (a true token tree, unlike Medusa's). The engine
verifies the tree: greedy output is the target's whatever the heads propose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from evaluation.engine.errors import HarnessError
from evaluation.engine.kv_cache import PositionalKVCache
from evaluation.engine.method import DecodeState, StepOutcome
from evaluation.engine.options import require_choice, require_int_range
from evaluation.engine.tree import DraftTree
from drafts.tree import StaticTree
from medusa.heads import check_heads_source
from medusa.hydra_heads import HydraHeads, load_hydra_heads
from medusa.method import CommittedHeads
from medusa.tree import STATIC_TREES

class Hydra(CommittedHeads):
    """Hydra++: a prefix layer over the committed states, heads conditioned on their path, a static tree."""

    needs_hidden_states = True
    hidden_state_layers = (-1,)  # the last layer after the final norm (upstream's hidden_state_offset 0)
    trained_family = "hydra"
    checkpoint_kind = "hydra"

    @dataclass
    class Config:
        heads: Optional[str] = None  # null: committed, else released (conf/checkpoints.yaml); random; a folder; a hub id
        num_heads: int = 4
        tree: str = "mc_sim_7b_63"  # upstream's hydra_choices are Medusa's list
        seed: int = 0  # initialisation seed of heads=random

        def check(self) -> None:
            check_heads_source(self.heads, self.seed)
            require_int_range("num_heads", self.num_heads, 1, 16)
            require_choice("tree", self.tree, sorted(STATIC_TREES))

    def __init__(self, config, model):
        config.check()
        super().__init__(config, model)
        self.tree = StaticTree.from_paths(STATIC_TREES[config.tree])
        self.depth = max(len(p) for p in self.tree.paths)
        if self.depth > config.num_heads:
            raise HarnessError(f"tree {config.tree} is {self.depth} deep; it needs as many heads, num_heads is "
                               f"{config.num_heads}")
        self.heads = self._build_heads(config, model).to(device=model.device, dtype=model.dtype).eval()
        self.embed = model.model.get_input_embeddings()
        # per depth, the nodes whose children it drafts (-1: the pending token), and each one's children
        self.expanding = [(-1,), *(nodes for nodes in self.tree.expanded_by_depth if nodes)]
        self.children = {-1: tuple(i for i, p in enumerate(self.tree.parents) if p == -1),
                         **dict(enumerate(self.tree.children_of))}
        self.cache = PositionalKVCache(1, int(model.max_context) + 2 * (len(self.tree.paths) + 1))
        self.prefix_state: torch.Tensor | None = None  # [H] P of the last committed token

    def _build_heads(self, config, lm) -> HydraHeads:
        if config.heads == "random":
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                heads = HydraHeads.for_target(lm.model, config.num_heads)
                for head in heads.heads:  # random blocks: heads that differ from the target's own head
                    torch.nn.init.normal_(head.conditioned.linear.weight, std=0.02)
                    torch.nn.init.normal_(head.shared.linear.weight, std=0.02)
            return heads
        return load_hydra_heads(self.checkpoint_source(config, lm.name), lm.model, config.num_heads)

    @property
    def max_nodes(self) -> int:
        return len(self.tree.paths)

    # ------------------------------------------------------------------------------------------------ state
    @torch.inference_mode()
    def _extend_prefix(self, hidden: torch.Tensor) -> None:
        """Run the prefix layer over the target states `hidden` [n, H] of the next committed positions."""
        n, start = hidden.shape[0], self.cache.length
        device, dtype = hidden.device, hidden.dtype
        positions = torch.arange(start, start + n, device=device)[None]
        mask = torch.zeros((n, start + n), dtype=dtype, device=device)
        mask[:, start:] = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype, device=device).triu_(1)
        states = self.heads.prefix_states(hidden[None].to(dtype), positions, mask[None, None], self.cache)
        self.prefix_state = states[0, -1]

    def reset(self, prompt_ids, hidden_states=None) -> None:
        self.cache.crop(0)
        self._extend_prefix(hidden_states)

    def update(self, state: DecodeState, outcome: StepOutcome) -> None:
        # The pending token and the accepted nodes are committed now: their states join the prefix.
        self._extend_prefix(outcome.hidden_states[outcome.verdict.path])

    # ------------------------------------------------------------------------------------------------ draft
    @torch.inference_mode()
    def draft(self, state: DecodeState) -> DraftTree:
        tree = self.tree
        tokens = [0] * len(tree.paths)
        root = torch.tensor([state.tokens[-1]], device=self.prefix_state.device)
        inputs = {-1: torch.cat((self.prefix_state, self.embed(root)[0]))}  # node -> [P ; emb(root) ; emb(path)]
        for d, nodes in enumerate(self.expanding):  # head d fills depth d + 1
            rows = torch.stack([inputs[n] for n in nodes])
            ranked = self.heads.target_ids(self.heads.heads[d](rows).topk(tree.top_k, dim=-1).indices).tolist()
            for b, node in enumerate(nodes):
                for child in self.children[node]:
                    tokens[child] = ranked[b][tree.ranks[child]]
            grown = self.expanding[d + 1] if d + 1 < len(self.expanding) else ()
            if grown:
                embedded = self.embed(torch.tensor([tokens[n] for n in grown], device=root.device))
                for n, row in zip(grown, embedded):
                    inputs[n] = torch.cat((inputs[tree.parents[n]], row))
        return DraftTree(tokens, [p + 1 for p in tree.parents])
