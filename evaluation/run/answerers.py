"""Who answers a run's questions, behind one interface (`Answerer`): this process (`InProcess`) or Ray workers
(`evaluation.run.ray_workers.RayWorkers`). The run folder, the single run and the interleaved schedule ask the
same of either; only this process ever writes the answers.

Also here: what every answering process builds from a run specification (the model loaded and checked, the
method on it, the draft budget) and the questions a run reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol

from evaluation.engine.budget import make_budget
from evaluation.engine.errors import HarnessError, OptionError, require
from evaluation.models import default_cache_dir, load_model
from evaluation.provenance import environment
from evaluation.questions import load_questions, select_questions
from evaluation.run.answer import answer_record, make_sampler, warm_up
from evaluation.templates import build_prompt_ids


class Answerer(Protocol):
    """What answers a run's questions."""

    model: object  # has the `source`, `dtype` and `device` a run's identity takes from the loaded model
    workers: list[dict] | None  # who answered, for the manifest (None: this process)
    latency_source: str | None  # where the draft budget's latency curve came from (None: no budget)

    def start(self, questions: int) -> None:
        """Be ready to answer `questions` questions (Ray starts its workers here)."""

    def environment(self) -> dict:
        """The provenance the manifest records (`evaluation.provenance.environment`)."""

    def warm_up(self, question) -> None:
        """`bench.warmup` untimed passes over `question`."""

    def answer(self, question) -> dict:
        """One question's answer record (`evaluation.run.answer.answer_record`)."""

    def answers(self, questions) -> Iterator[dict]:
        """The records of `questions`, in the order they finish."""


def read_questions(spec) -> list:
    """The selected questions of the question file (a bad file or subtask raises `HarnessError`)."""
    return select_questions(load_questions(Path(spec.bench.question_file)),
                            list(spec.bench.subtasks) if spec.bench.subtasks else None,
                            spec.bench.questions_per_subtask)


def check_prompts_fit(lm, questions) -> None:
    """Fail before anything is written when a question's first prompt cannot fit the model's context."""
    for q in questions:
        n = len(build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0]))
        if n >= lm.max_context:
            raise HarnessError(
                f"question {q.question_id}: prompt of {n} tokens does not fit the context of {lm.max_context}"
            )


def check_loaded_model(spec, lm) -> None:
    """The options that can only be checked against the loaded model, before anything is written."""
    positions = getattr(lm.model.config, "max_position_embeddings", None)
    if spec.model.max_context is not None and positions:
        require(spec.model.max_context <= positions, "model.max_context", spec.model.max_context,
                f"at most the model's max_position_embeddings, {positions}")
    vocab = lm.model.config.vocab_size
    for i, token in enumerate(spec.model.extra_stop_ids):
        require(token < vocab, f"model.extra_stop_ids[{i}]", token, f"a token id below the vocabulary size {vocab}")


def load_target(spec, questions):
    """The target model loaded and checked against the options and the questions."""
    lm = load_model(spec.model, spec.run.device)
    check_loaded_model(spec, lm)
    check_prompts_fit(lm, questions)
    return lm


def build_method(spec, lm):
    """The configured method on the loaded model; an option checked against the model (a token id beyond the
    vocabulary) raises `HarnessError` naming it."""
    try:
        return spec.method.cls(spec.method.options, lm)
    except OptionError as exc:
        raise exc.in_group("method") from None


def budget_for(spec, lm):
    """The draft budget of the run, or None when it uses none."""
    if not spec.uses_budget:
        return None
    return make_budget(spec.run.draft_budget, lm, spec.run.latency_curve,
                       Path(spec.model.cache_dir or default_cache_dir()), spec.model.name)


class InProcess:
    """This process answers the questions itself, in order, with the model it loaded."""

    workers = None  # nothing for the manifest beyond `environment`

    def __init__(self, spec, lm, method=None):
        self.spec, self.lm = spec, lm
        self.method = build_method(spec, lm) if method is None else method
        self.budget = budget_for(spec, lm)
        self.sampler = make_sampler(spec)

    @property
    def model(self):
        return self.lm

    @property
    def latency_source(self) -> str | None:
        return self.budget.latency.source if self.budget is not None else None

    def start(self, questions: int) -> None:
        """Nothing to start: the model is loaded."""

    def environment(self) -> dict:
        return environment(self.lm)

    def warm_up(self, question) -> None:
        warm_up(self.spec, self.lm, self.method, question, self.budget, self.sampler)

    def answer(self, question) -> dict:
        return answer_record(self.spec, self.lm, self.method, question, self.budget, self.sampler)

    def answers(self, questions):
        for question in questions:
            yield self.answer(question)
