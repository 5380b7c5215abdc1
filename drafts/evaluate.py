"""Held-out top-1 accuracy of a draft per depth (1..2+mlp_num), on the target's greedy continuations.

The held-out text is what the draft meets at inference: Spec-Bench prompts (never in the training data) and the
target's own greedy continuation of each. At every continuation position t the draft sees the target's hidden
states up to t, as at inference, and predicts as it drafts:
  depth 1: o_t from the serial layers on (h_<=t, x_<=t+1) -> x_{t+2};
  depth 2: one more serial step on the pair (o_t, x_{t+2}) at position t+1, the draft's own feature -> x_{t+3};
  depth 3+i: head i on [fc(emb(x_{t+2}); o_t) ; fc(emb(x_{t+3}); o2_t)] -> x_{t+4+i}.
Earlier tokens are the true ones (the greedy continuation), so acc@d is the top-1 accuracy at depth d given a
correct prefix: the rate at which that depth of a chain draft is accepted when the ones above it are.
"""

from __future__ import annotations

from pathlib import Path

import torch

from drafts.serial_draft import SerialDraft

MAX_DEPTH = 7


def heldout_set(lm, question_file: str | Path, per_subtask: int, new_tokens: int, cache: Path | None = None):
    """[(prompt_ids, continuation_ids)] for the first `per_subtask` questions of each subtask (first turns)."""
    if cache is not None and cache.is_file():
        try:
            return torch.load(cache, weights_only=True)  # lists of token ids; never runs code from the file
        except Exception as exc:  # noqa: BLE001 - any unreadable file: one line naming it
            from evaluation.engine.errors import HarnessError
            from drafts.checkpoint import reason

            raise HarnessError(f"held-out cache {cache} cannot be read ({reason(exc)}); remove it to recompute it") \
                from None
    from evaluation.catalog import method_class
    from evaluation.engine import decode_turn
    from evaluation.questions import load_questions, select_questions
    from evaluation.templates import build_prompt_ids

    vanilla = method_class("vanilla")(None, lm)
    items = []
    for question in select_questions(load_questions(question_file), None, per_subtask):
        prompt = build_prompt_ids(lm.tokenizer, lm.chat_template, [], question.turns[0])
        items.append((prompt, decode_turn(lm, vanilla, prompt, new_tokens).new_ids))
    if cache is not None:
        from evaluation.files import replacing

        cache.parent.mkdir(parents=True, exist_ok=True)
        with replacing(cache) as tmp:  # written whole, then renamed
            torch.save(items, tmp)
    return items


@torch.no_grad()
def target_states(target, ids: torch.Tensor, layers=(-1,)) -> torch.Tensor:
    """The target's hidden states at `layers` (transformers' numbering; -1: the last, post-norm) side by side."""
    states = target(input_ids=ids, output_hidden_states=True, logits_to_keep=1).hidden_states
    return torch.cat([states[i] for i in layers], dim=-1)


def serial_unroll(draft, x_next: torch.Tensor, features: torch.Tensor, depths: int,
                  attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The draft's outputs at depths 1..`depths` for every position t at once, as a tree would compute them (and
    EAGLE-3's training-time test trains them).

    Depth 1 is the causal pass over the pairs (features_t, x_{t+1}) at positions t. Depth k's query at t is the
    pair (its depth k-1 output, x_{t+k}) at position t + k - 1; it sees the depth-1 pairs up to t and its own depth
    2..k pairs at t (the diagonal), as a tree node sees the context and its ancestors. Each depth is one forward of
    n queries; the keys of earlier depths come from a cache that keeps the autograd graph (transformers'
    DynamicCache). x_next [B, n] = x_{t+1}; features [B, n, width]; attention_mask [B, n] (1 = real token)."""
    from transformers import DynamicCache

    batch, n = x_next.shape
    device, dtype = x_next.device, features.dtype
    positions = torch.arange(n, device=device)[None].expand(batch, -1)
    context = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None].expand(batch, n, n)
    if attention_mask is not None:
        context = context & attention_mask.bool()[:, None, :]
    diagonal = torch.eye(n, dtype=torch.bool, device=device)[None].expand(batch, n, n)
    cache = DynamicCache()
    x = draft.pair_input(x_next, features)
    outputs = []
    for k in range(1, depths + 1):
        allowed = torch.cat([context] + [diagonal] * (k - 1), dim=-1)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
        out = draft.serial(x, positions + (k - 1), mask[:, None], cache)
        outputs.append(out)
        if k < depths:
            x = draft.pair_input(torch.roll(x_next, -k, dims=1), out)
    return outputs


@torch.no_grad()
def depth_accuracy(draft: SerialDraft, target, items, max_prompt: int = 768) -> dict:
    """{"positions": n, "acc1".."accD": float} pooled over every continuation position of every item."""
    depths = min(MAX_DEPTH, 2 + draft.mlp_num) if draft.mlp_num else MAX_DEPTH
    correct = torch.zeros(depths)
    total = torch.zeros(depths)
    device = next(target.parameters()).device
    dtype = next(draft.parameters()).dtype
    was_training = draft.training
    draft.eval()
    for prompt, continuation in items:
        prompt = prompt[-max_prompt:]
        ids = torch.tensor([prompt + list(continuation)], device=device)
        length = ids.shape[1]
        h = target_states(target, ids, draft.hidden_state_layers).to(dtype)
        x_next = ids[:, 1:]  # x_{t+1} for t = 0..L-2
        hidden = h[:, :-1]
        # depth 1, every position at once (causal): o_t ~ h_{t+1}; deeper serial depths unrolled on the draft's
        # own outputs (Gumiho: depth 2, then its heads; a draft without heads: every depth)
        serial_depths = 2 if draft.mlp_num else depths
        outputs = serial_unroll(draft, x_next, hidden, serial_depths)
        if draft.mlp_num:
            x2_tokens, x3_tokens = torch.roll(x_next, -1, dims=1), torch.roll(x_next, -2, dims=1)
            o, o2 = outputs
            v = torch.cat((draft.pair_input(x2_tokens, o), draft.pair_input(x3_tokens, o2)), dim=-1)
            outputs += draft.heads(v)[: depths - 2]
        start = len(prompt) - 1  # t from here predicts continuation tokens
        for d, out in enumerate(outputs[:depths]):
            # out at t predicts x_{t+2+d} = ids[t + 2 + d]
            last = length - 2 - d
            if last <= start:
                continue
            predicted = draft.vocab_logits(out[0, start:last]).argmax(-1)
            if draft.vocab_ids is not None:
                predicted = draft.vocab_ids[predicted]
            truth = ids[0, start + 2 + d: length]
            correct[d] += (predicted == truth).sum().item()
            total[d] += truth.numel()
    draft.train(was_training)
    result = {"positions": int(total[0].item())}
    for d in range(depths):
        result[f"acc{d + 1}"] = float(correct[d] / total[d]) if total[d] else float("nan")
    return result
