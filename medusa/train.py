"""Medusa heads trained on the shared trainer (`gumiho/train.py`, `train.family=medusa`; docs/methods/medusa.md,
Training).

  - Upstream's loss (Medusa-1, `train_legacy.py`): the target frozen; head k at position t is trained with the
    cross-entropy against the text's token t + k + 2, on assistant tokens, summed over heads without weights (the
    paper's per-head decay is not in upstream's code); each projection starts as the target's head, each residual
    block as the identity.
  - A reduced vocabulary (`draft_vocab`), chosen as for EAGLE-3 (the most frequent assistant tokens of the records
    the run reads): the projections keep those rows of the target's head, and a position whose token lies outside
    is left out of the loss.
  - Held-out accuracy of head k = how often its top token at t is the target's own greedy token t + k + 2
    (`acc{k+1}`: depth k + 1 of the tree).

Hydra++'s heads (`train.family=hydra`; docs/methods/hydra.md, Training), upstream's recipe (`hydra/train/train.py`):
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

from eagle.train import training_vocabulary
from medusa.heads import MedusaHeads
from medusa.hydra_heads import HydraHeads


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


# ---------------------------------------------------------------------------------------------------- Hydra++


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
