"""The Python API (`specdec`): a target and methods by the command line's names and options, a prompt and a chat
answered, tokens equal to vanilla's under greedy decoding, and bad input in one line."""

from __future__ import annotations

import pytest

import specdec
from evaluation.engine.errors import HarnessError


@pytest.fixture(scope="module")
def target():
    return specdec.load("smollm2-135m", dtype="float32")


def test_a_prompt_and_a_chat_answered_as_vanilla_answers_them(target):
    vanilla, pld = target.method("vanilla"), target.method("pld", max_ngram_size=2)
    prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox"
    reference, out = vanilla.generate(prompt, max_new_tokens=32), pld.generate(prompt, max_new_tokens=32)
    assert out.token_ids == reference.token_ids and out.text == reference.text and len(out.token_ids) > 0
    assert sum(out.accept_lengths) == len(out.token_ids) and out.mat == len(out.token_ids) / len(out.accept_lengths)
    assert out.seconds and sum(out.seconds.values()) == pytest.approx(out.wall_time, rel=1e-6)
    chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": reference.text},
            {"role": "user", "content": "Once more, shorter."}]
    assert pld.generate(chat, max_new_tokens=16).token_ids == vanilla.generate(chat, max_new_tokens=16).token_ids
    sampled = [pld.generate(prompt, max_new_tokens=8, temperature=0.8, seed=s).token_ids for s in (1, 1)]
    assert sampled[0] == sampled[1]  # seeded


def test_bad_names_options_and_chats_are_one_line(target):
    with pytest.raises(HarnessError, match=r"^unknown method 'logitsepc' \(did you mean 'logitspec'\?\)"):
        target.method("logitsepc")
    with pytest.raises(HarnessError, match=r"^unknown option method\.max_ngram_sizee for method 'pld' \(options: "):
        target.method("pld", max_ngram_sizee=3)
    with pytest.raises(HarnessError, match=r"^bad value for method\.max_ngram_size: 0"):
        target.method("pld", max_ngram_size=0)
    with pytest.raises(HarnessError, match="a chat is alternating user and assistant messages"):
        target.method("vanilla").generate([{"role": "assistant", "content": "Hi."}])
