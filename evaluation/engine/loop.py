"""The one decode loop. Every method, vanilla included, runs a turn through `decode_turn`.

Bookkeeping (see docs/engine.md): the prefill forward gives the first token, which counts as a step that commits
one token, as in transformers' `generate`. Each later step feeds the pending token (node 0) plus the method's draft
tree in one forward, verifies it, and commits the accepted drafts and the bonus token. So vanilla makes exactly one
forward per generated token, and its mean accepted tokens is 1.

Verification is greedy, or with a `Sampler` (temperature > 0) the recursive rejection of
`evaluation.engine.sampling`, which keeps the target's distribution exactly; the methods do not know which.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from evaluation.engine.budget import Budget
from evaluation.engine.kv_cache import cache_argument, cache_for
from evaluation.engine.method import DecodeState, Method, StepOutcome
from evaluation.engine.sampling import Sampler, verify_sampled
from evaluation.engine.timing import LapClock
from evaluation.engine.tree import DraftTree, build_tree_inputs, verify_greedy, verify_rows


@dataclass
class TurnResult:
    """One answer: token ids, per-step accepted lengths and the time of each part."""

    new_ids: list[int]
    accept_lengths: list[int]  # tokens committed per step, the prefill step (1 token) included
    wall_time: float  # seconds, prefill included
    seconds: dict[str, float] = field(default_factory=dict)  # per part; they add up to wall_time
    stop_reason: str = ""  # "stop_token", "max_new_tokens" or "context"
    proposed_nodes: list[int] = field(default_factory=list)  # draft nodes the method proposed, per decode step
    verified_nodes: list[int] = field(default_factory=list)  # draft nodes verified (after the draft budget)
    draft_detail: dict[str, float] = field(default_factory=dict)  # seconds of the method's drafting sub-parts
    # With `record_margins`: per new token, the target's top-1 minus top-2 logit where it chose it (how near a tie)
    margins: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)


def cut_chunk(chunk: list[int], stop_ids: frozenset[int], room: int) -> tuple[list[int], str]:
    """Keep the chunk up to and including the first stop token, and at most `room` tokens."""
    for i, token in enumerate(chunk[:room]):
        if token in stop_ids:
            return chunk[: i + 1], "stop_token"
    if len(chunk) >= room:
        return chunk[:room], "max_new_tokens"
    return chunk, ""


def top2_margins(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 logit of each row: how near a tie each greedy choice was."""
    top = logits.float().topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).tolist()


def _forward(model, input_ids, position_ids, attention_mask, cache, logits_to_keep, hidden):
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        **cache_argument(model, cache),
        use_cache=True,
        logits_to_keep=logits_to_keep,
        output_hidden_states=hidden,
    )
    hidden_states = out.hidden_states[-1][0] if hidden else None
    return out.logits[0], hidden_states


@torch.inference_mode()
def decode_turn(lm, method: Method, prompt_ids: list[int], max_new_tokens: int,
                draft_budget: Budget | None = None, sampler: Sampler | None = None,
                record_margins: bool = False) -> TurnResult:
    """Decode one turn of at most `max_new_tokens` tokens with `method` drafting: greedily, or sampling from the
    target's processed distribution with `sampler`. `draft_budget` (`evaluation.engine.budget`) cuts each proposed
    tree to what pays on this machine. `record_margins` keeps each new token's top-2 logit margin (reduced
    precision: where a method's output may differ from vanilla's, how near a tie it was)."""
    model, device, dtype = lm.model, lm.device, lm.dtype
    prompt_length = len(prompt_ids)
    budget = min(max_new_tokens, lm.max_context - prompt_length)
    if budget < 1:
        raise ValueError(f"prompt of {prompt_length} tokens leaves no room in a context of {lm.max_context}")
    hidden = method.needs_hidden_states
    clock = LapClock(device)

    # Prefill: the whole prompt, causal, in one forward; only the last position's logits are needed.
    cache = cache_for(model, prompt_length + budget + method.max_nodes + 1)
    causal = torch.full((prompt_length, prompt_length), torch.finfo(dtype).min, dtype=dtype, device=device).triu_(1)
    logits, hidden_states = _forward(
        model,
        torch.tensor([prompt_ids], device=device),
        torch.arange(prompt_length, device=device).unsqueeze(0),
        causal[None, None],
        cache,
        1,
        hidden,
    )
    last_logits = logits[-1]
    first_token = sampler.draw(sampler.probabilities(last_logits)) if sampler else int(last_logits.argmax())
    first, stop_reason = cut_chunk([first_token], lm.stop_ids, budget)
    margins = top2_margins(last_logits[None]) if record_margins else []
    clock.lap("prefill")
    # A method that reads hidden states also gets the prompt's (e.g. a trained draft's context).
    method.reset(list(prompt_ids), hidden_states=hidden_states if hidden else None)
    clock.lap("update")

    state = DecodeState(list(prompt_ids) + first, prompt_length, last_logits, budget)
    accept_lengths = [1]
    proposed_nodes: list[int] = []
    verified_nodes: list[int] = []
    while not stop_reason:
        # 1. draft (unless the budget says drafting does not pay now), then keep what is expected to pay
        step_start = clock.elapsed
        drafted = draft_budget is None or draft_budget.wants_draft()
        if draft_budget is not None:
            clock.lap("budget")
        tree = method.draft(state) if drafted else DraftTree()
        clock.lap("draft")
        proposed_nodes.append(len(tree))
        proposed_index = None
        if draft_budget is not None and drafted:
            tree, proposed_index = draft_budget.select(tree, len(state.tokens), clock.last_lap("draft"))
            clock.lap("budget")
        verified_nodes.append(len(tree))
        # 2. lay the pending token and the tree out for one forward
        cache_length = cache.length
        inputs = build_tree_inputs(state.tokens[-1], tree, cache_length, dtype, device)
        clock.lap("tree")
        # 3. one target forward over all nodes
        logits, hidden_states = _forward(
            model, inputs.input_ids, inputs.position_ids, inputs.attention_mask, cache, 0, hidden
        )
        clock.lap("forward")
        # 4. verification, then the stop rules on the committed chunk
        tree_logits = logits[: inputs.num_tree_nodes]
        if sampler is not None:  # explicit rows (FTA) are a greedy device: sampling follows the tree's parents
            verdict = verify_sampled(inputs, tree_logits, sampler)
        elif tree.rows is None:
            verdict = verify_greedy(inputs, tree_logits)
        else:
            verdict = verify_rows(inputs, tree_logits, tree.rows)
        committed, stop_reason = cut_chunk(
            verdict.accepted_tokens + [verdict.bonus], lm.stop_ids, budget - state.generated
        )
        if record_margins:  # the row of path node j chose committed token j
            margins.extend(top2_margins(tree_logits[verdict.path[: len(committed)]]))
        clock.lap("verify")
        # 5. keep the keys/values of the pending token and the accepted drafts
        cache.commit(cache_length, verdict.path)
        clock.lap("commit")
        # 6. the method learns what was accepted
        state.tokens.extend(committed)
        state.last_logits = tree_logits[verdict.path[-1]]
        accept_lengths.append(len(committed))
        if not stop_reason:
            method.update(
                state,
                StepOutcome(
                    committed=committed,
                    verdict=verdict,
                    tree_logits=tree_logits,
                    side_logits=logits[inputs.num_tree_nodes :] if tree.side else None,
                    hidden_states=hidden_states,
                    proposed_index=proposed_index,
                    drafted=drafted,
                ),
            )
        clock.lap("update")
        if draft_budget is not None:
            draft_budget.observe(state.tokens, drafted, len(committed), clock.elapsed - step_start,
                                 clock.last_lap("draft"), int(inputs.input_ids.shape[1]), clock.last_lap("forward"))
            clock.lap("budget")

    if draft_budget is not None:
        draft_budget.end_turn(state.tokens)
    if not stop_reason:
        stop_reason = "max_new_tokens"
    if stop_reason == "max_new_tokens" and budget < max_new_tokens:
        stop_reason = "context"
    return TurnResult(
        new_ids=state.tokens[prompt_length:],
        accept_lengths=accept_lengths,
        wall_time=clock.elapsed,
        seconds=dict(clock.seconds),
        stop_reason=stop_reason,
        proposed_nodes=proposed_nodes,
        verified_nodes=verified_nodes,
        draft_detail=method.draft_detail(),
        margins=margins,
    )
