"""The interface every decoding method implements: draft a tree, then learn from what was accepted.

The decode loop (`evaluation.engine.loop`) owns the model, the cache, verification and timing; a method only
proposes tokens. A new method is one class with a `Config` dataclass of its options, and one YAML file,
`conf/method/<name>.yaml`, that names the class (`_target_`), says how it shows in tables (`display`) and gives
the options' values (checked against `Config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from evaluation.engine.tree import DraftTree, Verdict


@dataclass
class DecodeState:
    """What a method may read when it drafts: the committed tokens and the logits behind the pending one."""

    tokens: list[int]  # prompt + generated; tokens[-1] is the pending token (exact, not yet fed to the model)
    prompt_length: int
    last_logits: torch.Tensor  # [vocab] target logits tokens[-1] was chosen from (their argmax when greedy)
    max_new_tokens: int

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_length


@dataclass
class StepOutcome:
    """What one verification step produced, handed back to the method's `update`."""

    committed: list[int]  # tokens appended this step: accepted drafts, then the bonus (cut at a stop or the budget)
    verdict: Verdict
    tree_logits: torch.Tensor  # [tree nodes, vocab]
    side_logits: torch.Tensor | None  # [side nodes, vocab], when the draft had side nodes
    hidden_states: torch.Tensor | None  # [nodes, hidden] last layer, when the method asks for them
    # When the draft budget cut the tree: the proposed index of each verified node (node 0 first), so a method
    # can map the verified nodes (verdict.path, tree_logits rows) back to what it drafted. None: nothing was cut.
    proposed_index: np.ndarray | None = None
    # False when the draft budget skipped drafting this step (`draft` was not called; the tree was empty), so a
    # method that keeps state from its last draft must not use it.
    drafted: bool = True


@dataclass
class NoOptions:
    """Options of a method that has none."""

    def check(self) -> None:
        """Ranges and relations of the options; raises `evaluation.engine.errors.OptionError`. Nothing to check here."""


class Method:
    """Base class of decoding methods. The default drafts nothing, which is vanilla greedy decoding."""

    Config: ClassVar[type] = NoOptions
    needs_hidden_states: ClassVar[bool] = False

    def __init__(self, config, model):
        self.config = config
        self.model = model

    @property
    def max_nodes(self) -> int:
        """An upper bound on draft plus side nodes per step; the cache reserves that many slots."""
        return 0

    def reset(self, prompt_ids: list[int], hidden_states: torch.Tensor | None = None) -> None:
        """Called at the start of every turn with the full prompt (earlier turns included), and with the prompt's
        last-layer hidden states [prompt, hidden] when the method asks for them (`needs_hidden_states`)."""

    def draft(self, state: DecodeState) -> DraftTree:
        """Propose the tokens after the pending token `state.tokens[-1]`."""
        return DraftTree()

    def update(self, state: DecodeState, outcome: StepOutcome) -> None:
        """Called after each step, drafted or not (`outcome.drafted`); `state.tokens` already includes
        `outcome.committed`."""

    def draft_detail(self) -> dict[str, float]:
        """Seconds of named sub-parts of this turn's drafting (e.g. Gumiho's serial layers and MLP heads), for the
        report's split of the `draft` part; {} when the method has none. Reset by `reset`."""
        return {}
