"""EAGLE-3's draft on the shared trainer (drafts/train.py; conf/family/eagle3.yaml; docs/methods/eagle.md, Training).

  - The draft vocabulary is chosen before training: the `draft_vocab` target tokens most frequent in the assistant
    text of the records the run will read (`vocab_records`), as the target tokenizes it; ties go to the lower id.
  - The head starts from the target's own head rows for those tokens (`init_head: target`), or from a random
    initialisation as upstream (`init_head: random`): a CPU budget cannot afford to learn a head from scratch.
  - The training-time test: the draft is unrolled on its own outputs for `unroll` depths (`serial_unroll`: depth k
    at t reads its depth k-1 output and sees the context up to t plus its own earlier depths at t, as in a tree).
    Depth k at t predicts x_{t+1+k}; its target is the target model's distribution there restricted to the draft
    vocabulary and renormalised. The loss is the soft cross-entropy summed over depths with weight decay^(k-1),
    over assistant tokens whose target argmax lies in the draft vocabulary; no feature regression.
"""

from __future__ import annotations

import torch
from torch import nn

from drafts.data import training_vocabulary
from drafts.evaluate import depth_accuracy, serial_unroll
from drafts.family import Family
from eagle.draft_model import Eagle3Draft


def new_eagle3_draft(lm, options) -> Eagle3Draft:
    ids = training_vocabulary(lm, options)
    draft = Eagle3Draft.for_target(lm.model, None if ids is None else ids.numel())
    if ids is not None:
        draft.set_vocabulary(ids)
    if options.init_head == "target":
        with torch.no_grad():
            rows = lm.model.get_output_embeddings().weight
            draft.lm_head.weight.copy_(rows if ids is None else rows[ids])
    return draft


def unrolled_loss(draft, features: torch.Tensor, target_logits: torch.Tensor, ids: torch.Tensor,
                  attention: torch.Tensor, loss_mask: torch.Tensor, depths: int, decay: float,
                  candidates: tuple[int, int] | None = None, generator: torch.Generator | None = None):
    """The training-time test's loss and its per-depth parts. features [B, L, 3H] (the target's fused states),
    target_logits [B, L, V], ids / attention / loss_mask [B, L]. `candidates` = (top-k, negatives): the soft
    cross-entropy over the target's top-k draft-vocabulary tokens per row plus shared random negatives instead of
    the whole draft vocabulary (the CPU recipe's cost cutter, as for Gumiho); None: the whole vocabulary."""
    batch, length = ids.shape
    x_next = torch.cat((ids[:, 1:], torch.zeros_like(ids[:, :1])), dim=1)
    outputs = serial_unroll(draft, x_next, features, depths, attention)
    vocab_ids = draft.vocab_ids
    restricted = target_logits if vocab_ids is None else target_logits[..., vocab_ids]
    in_vocab = draft.t2d[target_logits.argmax(-1)]  # [B, L]: the target's choice is one the draft can propose
    count = loss_mask[:, 2:].sum() + 1e-5  # depth-1 rows: every assistant token it can predict
    loss, parts = target_logits.new_zeros(()), {}
    for k, out in enumerate(outputs, start=1):
        span = length - 1 - k  # t = 0..span-1 predicts x_{t+1+k}, the target's choice after position t+k
        if span <= 0:
            break
        rows = loss_mask[:, k + 1:].bool() & in_vocab[:, k:k + span]
        predicted, wanted = out[:, :span][rows], restricted[:, k:k + span][rows].float()  # [n, H], [n, N]
        if candidates is None:
            q = torch.softmax(wanted, dim=-1)
            log_p = torch.log_softmax(draft.vocab_logits(predicted).float(), dim=-1)
        else:
            top, negatives = torch.topk(wanted, candidates[0], dim=-1), torch.randint(
                wanted.shape[-1], (candidates[1],), generator=generator).to(wanted.device)
            q = torch.softmax(torch.cat((top.values, wanted[:, negatives]), dim=-1), dim=-1)
            log_p = torch.log_softmax(draft.candidate_logits(predicted, top.indices, negatives).float(), dim=-1)
        term = -(q * log_p).sum() / count
        loss = loss + decay ** (k - 1) * term
        parts[f"ce{k}"] = float(term.detach())
    return loss, parts


class UnrolledLoss(nn.Module):
    """The draft with the training-time test as its forward, so that a distributed wrapper (DDP) sees the call."""

    def __init__(self, draft: Eagle3Draft, depths: int, decay: float, candidates: tuple[int, int] | None,
                 generator: torch.Generator):
        super().__init__()
        self.draft, self.depths, self.decay = draft, depths, decay
        self.candidates, self.generator = candidates, generator

    def forward(self, features, target_logits, ids, attention, loss_mask):
        return unrolled_loss(self.draft, features, target_logits, ids, attention, loss_mask, self.depths, self.decay,
                             self.candidates, self.generator)


class Eagle3Family(Family):
    def build(self, lm, options, generator):
        draft = new_eagle3_draft(lm, options).to(lm.device, torch.float32)
        candidates = ((options.candidate_topk, options.candidate_negatives) if options.soft_ce == "candidates"
                      else None)
        return draft, UnrolledLoss(draft, options.unroll, options.unroll_decay, candidates, generator)

    def loss(self, trainer, batch):
        """The training-time test on the target's fused low, middle and high states and its logits."""
        ids, attention = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            out = trainer.lm.model(input_ids=ids, attention_mask=attention, output_hidden_states=True)
            features = torch.cat([out.hidden_states[i] for i in trainer.draft.hidden_state_layers], dim=-1).float()
        return trainer.model(features, out.logits, ids, attention, batch["loss_mask"])

    def accuracy(self, draft, target, heldout):
        return depth_accuracy(draft, target, heldout)


FAMILY = Eagle3Family()
