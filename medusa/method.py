"""Medusa-1 on the engine (docs/methods/medusa.md): a static tree filled from the heads' top predictions.

After each step the heads run once on the target's last hidden state at the last accepted node (the state that gave
the pending token). Node (c1, ..., cd) of the tree is the c_d-th best token of head d - 1 there: upstream's tree,
where a node's token depends only on its depth and rank. The engine verifies the tree, so greedy output is the
target's whatever the heads propose.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from evaluation.checkpoints import PairedCheckpoint
from evaluation.engine.errors import HarnessError, require
from evaluation.engine.method import DecodeState, Method, StepOutcome
from evaluation.engine.options import require_choice, require_int_range
from evaluation.engine.tree import DraftTree
from drafts.tree import StaticTree
from medusa.heads import MedusaHeads, check_heads_source, load_heads
from medusa.tree import STATIC_TREES

class CommittedHeads(PairedCheckpoint, Method):
    """A method whose trained heads are committed per target model (its `trained_family`'s folder)."""

    checkpoint_option = "heads"
    fallback = " (or method.heads=random)"

    @classmethod
    def input_files(cls, config, model_name: str) -> dict[str, Path]:
        if config.heads is None:
            return {"heads": cls.committed_dir(model_name)}
        path = Path(str(config.heads)).expanduser()
        return {"heads": path} if path.is_dir() else {}


class Medusa(CommittedHeads):
    """Medusa-1: K heads, one static tree, no draft KV cache."""

    needs_hidden_states = True
    hidden_state_layers = (-1,)  # the last layer after the final norm, what the heads were trained on
    trained_family = "medusa"
    checkpoint_kind = "medusa"

    @dataclass
    class Config:
        heads: Optional[str] = None  # null: committed, else released (conf/checkpoints.yaml); random; a folder; a hub id
        num_heads: int = 4  # heads used (Spec-Bench: 4 of the 5 the Vicuna checkpoints hold)
        tree: str = "mc_sim_7b_63"
        draft_vocab: Optional[int] = None  # random heads only: project onto N seeded random target ids
        seed: int = 0  # initialisation seed of heads=random

        def check(self) -> None:
            check_heads_source(self.heads, self.seed)
            require_int_range("num_heads", self.num_heads, 1, 16)
            require_choice("tree", self.tree, sorted(STATIC_TREES))
            if self.draft_vocab is not None:
                require_int_range("draft_vocab", self.draft_vocab, 16)
                require(self.heads == "random", "draft_vocab", self.draft_vocab,
                        "null unless heads=random (trained heads keep the vocabulary they were trained on)")

    def __init__(self, config, model):
        config.check()
        super().__init__(config, model)
        self.tree = StaticTree.from_paths(STATIC_TREES[config.tree])
        depth = max(len(p) for p in self.tree.paths)
        if depth > config.num_heads:
            raise HarnessError(f"tree {config.tree} is {depth} deep; it needs as many heads, num_heads is "
                               f"{config.num_heads}")
        self.heads = self._build_heads(config, model).to(device=model.device, dtype=model.dtype).eval()
        if self.heads.vocab < self.tree.top_k:
            raise HarnessError(f"tree {config.tree} ranks {self.tree.top_k} tokens per head; the heads have "
                               f"{self.heads.vocab}")
        self.depth = depth
        self.hidden: torch.Tensor | None = None  # [H] the state the next draft reads

    def _build_heads(self, config, lm) -> MedusaHeads:
        if config.heads == "random":
            vocab_ids = None
            if config.draft_vocab is not None:
                vocab = lm.model.config.vocab_size
                require(config.draft_vocab <= vocab, "draft_vocab", config.draft_vocab,
                        f"at most the vocabulary size {vocab}")
                generator = torch.Generator().manual_seed(config.seed)
                vocab_ids = torch.sort(torch.randperm(vocab, generator=generator)[: config.draft_vocab]).values
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                heads = MedusaHeads.for_target(lm.model, config.num_heads, vocab_ids=vocab_ids)
                for head in heads:  # random blocks: heads that differ from the target's own head
                    torch.nn.init.normal_(head[0].linear.weight, std=0.02)
            return heads
        return load_heads(self.checkpoint_source(config, lm.name), lm.model, config.num_heads)

    @property
    def max_nodes(self) -> int:
        return len(self.tree.paths)

    def reset(self, prompt_ids, hidden_states=None) -> None:
        self.hidden = hidden_states[-1]

    @torch.inference_mode()
    def draft(self, state: DecodeState) -> DraftTree:
        logits = self.heads(self.hidden, self.depth)  # [depth, vocab]
        ranked = self.heads.target_ids(logits.topk(self.tree.top_k, dim=-1).indices).tolist()
        tokens = [ranked[len(path) - 1][path[-1]] for path in self.tree.paths]
        return DraftTree(tokens, [p + 1 for p in self.tree.parents])

    def update(self, state: DecodeState, outcome: StepOutcome) -> None:
        # The last accepted node's state gave the new pending token: the heads read it next step.
        self.hidden = outcome.hidden_states[outcome.verdict.path[-1]]
