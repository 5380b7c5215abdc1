"""The serial draft's training (drafts/serial_draft.py; docs/methods/gumiho.md, Training recipe): EAGLE's recipe,
with Gumiho's head terms when the draft has heads. The gumiho and eagle families are this with two layers and
`mlp_num` heads, or one layer and none.

  loss = v_w Lv(o, h_next) + p_w Lp(o, h_next)
       + mlp_v_w / mlp_loss_weight * sum_i decay^(i+1) Lv(MLP_i, h_{+3+i})
       + mlp_p_w / mlp_loss_weight * sum_i decay^(i+1) Lp(MLP_i, h_{+3+i})
Lv is SmoothL1 on features, Lp the soft cross-entropy through the frozen head against the target's own
distribution; all are averaged over assistant tokens. The draft reads the target's last states with uniform noise
(U - 0.5) * noise * 512 / L, as upstream.

Cost cutters (options): `soft_ce: candidates` (the target's top-k tokens plus shared sampled negatives instead of
the full-vocabulary log-softmax); `mlp_feature_only_tokens` (the heads get only the feature loss for that many
tokens, as upstream's first two epochs; -1 = always).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from drafts.evaluate import depth_accuracy
from drafts.family import Family, last_states
from drafts.serial_draft import SerialDraft
from evaluation.engine.errors import require


class SoftTargets:
    """The target's distribution at the loss rows: full log-probs, or candidate ids with renormalised probs."""

    def __init__(self, head_weight, h_rows, options, generator):
        with torch.no_grad():
            logits = (h_rows @ head_weight.T).float()
            if options.soft_ce == "full":
                self.probs, self.ids = torch.softmax(logits, -1), None
                self.negatives = None
            else:
                top = torch.topk(logits, options.candidate_topk, dim=-1)
                vocab = head_weight.shape[0]
                self.negatives = torch.randint(vocab, (options.candidate_negatives,), generator=generator)
                self.negatives = self.negatives.to(h_rows.device)
                cand_logits = torch.cat((top.values, logits[:, self.negatives]), dim=-1)
                self.ids, self.probs = top.indices, torch.softmax(cand_logits, -1)

    def loss(self, pred, rows, head_weight):
        """Soft cross-entropy of predictions `pred` [n, H] against the targets of `rows` [n], summed."""
        probs = self.probs[rows]
        if self.ids is None:
            log_q = torch.log_softmax((pred @ head_weight.T).float(), -1)
        else:
            top = torch.einsum("nh,nkh->nk", pred, head_weight[self.ids[rows]])
            rest = pred @ head_weight[self.negatives].T
            log_q = torch.log_softmax(torch.cat((top, rest), -1).float(), -1)
        return -(probs * log_q).sum()


def draft_loss(draft, o, heads, h, batch, options, use_mlp_ce, generator):
    """The recipe's loss on one batch and its parts (for the progress bar)."""
    target_h = torch.cat((h[:, 1:], torch.zeros_like(h[:, :1])), dim=1)
    mask = batch["loss_mask"]
    rows_b, rows_t = mask.nonzero(as_tuple=True)  # loss rows r (in target coordinates)
    count = rows_b.numel() + 1e-5
    head_weight = draft.head.weight
    need_ce = options.p_w > 0 or (use_mlp_ce and options.mlp_p_w > 0)
    soft = SoftTargets(head_weight, target_h[rows_b, rows_t].to(head_weight.dtype), options, generator) \
        if need_ce else None
    index = torch.arange(rows_b.numel(), device=rows_b.device)

    def terms(pred, shift, with_ce):
        keep = rows_t >= shift
        p = pred[rows_b[keep], rows_t[keep] - shift]
        t = target_h[rows_b[keep], rows_t[keep]]
        lv = F.smooth_l1_loss(p.float(), t.float(), reduction="none").mean(-1).sum() / count
        lp = soft.loss(p.to(head_weight.dtype), index[keep], head_weight) / count if with_ce else p.new_zeros(())
        return lv, lp

    lv, lp = terms(o, 0, options.p_w > 0)
    loss = options.v_w * lv + options.p_w * lp
    mlp_v = mlp_p = o.new_zeros(())
    for i, out in enumerate(heads):
        weight = options.mlp_loss_decay ** (i + 1) / options.mlp_loss_weight
        hv, hp = terms(out, 2 + i, use_mlp_ce and options.mlp_p_w > 0)
        mlp_v = mlp_v + weight * hv
        mlp_p = mlp_p + weight * hp
    loss = loss + options.mlp_v_w * mlp_v + options.mlp_p_w * mlp_p
    parts = {"lv": lv, "lp": lp, "mlp_v": mlp_v, "mlp_p": mlp_p}
    return loss, {k: float(v.detach()) for k, v in parts.items()}


class SerialFamily(Family):
    """A serial draft of `layers` decoder layers, with `options.mlp_num` parallel heads when `heads` is true."""

    def __init__(self, layers: int, heads: bool):
        self.layers, self.with_heads = layers, heads

    def check(self, options) -> None:
        require(self.with_heads or options.mlp_num == 0, "mlp_num", options.mlp_num, "0 for a draft without heads")

    def build(self, lm, options, generator):
        draft = SerialDraft.for_target(lm.model, options.mlp_num, layers=self.layers).to(lm.device, torch.float32)
        return draft, draft

    def loss(self, trainer, batch):
        options, h = trainer.options, last_states(trainer.lm, batch)
        ids, features = batch["input_ids"], h
        if options.noise > 0:
            noise = (torch.rand(h.shape, generator=trainer.generator) - 0.5).to(h.device)
            features = h + noise * options.noise * 512 / h.shape[1]
        input_ids = torch.cat((ids[:, 1:], torch.zeros_like(ids[:, :1])), dim=1)
        out, heads = trainer.model(features, input_ids, batch["attention_mask"])
        use_mlp_ce = options.mlp_feature_only_tokens >= 0 and trainer.tokens >= options.mlp_feature_only_tokens
        return draft_loss(trainer.draft, out, heads, h, batch, options, use_mlp_ce, trainer.generator)

    def accuracy(self, draft, target, heldout):
        return depth_accuracy(draft, target, heldout)
