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
    accept_lengths: list[int]  # tokens committed per step, the prefill step (1 token, 0 if it stops short) included
    wall_time: float  # seconds, prefill included
    seconds: dict[str, float] = field(default_factory=dict)  # per part; they add up to wall_time
    stop_reason: str = ""  # "stop_token", "max_new_tokens" or "context"
    proposed_nodes: list[int] = field(default_factory=list)  # draft nodes the method proposed, per decode step
    verified_nodes: list[int] = field(default_factory=list)  # draft nodes verified (after the draft budget)
    draft_detail: dict[str, float] = field(default_factory=dict)  # seconds of the method's drafting sub-parts
    # With `record_margins`: per new token, the target's top-1 minus top-2 logit where it chose it (how near a tie)
    margins: list[float] = field(default_factory=list)
    # Steps a method decoded after its answer was complete (`Method.learns_past_answer`): tokens per step and
    # seconds, outside the answer's accept lengths and time
    past_answer_lengths: list[int] = field(default_factory=list)
    past_answer_seconds: float = 0.0

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


def _forward(model, input_ids, position_ids, attention_mask, cache, logits_to_keep, layers):
    """Logits [tokens, vocab] and, when `layers` names some, those hidden states side by side [tokens, width]."""
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        **cache_argument(model, cache),
        use_cache=True,
        logits_to_keep=logits_to_keep,
        output_hidden_states=bool(layers),
    )
    if not layers:
        return out.logits[0], None
    if len(layers) == 1:
        return out.logits[0], out.hidden_states[layers[0]][0]
    return out.logits[0], torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)


def has_room(lm, cache, prompt_length: int, generated: int, width: int) -> bool:
    """Whether one more step of `width` tokens fits the cache and the model's context."""
    return cache.length + width <= cache.capacity and prompt_length + generated + width <= lm.max_context


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
    layers = tuple(method.hidden_state_layers) if method.needs_hidden_states else ()
    clock = LapClock(device)

    # Prefill: the whole prompt, causal, in one forward; only the last position's logits are needed, unless the
    # method learns from every prompt position. A method may have the prefill stop one token short: its first step
    # then verifies the last prompt token with a draft below it, and the prefill step commits nothing.
    short = method.prefill_stops_short and prompt_length >= 2
    prefilled = prompt_ids[:-1] if short else prompt_ids
    n = len(prefilled)
    # Room for the answer and its last step's overshoot, and two steps past the answer if the method may take them.
    steps_past = 2 if method.learns_past_answer else 0
    cache = cache_for(model, prompt_length + budget + (1 + steps_past) * (method.max_nodes + 1))
    causal = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype, device=device).triu_(1)
    logits, hidden_states = _forward(
        model,
        torch.tensor([prefilled], device=device),
        torch.arange(n, device=device).unsqueeze(0),
        causal[None, None],
        cache,
        0 if method.needs_prompt_logits else 1,
        layers,
    )
    last_logits = logits[-1]
    if short:
        first, stop_reason, margins = [], "", []
    else:
        first_token = sampler.draw(sampler.probabilities(last_logits)) if sampler else int(last_logits.argmax())
        first, stop_reason = cut_chunk([first_token], lm.stop_ids, budget)
        margins = top2_margins(last_logits[None]) if record_margins else []
    clock.lap("prefill")
    # A method that reads hidden states also gets the prompt's (e.g. a trained draft's context).
    method.reset(list(prompt_ids), hidden_states=hidden_states)
    if method.needs_prompt_logits:
        method.learn_from_prompt(list(prefilled), logits)
    clock.lap("update")

    state = DecodeState(list(prompt_ids) + first, prompt_length, last_logits, budget, sampler)
    answer_length = len(first)
    accept_lengths = [len(first)]  # the prefill step: one token, or none when it stopped short
    proposed_nodes: list[int] = []
    verified_nodes: list[int] = []
    answer_time: tuple[float, dict[str, float]] | None = None  # wall time and parts when the answer was complete
    past_answer_lengths: list[int] = []
    past_answer = False
    while not stop_reason or past_answer:
        answer_open = not stop_reason
        # 1. draft (unless the budget says drafting does not pay now), then keep what is expected to pay
        step_start = clock.elapsed
        drafted = draft_budget is None or not answer_open or draft_budget.wants_draft()
        if draft_budget is not None and answer_open:
            clock.lap("budget")
        tree = method.draft(state) if drafted else DraftTree()
        clock.lap("draft")
        proposed_index = None
        if answer_open:
            proposed_nodes.append(len(tree))
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
            model, inputs.input_ids, inputs.position_ids, inputs.attention_mask, cache, 0, layers
        )
        clock.lap("forward")
        # 4. verification, then the stop rules on the committed chunk
        tree_logits = logits[: inputs.num_tree_nodes]
        if sampler is not None:  # explicit rows (FTA) are a greedy device: sampling follows the tree's parents
            verdict = verify_sampled(inputs, tree_logits, sampler, tree.draft_probs)
        elif tree.rows is None:
            verdict = verify_greedy(inputs, tree_logits)
        else:
            verdict = verify_rows(inputs, tree_logits, tree.rows)
        chunk = verdict.accepted_tokens + [verdict.bonus]
        if answer_open:
            committed, stop_reason = cut_chunk(chunk, lm.stop_ids, budget - answer_length)
            answer_length += len(committed)
            accept_lengths.append(len(committed))
            if record_margins:  # the row of path node j chose committed token j
                margins.extend(top2_margins(tree_logits[verdict.path[: len(committed)]]))
        # A method that learns past the answer sees the chunk cut only at a stop token, as its upstream does.
        seen = cut_chunk(chunk, lm.stop_ids, len(chunk))[0] if method.learns_past_answer else committed
        if not answer_open:
            past_answer_lengths.append(len(seen))
        clock.lap("verify")
        # 5. keep the keys/values of the pending token and the accepted drafts
        cache.commit(cache_length, verdict.path)
        clock.lap("commit")
        # 6. the method learns what was accepted
        state.tokens.extend(seen)
        state.last_logits = tree_logits[verdict.path[-1]]
        if not stop_reason or method.learns_past_answer:
            method.update(
                state,
                StepOutcome(
                    committed=seen,
                    verdict=verdict,
                    tree_logits=tree_logits,
                    side_logits=logits[inputs.num_tree_nodes :] if tree.side else None,
                    hidden_states=hidden_states,
                    proposed_index=proposed_index,
                    drafted=drafted,
                    stop_reason=stop_reason,
                ),
            )
        clock.lap("update")
        if draft_budget is not None and answer_open:
            draft_budget.observe(state.tokens, drafted, len(committed), clock.elapsed - step_start,
                                 clock.last_lap("draft"), int(inputs.input_ids.shape[1]), clock.last_lap("forward"))
            clock.lap("budget")
        if stop_reason:
            # The answer is complete; a method may still decode a few steps to learn what its upstream learns there.
            if answer_time is None:
                answer_time = clock.elapsed, dict(clock.seconds)
            past_answer = (method.learns_past_answer
                           and has_room(lm, cache, prompt_length, state.generated, method.max_nodes + 1)
                           and method.decodes_past_answer(state))

    wall_time, seconds = answer_time if answer_time is not None else (clock.elapsed, dict(clock.seconds))
    answer = state.tokens[prompt_length : prompt_length + answer_length]
    if draft_budget is not None:
        draft_budget.end_turn(list(prompt_ids) + answer)
    if not stop_reason:
        stop_reason = "max_new_tokens"
    if stop_reason == "max_new_tokens" and budget < max_new_tokens:
        stop_reason = "context"
    return TurnResult(
        new_ids=answer,
        accept_lengths=accept_lengths,
        wall_time=wall_time,
        seconds=seconds,
        stop_reason=stop_reason,
        proposed_nodes=proposed_nodes,
        verified_nodes=verified_nodes,
        draft_detail=method.draft_detail(),
        margins=margins,
        past_answer_lengths=past_answer_lengths,
        past_answer_seconds=clock.elapsed - wall_time,
    )
