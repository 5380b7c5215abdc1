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

from gumiho.draft_model import GumihoDraft

MAX_DEPTH = 7


def heldout_set(lm, question_file: str | Path, per_subtask: int, new_tokens: int, cache: Path | None = None):
    """[(prompt_ids, continuation_ids)] for the first `per_subtask` questions of each subtask (first turns)."""
    if cache is not None and cache.is_file():
        try:
            return torch.load(cache, weights_only=True)  # lists of token ids; never runs code from the file
        except Exception as exc:  # noqa: BLE001 - any unreadable file: one line naming it
            from evaluation.engine.errors import HarnessError
            from gumiho.checkpoint import reason

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
def target_states(target, ids: torch.Tensor) -> torch.Tensor:
    """The target's last-layer (post-norm) hidden states [1, L, H]."""
    return target(input_ids=ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]


@torch.no_grad()
def depth_accuracy(draft: GumihoDraft, target, items, max_prompt: int = 768) -> dict:
    """{"positions": n, "acc1".."accD": float} pooled over every continuation position of every item."""
    depths = min(MAX_DEPTH, 2 + draft.mlp_num)
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
        h = target_states(target, ids).to(dtype)
        x_next = ids[:, 1:]  # x_{t+1} for t = 0..L-2
        hidden = h[:, :-1]
        n = length - 1
        # depth 1, every position at once (causal): o_t ~ h_{t+1}
        x = draft.pair_input(x_next, hidden)
        positions = torch.arange(n, device=device)[None]
        causal = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype, device=device).triu_(1)
        o = draft.serial(x, positions, causal[None, None])
        # depth 2: query t is the pair (o_t, x_{t+2}) at position t+1; it sees context 0..t and itself
        x2_tokens = torch.roll(x_next, -1, dims=1)
        q2 = draft.pair_input(x2_tokens, o)
        both = torch.cat((x, q2), dim=1)
        pos2 = torch.cat((positions, positions + 1), dim=1)
        allowed = torch.zeros(2 * n, 2 * n, dtype=torch.bool, device=device)
        allowed[:n, :n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        allowed[n:, :n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        allowed[n:, n:] = torch.eye(n, dtype=torch.bool, device=device)
        mask = torch.zeros(2 * n, 2 * n, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
        o2 = draft.serial(both, pos2, mask[None, None])[:, n:]
        outputs = [o, o2]
        if draft.mlp_num:
            x3_tokens = torch.roll(x_next, -2, dims=1)
            v = torch.cat((draft.pair_input(x2_tokens, o), draft.pair_input(x3_tokens, o2)), dim=-1)
            outputs += draft.heads(v)[: depths - 2]
        start = len(prompt) - 1  # t from here predicts continuation tokens
        for d, out in enumerate(outputs[:depths]):
            # out at t predicts x_{t+2+d} = ids[t + 2 + d]
            last = length - 2 - d
            if last <= start:
                continue
            predicted = draft.head(out[0, start:last]).argmax(-1)
            truth = ids[0, start + 2 + d: length]
            correct[d] += (predicted == truth).sum().item()
            total[d] += truth.numel()
    draft.train(was_training)
    result = {"positions": int(total[0].item())}
    for d in range(depths):
        result[f"acc{d + 1}"] = float(correct[d] / total[d]) if total[d] else float("nan")
    return result
