"""Answering one question: every turn decoded by the engine after the model's own earlier answers, and the
answer line a run folder keeps (Spec-Bench's answer format plus token ids, the time breakdown and a status)."""

from __future__ import annotations

import hashlib
import random
import uuid

import torch

from evaluation.engine import decode_turn
from evaluation.engine.errors import HarnessError
from evaluation.engine.sampling import Sampler, SamplingParams
from evaluation.templates import answer_text, build_prompt_ids


def sampling_params(bench) -> SamplingParams:
    return SamplingParams(temperature=float(bench.temperature), top_p=float(bench.top_p), top_k=int(bench.top_k))


def make_sampler(spec) -> Sampler | None:
    params = sampling_params(spec.bench)
    return None if params.greedy else Sampler(params)


def question_seed(seed: int, question_id) -> int:
    """The sampling seed of one question: the same whatever order, resume or worker answers it."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{question_id}".encode()).digest()[:8], "little") >> 1


def records_margins(lm, sampler: Sampler | None) -> bool:
    """Greedy runs in reduced precision keep each token's top-2 margin: there a method may differ from vanilla at
    near-ties, and the report says how near (float32 is exact, sampled runs are checked statistically)."""
    return sampler is None and lm.dtype != torch.float32


def answer_question(lm, method, question, max_new_tokens: int, budget=None, sampler: Sampler | None = None) -> dict:
    """All turns of one question, each asked after the model's own earlier answers; greedy, or sampled with
    `sampler` (seeded by the caller from its question id)."""
    margins = records_margins(lm, sampler)
    history: list[tuple[str, str]] = []
    choice = {"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [],
              "accept_lengths": [], "token_ids": [], "prefill_time": [], "time_breakdown": [], "stop_reason": [],
              "proposed_nodes": [], "verified_nodes": [], "draft_detail": []}
    for text in question.turns:
        prompt_ids = build_prompt_ids(lm.tokenizer, lm.chat_template, history, text)
        if len(prompt_ids) >= lm.max_context:
            raise HarnessError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {lm.max_context}")
        result = decode_turn(lm, method, prompt_ids, max_new_tokens, budget, sampler, record_margins=margins)
        answer = answer_text(lm.tokenizer, result.new_ids)
        history.append((text, answer))
        choice["turns"].append(answer)
        choice["decoding_steps"].append(result.steps)
        choice["new_tokens"].append(len(result.new_ids))
        choice["wall_time"].append(result.wall_time)
        choice["accept_lengths"].extend(result.accept_lengths)
        choice["token_ids"].append(result.new_ids)
        choice["prefill_time"].append(result.seconds["prefill"])
        choice["time_breakdown"].append(result.seconds)
        choice["stop_reason"].append(result.stop_reason)
        choice["proposed_nodes"].extend(result.proposed_nodes)  # per decode step (the prefill step has none)
        choice["verified_nodes"].extend(result.verified_nodes)
        choice["draft_detail"].append(result.draft_detail)  # per turn: seconds of the method's drafting sub-parts
        if margins:  # per turn, per new token: the top-2 logit margin (3 decimals)
            choice.setdefault("margins", []).append([round(m, 3) for m in result.margins])
    return choice


def one_line(exc: BaseException) -> str:
    """An exception as the one line an answer record keeps."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def warm_up(spec, lm, method, question, budget=None, sampler=None) -> None:
    """`bench.warmup` untimed, unrecorded passes over the first question: the same code path as the timed ones."""
    random.seed(spec.run.seed)
    torch.manual_seed(spec.run.seed)
    for _ in range(spec.bench.warmup):
        answer_question(lm, method, question, spec.bench.max_new_tokens, budget, sampler)


def record_head(spec, question) -> dict:
    """The fields every answer line of `question` starts with."""
    return {"question_id": question.question_id, "category": question.category, "subtask": question.subtask,
            "answer_id": uuid.uuid4().hex[:22], "model_id": spec.model.name, "method": spec.method.name}


def error_record(spec, question, message: str) -> dict:
    """The answer line of a question that was not answered: listed by the report, asked again on resume."""
    return {**record_head(spec, question), "status": "error", "error": message, "choices": []}


def answer_record(spec, lm, method, question, budget=None, sampler=None) -> dict:
    """One question's answer line (without its `tstamp`, set when it is written); a question that raises is
    recorded with `status: "error"` and its message."""
    torch.manual_seed(spec.run.seed)
    if sampler is not None:
        sampler.reseed(question_seed(spec.run.seed, question.question_id))
    try:
        choice = answer_question(lm, method, question, spec.bench.max_new_tokens, budget, sampler)
    except Exception as exc:  # noqa: BLE001 - recorded, listed by the report, never counted
        return error_record(spec, question, one_line(exc))
    return {**record_head(spec, question), "status": "ok", "error": None, "choices": [choice]}
