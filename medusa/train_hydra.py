"""Hydra++'s heads on the shared trainer (drafts/train.py; conf/family/hydra.yaml; docs/methods/hydra.md, Training),
upstream's recipe (`hydra/train/train.py`):
  - The prefix layer runs causally over the target's last states; head k at position t reads the prefix state and
    the embeddings of the text's tokens t + 1 .. t + k + 1 (teacher forcing: the true tokens as its path) and is
    trained with the cross-entropy against the target's own distribution for token t + k + 2 (the teacher loss,
    weight 1; no label loss), on assistant tokens, summed over heads; dropout 0.2 in the heads.
  - With a reduced vocabulary the target's distribution is taken over the draft's tokens (its logits at those
    rows, renormalised), the only tokens a head can propose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from drafts.data import training_vocabulary
from drafts.family import Family, last_states
from medusa.hydra_heads import HydraHeads
from medusa.train import per_head_accuracy


def new_hydra_heads(lm, options) -> HydraHeads:
    return HydraHeads.for_target(lm.model, options.medusa_heads, vocab_ids=training_vocabulary(lm, options))


def causal_mask(attention: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, L, L] additive mask: a position sees itself and the real positions before it."""
    length = attention.shape[1]
    allowed = torch.ones(length, length, dtype=torch.bool, device=attention.device).tril()[None] \
        & attention.bool()[:, None, :]
    return torch.zeros(allowed.shape, dtype=dtype, device=attention.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)[:, None]


def prefix_over(heads: HydraHeads, hidden: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The prefix states of whole sequences (training and evaluation: no cache)."""
    positions = torch.arange(hidden.shape[1], device=hidden.device)[None].expand(hidden.shape[0], -1)
    return heads.prefix_states(hidden, positions, causal_mask(attention, hidden.dtype), None)


def head_inputs(prefix: torch.Tensor, embeddings: torch.Tensor, k: int, span: int) -> torch.Tensor:
    """[B, span, (k + 2) H]: at t, the prefix state and the embeddings of tokens t + 1 .. t + k + 1."""
    return torch.cat([prefix[:, :span], *(embeddings[:, 1 + j: 1 + j + span] for j in range(k + 1))], dim=-1)


class HydraLoss(nn.Module):
    """The heads with upstream's teacher loss as their forward; `teacher_rows` = the target head's rows of the
    draft vocabulary."""

    def __init__(self, heads: HydraHeads, teacher_rows: torch.Tensor):
        super().__init__()
        self.heads = heads
        self.register_buffer("teacher_rows", teacher_rows.detach().float(), persistent=False)

    def forward(self, hidden: torch.Tensor, embeddings: torch.Tensor, attention: torch.Tensor,
                loss_mask: torch.Tensor):
        """hidden and embeddings [B, L, H] (the target's last states and its token embeddings), attention and
        loss_mask [B, L]. Returns the loss and, per head, its cross-entropy."""
        length = hidden.shape[1]
        prefix = prefix_over(self.heads, hidden, attention)
        loss, parts = hidden.new_zeros(()), {}
        count = loss_mask[:, 2:].sum() + 1e-5
        for k, head in enumerate(self.heads.heads):
            span = length - k - 2
            if span <= 0:
                break
            rows = loss_mask[:, k + 2:].bool()
            with torch.no_grad():  # the target's distribution of token t + k + 2, read at t + k + 1
                teacher = F.softmax(F.linear(hidden[:, k + 1: k + 1 + span][rows], self.teacher_rows).float(), -1)
            logits = head(head_inputs(prefix, embeddings, k, span)[rows])
            term = -(teacher * F.log_softmax(logits.float(), -1)).sum() / count
            loss = loss + term
            parts[f"ce{k + 1}"] = float(term.detach())
        return loss, parts


def hydra_head_accuracy(heads: HydraHeads, target, items, max_prompt: int = 768) -> dict:
    """Hydra: head k reads the prefix state at t and, as its path, the continuation's own tokens t + 1 .. t + k + 1."""
    embed = target.get_input_embeddings()

    def top_tokens(ids, hidden):
        prefix = prefix_over(heads, hidden, torch.ones_like(ids))
        embeddings = embed(ids).to(hidden.dtype)
        return lambda k, start, span: heads.target_ids(
            heads.heads[k](head_inputs(prefix, embeddings, k, span)[0, start:]).argmax(-1))

    return per_head_accuracy(heads, target, items, top_tokens, max_prompt)


class HydraFamily(Family):
    def build(self, lm, options, generator):
        heads = new_hydra_heads(lm, options).to(lm.device, torch.float32)
        weight = lm.model.get_output_embeddings().weight.detach()
        ids = heads.vocab_ids
        return heads, HydraLoss(heads, weight if ids is None else weight[ids.to(weight.device)])

    def loss(self, trainer, batch):
        """The last states, the embeddings of the true tokens, the target's distributions."""
        with torch.no_grad():
            embeddings = trainer.lm.model.get_input_embeddings()(batch["input_ids"]).float()
        return trainer.model(last_states(trainer.lm, batch), embeddings, batch["attention_mask"], batch["loss_mask"])

    def accuracy(self, draft, target, heldout):
        return hydra_head_accuracy(draft, target, heldout)


FAMILY = HydraFamily()
