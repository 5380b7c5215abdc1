"""Shared fixtures: the real embedded model (float32, CPU) and real Spec-Bench prompts, loaded once per session."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from evaluation.run.config import register_configs
from evaluation.questions import SUBTASKS, load_questions, select_questions

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
register_configs()


def question_file() -> Path:
    """data/ after `make data`, else the shared copy beside the repository."""
    for candidate in (ROOT / "data" / "spec_bench" / "question.jsonl",
                      ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"):
        if candidate.is_file():
            return candidate
    pytest.skip("Spec-Bench questions not found: run `make data`")


def compose_config(*overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        return compose("config", overrides=list(overrides))


@pytest.fixture(scope="session")
def spec_bench_file() -> Path:
    return question_file()


# `make gpu-check` runs the lossless tests with SPECDEC_TEST_DEVICE=cuda: the same tests, float32 on the GPU.
TEST_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")


@functools.lru_cache(maxsize=1)
def _embedded_model():
    from evaluation.models import load_model

    cfg = compose_config("model=smollm2-135m", "model.dtype=float32", f"run.device={TEST_DEVICE}")
    return load_model(cfg.model, TEST_DEVICE)


@pytest.fixture(scope="session")
def lm():
    """SmolLM2-135M-Instruct, float32 on the CPU (or SPECDEC_TEST_DEVICE), through the runner's loader."""
    return _embedded_model()


@pytest.fixture(scope="session")
def lossless_prompts(lm, spec_bench_file, vanilla_reference):
    """13 real Spec-Bench prompts by name: the first two questions of each subtask, plus the second turn of the
    first multi-turn question, asked after vanilla's own answer to its first turn. `assert_lossless` decodes the
    first of each subtask and the second turn (`ONE_PER_SUBTASK`) unless a test names others or
    SPECDEC_TEST_PROMPTS=all asks for every one."""
    from evaluation.templates import answer_text, build_prompt_ids

    questions = select_questions(load_questions(spec_bench_file), list(SUBTASKS), 2)
    prompts = {f"q{q.question_id}": build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0])
               for q in questions}
    first = questions[0]
    answer = answer_text(lm.tokenizer, vanilla_reference(prompts[f"q{first.question_id}"], LOSSLESS_TOKENS))
    prompts[f"q{first.question_id}-turn2"] = build_prompt_ids(
        lm.tokenizer, lm.chat_template, [(first.turns[0], answer)], first.turns[1])
    subset = {"one-per-subtask": ONE_PER_SUBTASK, "three": THREE}.get(PROMPT_SET)
    if subset:  # a shorter run (`.ci/offline-check`: three)
        return {name: prompts[name] for name in subset}
    return prompts


LOSSLESS_TOKENS = 64
# The first question of each subtask, plus the second turn: the lossless check's default set.
ONE_PER_SUBTASK = ("q81", "q81-turn2", "q161", "q241", "q321", "q401", "q481")
# SPECDEC_TEST_PROMPTS: all (every lossless check on all 13 prompts), one-per-subtask or three (a shorter run).
PROMPT_SET = os.environ.get("SPECDEC_TEST_PROMPTS", "")
# A second turn, a summary and a maths question: the offline-node check's set, where the environment is under test.
THREE = ("q81-turn2", "q241", "q401")


@pytest.fixture(scope="session")
def vanilla_reference(lm):
    """vanilla_reference(prompt_ids, max_new_tokens) -> vanilla's token ids, computed once per prompt."""
    from evaluation.catalog import method_class
    from evaluation.engine import decode_turn

    vanilla = method_class("vanilla")(None, lm)
    cache: dict = {}

    def reference(prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(prompt_ids), max_new_tokens)
        if key not in cache:
            # Greedy decoding with a smaller budget is a prefix of a longer run of the same prompt.
            longer = [n for p, n in cache if p == key[0] and n > max_new_tokens]
            cache[key] = (cache[key[0], min(longer)][:max_new_tokens] if longer
                          else decode_turn(lm, vanilla, prompt_ids, max_new_tokens).new_ids)
        return cache[key]

    return reference


@pytest.fixture(scope="session")
def assert_lossless(lm, lossless_prompts, vanilla_reference):
    """assert_lossless(method) decodes the lossless prompts (ONE_PER_SUBTASK; all 13 with SPECDEC_TEST_PROMPTS=all)
    and checks the ids equal vanilla's, token for token. `names` picks others (e.g. THREE for a variant).
    `budget` decodes through a draft budget (`evaluation.engine.budget`).
    Returns the TurnResults by prompt name, for further checks (e.g. mean accepted tokens)."""
    from evaluation.engine import decode_turn

    def check(method, max_new_tokens: int = LOSSLESS_TOKENS, names=None, budget=None) -> dict:
        results, mismatches = {}, []
        # With a shorter set of prompts (SPECDEC_TEST_PROMPTS), the names asked for that it holds.
        default = lossless_prompts if PROMPT_SET == "all" else ONE_PER_SUBTASK
        names = [name for name in names or default if name in lossless_prompts]
        assert names, "no lossless prompt selected"
        for name in names:
            prompt = lossless_prompts[name]
            result = decode_turn(lm, method, prompt, max_new_tokens, budget)
            expected = vanilla_reference(prompt, max_new_tokens)
            results[name] = result
            if result.new_ids != expected:
                at = next((i for i, (a, b) in enumerate(zip(result.new_ids, expected)) if a != b),
                          min(len(result.new_ids), len(expected)))
                mismatches.append(f"{name}: first difference at token {at}")
            assert len(result.new_ids) <= max_new_tokens
            assert sum(result.accept_lengths) == len(result.new_ids)
        assert not mismatches, f"{type(method).__name__} differs from vanilla: {mismatches}"
        return results

    return check
