"""SpS: the self-draft and a separate draft model equal vanilla token for token, the draft length follows
transformers' heuristic, a draft model with another vocabulary or bad options gives one line, and our greedy ids
equal transformers' assisted generation with the same draft."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from baselines.sps import SelfSpeculative, SpS, self_draft_layers
from evaluation.engine import decode_turn
from evaluation.engine.budget.selection import prune
from evaluation.engine.errors import HarnessError, OptionError
from evaluation.engine.tree import DraftTree
from tests.conftest import THREE


def sps(lm, **options):
    return SpS(SpS.Config(**options), lm)


def self_sps(lm, **options):
    return SelfSpeculative(SelfSpeculative.Config(**options), lm)


@pytest.fixture(scope="module")
def random_draft_dir(lm, tmp_path_factory):
    """A tiny random Llama over the target's vocabulary, saved with the target's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=lm.model.config.vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=lm.max_context, tie_word_embeddings=True)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("random-draft")
    LlamaForCausalLM(config).save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def truncated_draft_dir(lm, tmp_path_factory):
    """The target's first 8 layers, final norm and head as a standalone model: what `sps-self` with
    draft_layers=8 runs, for transformers' assisted generation."""
    from evaluation.tools.bench_sps_vs_hf import truncated_copy

    return truncated_copy(lm, 8, tmp_path_factory.mktemp("truncated-draft"))


def test_the_self_draft_is_lossless(lm, assert_lossless):
    method = self_sps(lm)
    assert method.layers == list(range(4))  # the first eighth of SmolLM2's 30 layers
    results = assert_lossless(method, names=THREE)
    steps = sum(r.steps - 1 for r in results.values())
    assert sum(len(r.new_ids) - 1 for r in results.values()) > steps  # some drafts are accepted


def test_a_layer_subset_and_a_constant_length_are_lossless(lm, assert_lossless):
    assert_lossless(self_sps(lm, draft_layers=[0, 1, 2, 27, 28, 29], schedule="constant", gamma=3), names=("q161",))


def test_a_separate_draft_model_is_lossless(lm, assert_lossless, random_draft_dir):
    method = sps(lm, draft_model=str(random_draft_dir))
    assert method.layers is None and method.draft_lm.model.config.hidden_size == 64
    assert_lossless(method, names=("q401",))


def test_the_draft_length_follows_the_heuristic(lm, lossless_prompts):
    """With every layer as the draft, the drafts are the target's own greedy tokens: each step accepts all of them,
    so the length grows 5, 7, 9, ... (+2 each step) and each step commits it plus the bonus token."""
    method = self_sps(lm, draft_layers=30)
    result = decode_turn(lm, method, lossless_prompts["q241"], 40)
    assert result.accept_lengths[:4] == [1, 6, 8, 10]
    constant = decode_turn(lm, self_sps(lm, draft_layers=30, schedule="constant", gamma=4),
                           lossless_prompts["q241"], 40)
    assert constant.accept_lengths[:4] == [1, 5, 5, 5] and constant.new_ids == result.new_ids


def test_a_draft_with_another_vocabulary_or_bad_options_gives_one_line(lm, tmp_path, random_draft_dir):
    import shutil

    from transformers import AutoTokenizer

    other = tmp_path / "other-vocabulary"
    shutil.copytree(random_draft_dir, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<an-extra-token>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(HarnessError, match="another vocabulary than the target") as info:
        sps(lm, draft_model=str(other))
    assert "\n" not in str(info.value)
    with pytest.raises(HarnessError, match="no SpS draft model released for smollm2-135m") as info:
        sps(lm)  # no draft model named, none paired with the embedded model
    assert "\n" not in str(info.value)
    with pytest.raises(OptionError, match="draft_model"):
        sps(lm, draft_model="not a hub id or folder")
    with pytest.raises(OptionError, match="draft_layers"):
        sps(lm, draft_model=str(random_draft_dir), draft_layers=4)
    with pytest.raises(OptionError, match="draft_layers"):
        self_sps(lm, draft_layers=[3, 1])
    with pytest.raises(OptionError, match="draft_layers"):
        self_sps(lm, draft_layers=31)
    with pytest.raises(OptionError, match="gamma"):
        self_sps(lm, gamma=100)
    assert self_draft_layers(None, 2) == [0] and self_draft_layers([0, 5], 8) == [0, 5]
    assert not SpS.ready_for(lm.name) and SelfSpeculative.ready_for(lm.name)
    assert SpS.ready_for("vicuna-7b-v1.3")  # Spec-Bench's pairing: make bench MODEL=vicuna-7b runs sps


def test_the_draft_budget_keeps_the_draft_probabilities_of_the_nodes_it_keeps():
    tree = DraftTree.chain([5, 6, 7])
    tree.draft_probs = torch.eye(8)[[5, 6, 7]]
    kept = prune(tree, np.array([1, 2]))
    assert kept.tokens == [5, 6] and torch.equal(kept.draft_probs, torch.eye(8)[[5, 6]])


def test_greedy_ids_equal_transformers_assisted_generation(lm, lossless_prompts, truncated_draft_dir):
    """Our SpS with the target's first 8 layers, and transformers' `generate(assistant_model=...)` with the same
    layers as a standalone model: the same greedy ids (both are vanilla's)."""
    from evaluation.models import load_companion_model
    from evaluation.tools.bench_sps_vs_hf import run_hf_assisted

    assistant, _ = load_companion_model(str(truncated_draft_dir), lm)
    ours_self = self_sps(lm, draft_layers=8)
    ours_separate = sps(lm, draft_model=str(truncated_draft_dir))
    for name in ("q81-turn2", "q321"):
        prompt = lossless_prompts[name]
        hf = run_hf_assisted(lm, assistant, prompt, 40)["ids"]
        assert decode_turn(lm, ours_self, prompt, 40).new_ids == hf, name
        assert decode_turn(lm, ours_separate, prompt, 40).new_ids == hf, name
