"""Medusa heads on the shared trainer (drafts/train.py; conf/family/medusa.yaml; docs/methods/medusa.md, Training).

  - Upstream's loss (Medusa-1, `train_legacy.py`): the target frozen; head k at position t is trained with the
    cross-entropy against the text's token t + k + 2, on assistant tokens, summed over heads without weights (the
    paper's per-head decay is not in upstream's code); each projection starts as the target's head, each residual
    block as the identity.
  - A reduced vocabulary (`draft_vocab`), chosen as for EAGLE-3 (the most frequent assistant tokens of the records
    the run reads): the projections keep those rows of the target's head, and a position whose token lies outside
    is left out of the loss.
  - Held-out accuracy of head k = how often its top token at t is the target's own greedy token t + k + 2
    (`acc{k+1}`: depth k + 1 of the tree).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from drafts.data import training_vocabulary
from drafts.family import Family, last_states
from medusa.heads import MedusaHeads


def new_medusa_heads(lm, options) -> MedusaHeads:
    return MedusaHeads.for_target(lm.model, options.medusa_heads, vocab_ids=training_vocabulary(lm, options))


class MedusaLoss(nn.Module):
    """The heads with upstream's loss as their forward (so a distributed wrapper sees the call)."""

    def __init__(self, heads: MedusaHeads, vocab: int):
        super().__init__()
        self.heads = heads
        rows = torch.full((vocab,), -1, dtype=torch.long)  # target id -> projection row, -1 outside
        ids = heads.vocab_ids if heads.vocab_ids is not None else torch.arange(vocab)
        rows[ids.cpu()] = torch.arange(ids.numel())
        self.register_buffer("row_of", rows, persistent=False)

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor, loss_mask: torch.Tensor):
        """hidden [B, L, H] (the target's last states), ids and loss_mask [B, L]. Returns the loss and, per head,
        its cross-entropy."""
        length = ids.shape[1]
        loss, parts = hidden.new_zeros(()), {}
        count = loss_mask[:, 2:].sum() + 1e-5  # head 0's rows: every assistant token it can predict
        for k, head in enumerate(self.heads):
            span = length - k - 2  # t = 0..span-1 predicts token t + k + 2
            if span <= 0:
                break
            wanted = self.row_of.to(ids.device)[ids[:, k + 2:]]
            rows = loss_mask[:, k + 2:].bool() & (wanted >= 0)
            logits = head(hidden[:, :span][rows])
            term = F.cross_entropy(logits.float(), wanted[rows], reduction="sum") / count
            loss = loss + term
            parts[f"ce{k + 1}"] = float(term.detach())
        return loss, parts


@torch.no_grad()
def per_head_accuracy(heads, target, items, top_tokens, max_prompt: int = 768) -> dict:
    """{"positions": n, "acc1".."accK": float} over every continuation position of every held-out item: head k's top
    token at t against the continuation's token t + k + 2. `top_tokens(ids, hidden)` reads one item (its ids and
    the target's last states) and returns `predict(k, start, span)`: head k's top target ids at positions
    start..span-1."""
    device = next(target.parameters()).device
    correct, total = torch.zeros(heads.num_heads), torch.zeros(heads.num_heads)
    was_training = heads.training
    heads.eval()
    for prompt, continuation in items:
        prompt = prompt[-max_prompt:]
        ids = torch.tensor([prompt + list(continuation)], device=device)
        hidden = target(input_ids=ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]
        predict = top_tokens(ids, hidden.to(next(heads.parameters()).dtype))
        start, length = len(prompt) - 1, ids.shape[1]
        for k in range(heads.num_heads):
            span = length - 2 - k  # positions 0..span-1 predict token t + k + 2
            if span <= start:
                continue
            truth = ids[0, start + 2 + k: length]
            correct[k] += (predict(k, start, span) == truth).sum().item()
            total[k] += truth.numel()
    heads.train(was_training)
    result = {"positions": int(total[0].item())}
    for k in range(heads.num_heads):
        result[f"acc{k + 1}"] = float(correct[k] / total[k]) if total[k] else float("nan")
    return result


def head_accuracy(heads: MedusaHeads, target, items, max_prompt: int = 768) -> dict:
    """Medusa: head k reads the last state at t alone."""
    def top_tokens(ids, hidden):
        return lambda k, start, span: heads.target_ids(heads(hidden[0, start:span], k + 1)[k].argmax(-1))

    return per_head_accuracy(heads, target, items, top_tokens, max_prompt)


class MedusaFamily(Family):
    def build(self, lm, options, generator):
        heads = new_medusa_heads(lm, options).to(lm.device, torch.float32)
        return heads, MedusaLoss(heads, lm.model.config.vocab_size)

    def loss(self, trainer, batch):
        """Upstream's heads: the last states as they are (no noise), hard labels."""
        return trainer.model(last_states(trainer.lm, batch), batch["input_ids"], batch["loss_mask"])

    def accuracy(self, draft, target, heldout):
        return head_accuracy(draft, target, heldout)


FAMILY = MedusaFamily()
