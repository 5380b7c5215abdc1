"""Medusa-1: upstream's tree, checkpoints in upstream's layout (written here by hand, small and at the target's
size), the heads' arithmetic, and lossless decoding with random heads over the full and a reduced vocabulary."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from drafts.tree import StaticTree
from evaluation.engine.errors import HarnessError, OptionError
from drafts.checkpoint import save_draft
from medusa.heads import MedusaHeads, load_heads
from medusa.method import Medusa
from medusa.tree import MC_SIM_7B_63
from tests.test_gumiho import tiny_target


def upstream_state(hidden: int, vocab: int, heads: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A `medusa_lm_head.pt` state dict in upstream's keys: `{k}.0.linear.weight|bias`, `{k}.1.weight`."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for k in range(heads):
        state[f"{k}.0.linear.weight"] = torch.randn(hidden, hidden, generator=generator) * 0.05
        state[f"{k}.0.linear.bias"] = torch.randn(hidden, generator=generator) * 0.05
        state[f"{k}.1.weight"] = torch.randn(vocab, hidden, generator=generator) * 0.05
    return state


def write_upstream(folder, state, config_heads: int = 2):
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.half() for k, v in state.items()}, folder / "medusa_lm_head.pt")
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": config_heads, "medusa_num_layers": 1,
                                                    "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))


def test_the_tree_is_upstreams_mc_sim_7b_63():
    tree = StaticTree.from_paths(MC_SIM_7B_63)
    depths = [sum(len(p) == d for p in tree.paths) for d in range(1, 5)]
    assert len(tree.paths) == 63 and depths == [10, 28, 23, 2] and tree.top_k == 10
    assert tree.paths[:12] == tuple((i,) for i in range(10)) + ((0, 0), (0, 1))  # (depth, path) order


def test_an_upstream_checkpoint_loads_and_computes_what_upstream_does(tmp_path):
    """The Vicuna releases hold 5 heads while their config says 2: the stored ones count; Spec-Bench uses 4."""
    target = tiny_target()
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    state = upstream_state(hidden, vocab, heads=5)
    write_upstream(tmp_path / "release", state)
    heads = load_heads(str(tmp_path / "release"), target, num_heads=4)
    assert heads.num_heads == 4 and heads.vocab == vocab
    h = torch.randn(3, hidden)
    for k in range(4):  # upstream: Sequential(ResBlock, Linear); ResBlock(x) = x + SiLU(linear(x))
        w, b, p = (state[f"{k}.{key}"].half().float() for key in ("0.linear.weight", "0.linear.bias", "1.weight"))
        expected = (h + F.silu(h @ w.T + b)) @ p.T
        torch.testing.assert_close(heads(h)[k], expected, rtol=1e-5, atol=1e-5)
    assert load_heads(str(tmp_path / "release"), target).num_heads == 5


def test_heads_over_a_reduced_vocabulary_round_trip(tmp_path):
    target = tiny_target()
    ids = torch.tensor([1, 4, 9, 12, 15, 17, 20, 23, 30, 31, 40, 41])
    heads = MedusaHeads.for_target(target, num_heads=3, vocab_ids=ids)
    torch.testing.assert_close(heads[2][-1].weight, target.lm_head.weight[ids])  # upstream's start
    assert sorted(heads.state_dict())[:4] == ["0.0.linear.bias", "0.0.linear.weight", "0.1.weight", "1.0.linear.bias"]
    save_draft(heads, tmp_path / "mine", {"note": "test"})  # the drafts' writer: float16, config, manifest
    config = json.loads((tmp_path / "mine" / "config.json").read_text())
    assert config["medusa_num_heads"] == 3 and config["family"] == "medusa" and config["draft_vocab_size"] == 12
    back = load_heads(str(tmp_path / "mine"), target)
    assert torch.equal(back.vocab_ids, ids) and back.num_heads == 3
    h = torch.randn(2, target.config.hidden_size)
    torch.testing.assert_close(back(h), heads(h), rtol=2e-3, atol=2e-3)  # float16 weights
    assert torch.equal(back.target_ids(torch.tensor([0, 11])), torch.tensor([1, 41]))


def test_checkpoints_that_do_not_fit_give_one_line(tmp_path):
    target = tiny_target()
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    write_upstream(tmp_path / "wide", upstream_state(hidden, vocab + 1, heads=4))
    write_upstream(tmp_path / "few", upstream_state(hidden, vocab, heads=2))
    (tmp_path / "empty").mkdir()
    cases = [("wide", None, "1.weight is"), ("few", 4, "4 heads asked for, 2 stored"),
             ("empty", None, "no model.safetensors or medusa_lm_head")]
    for name, count, message in cases:
        with pytest.raises(HarnessError, match=message) as info:
            load_heads(str(tmp_path / name), target, count)
        assert "\n" not in str(info.value)


def test_options_are_checked(lm):
    with pytest.raises(OptionError, match="draft_vocab"):
        Medusa(Medusa.Config(draft_vocab=64), lm)  # only with heads=random
    with pytest.raises(HarnessError, match="4 deep"):
        Medusa(Medusa.Config(heads="random", num_heads=3), lm)
    with pytest.raises(HarnessError, match="make train FAMILY=medusa MODEL=no-such-model"):
        import dataclasses

        Medusa(Medusa.Config(), dataclasses.replace(lm, name="no-such-model"))


@pytest.mark.parametrize("options,prompt", [({}, "q241"), ({"draft_vocab": 4096, "seed": 1}, "q81-turn2")],
                         ids=["full", "reduced"])
def test_random_heads_are_lossless(lm, assert_lossless, options, prompt):
    method = Medusa(Medusa.Config(heads="random", **options), lm)
    assert_lossless(method, names=(prompt,))


def test_the_drafted_tree_reads_each_head_at_its_depth(lm, lossless_prompts):
    """Node (c1..cd) is head d-1's c_d-th best token at the state that gave the pending token."""
    from evaluation.engine import decode_turn
    from evaluation.engine.method import DecodeState

    method = Medusa(Medusa.Config(heads="random"), lm)
    prompt = lossless_prompts["q401"]
    decode_turn(lm, method, prompt, 3)  # leaves the state of the last step's accepted node
    tree = method.draft(DecodeState(list(prompt), len(prompt), torch.zeros(1), 8))
    with torch.inference_mode():
        ranked = method.heads(method.hidden).topk(10, dim=-1).indices
    for token, path in zip(tree.tokens, method.tree.paths):
        assert token == int(ranked[len(path) - 1, path[-1]])
    assert tree.parents[:10] == [0] * 10 and len(tree) == 63


@pytest.mark.skipif(not Medusa.ready_for("smollm2-135m"), reason="no Medusa heads committed for the embedded model")
def test_the_committed_heads_are_lossless_and_accept_drafts(lm, assert_lossless):
    """medusa/drafts/medusa/<model>/, what `make bench` runs for medusa: exact, and trained (random heads' drafts
    are almost never accepted)."""
    results = assert_lossless(Medusa(Medusa.Config(), lm), names=("q81-turn2", "q241"))
    tokens = sum(len(r.new_ids) for r in results.values())
    assert tokens > 1.05 * sum(r.steps for r in results.values())
