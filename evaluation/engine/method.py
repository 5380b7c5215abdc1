"""The interface every decoding method implements: draft a tree, then learn from what was accepted.

The decode loop (`evaluation.engine.loop`) owns the model, the cache, verification and timing; a method only
proposes tokens. A new method is one class with a `Config` dataclass of its options, and one YAML file,
`conf/method/<name>.yaml`, that names the class (`_target_`), says how it shows in tables (`display`) and gives
the options' values (checked against `Config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from evaluation.engine.sampling import Sampler
from evaluation.engine.tree import DraftTree, Verdict


@dataclass
class DecodeState:
    """What a method may read when it drafts: the committed tokens and the logits behind the pending one."""

    tokens: list[int]  # prompt + generated; tokens[-1] is the pending token (exact, not yet fed to the model)
    prompt_length: int
    # [vocab] target logits tokens[-1] was chosen from (their argmax when greedy); when the prefill stopped short,
    # at the first step the logits after tokens[-2] (tokens[-1] is then the prompt's own last token)
    last_logits: torch.Tensor
    max_new_tokens: int
    # The run's sampler at temperature > 0 (None when greedy): its processed distribution and its seeded generator,
    # for a method that draws its drafts at random (then handing their distribution in `DraftTree.draft_probs`)
    sampler: Sampler | None = None

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
    # [nodes, width] the target's hidden states at the layers the method asks for (`hidden_state_layers`), side by
    # side; None when it asks for none
    hidden_states: torch.Tensor | None
    # When the draft budget cut the tree: the proposed index of each verified node (node 0 first), so a method
    # can map the verified nodes (verdict.path, tree_logits rows) back to what it drafted. None: nothing was cut.
    proposed_index: np.ndarray | None = None
    # False when the draft budget skipped drafting this step (`draft` was not called; the tree was empty), so a
    # method that keeps state from its last draft must not use it.
    drafted: bool = True
    # Why the answer ended, on the step that completed it and on any step past it ("stop_token", "max_new_tokens";
    # "" while it grows). Only a method that `learns_past_answer` sees a non-empty one.
    stop_reason: str = ""


@dataclass
class NoOptions:
    """Options of a method that has none."""

    def check(self) -> None:
        """Ranges and relations of the options; raises `evaluation.engine.errors.OptionError`. Nothing to check here."""


# Values of a method's `first_step` option, for methods that offer `prefill_stops_short`: `prompt_end` has the
# prefill stop one token short and the first step grow its draft below the last prompt token, `after_prefill` drafts
# first below the first generated token.
FIRST_STEPS = ("prompt_end", "after_prefill")


class Method:
    """Base class of decoding methods. The default drafts nothing, which is vanilla greedy decoding."""

    Config: ClassVar[type] = NoOptions
    needs_hidden_states: ClassVar[bool] = False
    # With `needs_hidden_states`: which of the target's hidden states, as transformers numbers them with
    # `output_hidden_states` (0: the embeddings, l: the output of layer l - 1, -1: the last layer after the final
    # norm), concatenated in this order. A method may set it per instance (e.g. from the target's layer count).
    hidden_state_layers: tuple[int, ...] = (-1,)
    # Hooks for reproducing an upstream loop step for step; the defaults suit every method written for this engine.
    # The prefill stops one token short: the first step verifies the last prompt token with a draft below it.
    prefill_stops_short: bool = False
    # The prefill keeps every prompt position's logits and hands them to `learn_from_prompt`.
    needs_prompt_logits: bool = False
    # `update` also runs on the step that completes the answer, and the method may decode further steps
    # (`decodes_past_answer`) whose tokens are not part of the answer: what an upstream loop that stops later than
    # `max_new_tokens`, or learns from its last step, does to the state it carries into the next turn.
    learns_past_answer: bool = False

    def __init__(self, config, model):
        self.config = config
        self.model = model

    @classmethod
    def input_files(cls, config, model_name: str) -> dict[str, Path]:
        """The files or folders beyond the target model that this method's drafts depend on (a trained draft, a
        datastore), by name, as `config` selects them for the model `model_name`. A run's identity covers their
        contents, so a draft retrained or a datastore rebuilt in place starts a new run instead of resuming the old
        one. Asked before the model loads; a path that does not exist yet is left out (the method reports it)."""
        return {}

    @classmethod
    def trained_source(cls, config, model_name: str) -> str | None:
        """The folder or hub id of the trained part (a draft, heads, a draft model) that `config` makes the method
        load for the target `model_name`; None when it loads none (no trained part, a seeded random one). Asked
        before the model loads, so a missing checkpoint is named before the target is read."""
        return None

    @classmethod
    def unavailable_reason(cls, model_name: str) -> str | None:
        """Why the method cannot run with its default options for the target `model_name` as this checkout stands
        (a trained method: no draft committed for it and none released for it), as one clause; None when it can."""
        return None

    @classmethod
    def ready_for(cls, model_name: str) -> bool:
        """Whether the method runs with its default options for the target `model_name`; a bench leaves it out
        otherwise, saying why (`unavailable_reason`)."""
        return cls.unavailable_reason(model_name) is None

    @property
    def max_nodes(self) -> int:
        """An upper bound on draft plus side nodes per step; the cache reserves that many slots."""
        return 0

    def reset(self, prompt_ids: list[int], hidden_states: torch.Tensor | None = None) -> None:
        """Called at the start of every turn with the full prompt (earlier turns included), and with the prompt's
        hidden states [prompt, width] when the method asks for them (`needs_hidden_states`, `hidden_state_layers`)."""

    def learn_from_prompt(self, token_ids: list[int], logits: torch.Tensor) -> None:
        """With `needs_prompt_logits`: the prefilled tokens and their logits [tokens, vocab] (row i: after token i)."""

    def decodes_past_answer(self, state: DecodeState) -> bool:
        """With `learns_past_answer`, asked after each step once the answer is complete: whether to decode one more
        step. `state.tokens` then holds every committed token, cut only at a stop token."""
        return False

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
