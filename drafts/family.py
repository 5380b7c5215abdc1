"""A trained-draft family, as the shared trainer (drafts/train.py) sees it: what it builds, its loss on one batch,
and its held-out accuracy per depth. A family is a module holding one `Family` as `FAMILY`, named by the `plugin`
key of its `conf/family/<name>.yaml` (evaluation/families.py), which also gives its output folder and its training
defaults; the trainer knows no family by name.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from evaluation.engine.errors import HarnessError


class Family:
    """The trainer's plug-in for one family of drafts (or heads)."""

    def check(self, options) -> None:
        """Refuse options this family cannot train with (`evaluation.engine.errors.require`: one line)."""

    def build(self, lm, options, generator: torch.Generator) -> tuple[nn.Module, nn.Module]:
        """(draft, trained): the draft written at the end (`drafts.checkpoint.save_draft` reads its `config`,
        `saved_fields()` and `trainable_parameters()`), and the module whose forward `loss` calls, which a
        distributed wrapper (DDP) wraps. They may be the same module."""
        raise NotImplementedError

    def loss(self, trainer, batch: dict) -> tuple[torch.Tensor, dict]:
        """The loss of one batch and its parts (for the progress bar), under the trainer's autocast.
        `trainer.model` is the wrapped `trained` module, `trainer.lm` the frozen target, `batch` holds
        `input_ids`, `attention_mask` and `loss_mask` [B, L] (`drafts.train.make_batch`)."""
        raise NotImplementedError

    def accuracy(self, draft: nn.Module, target, heldout) -> dict:
        """Held-out top-1 accuracy per depth, `{"acc1": ..., "acc2": ...}` (at most `drafts.evaluate.MAX_DEPTH`), on
        `heldout`'s (prompt ids, the target's greedy continuation) pairs."""
        raise NotImplementedError


@torch.no_grad()
def last_states(lm, batch: dict) -> torch.Tensor:
    """The frozen target's last hidden states (after its final norm) over a batch, in float32: what most drafts
    read."""
    out = lm.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True,
                   logits_to_keep=1)
    return out.hidden_states[-1].float()


def load_family(entry) -> Family:
    """The `Family` that a registry entry's plugin module holds as `FAMILY` (one line when it has none)."""
    try:
        module = importlib.import_module(entry.plugin)
    except ImportError as exc:
        raise HarnessError(f"family {entry.name!r}: cannot import its plugin {entry.plugin!r} ({exc})") from None
    found = getattr(module, "FAMILY", None)
    if not isinstance(found, Family):
        raise HarnessError(f"family {entry.name!r}: module {entry.plugin!r} holds no FAMILY (a drafts.family.Family)")
    return found
