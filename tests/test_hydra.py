"""Hydra++: a checkpoint in upstream's exact layout (written here by hand) loads and computes what upstream's
modules compute, checkpoints that do not fit give one line, the tree's children depend on their own path, and
random heads are lossless."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from evaluation.engine.errors import HarnessError
from medusa.hydra import Hydra
from medusa.hydra_heads import HydraHeads, load_hydra_heads, save_upstream, upstream_state
from tests.test_gumiho import tiny_target


def upstream_checkpoint(target, heads: int = 4, layers: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """`hydra_lm_head.pt` as upstream's `hydra_head.state_dict()` writes it: the prefix LlamaModel (its unused
    embedding included), `input_embed_fn`, the shared block under every index it appears at."""
    from transformers import LlamaModel

    generator = torch.Generator().manual_seed(seed)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = 1
    torch.manual_seed(seed)
    prefix = LlamaModel(config)
    state = {f"prefix_embeding_layer.{k}": v for k, v in prefix.state_dict().items()}
    hidden, vocab = config.hidden_size, config.vocab_size
    state["input_embed_fn.weight"] = target.model.embed_tokens.weight.detach().clone()

    def rand(*shape):
        return torch.randn(*shape, generator=generator) * 0.05

    for i in range(heads):
        width = (i + 2) * hidden
        for part in ("linear", "res_connection"):
            state[f"hydra_mlp.{i}.1.{part}.weight"], state[f"hydra_mlp.{i}.1.{part}.bias"] = rand(hidden, width), rand(
                hidden)
        shared_w, shared_b = rand(hidden, hidden), rand(hidden)
        for index in range(3, 2 * layers, 2):  # one module repeated: the same tensors under each index
            state[f"hydra_mlp.{i}.{index}.linear.weight"], state[f"hydra_mlp.{i}.{index}.linear.bias"] = shared_w, shared_b
        state[f"hydra_lm_head.{i}.1.weight"], state[f"hydra_lm_head.{i}.1.bias"] = rand(vocab, hidden), rand(vocab)
    return state, prefix


def write(folder, state, **config):
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.half() for k, v in state.items()}, folder / "hydra_lm_head.pt")
    fields = {"hydra_head_arch": "prefix-mlp", "grounded_heads": True, "hidden_state_offset": 0, "hydra_num_heads": 4,
              "hydra_num_layers": 4, **config}
    (folder / "config.json").write_text(json.dumps(fields))


def test_an_upstream_checkpoint_loads_and_computes_what_upstream_does(tmp_path):
    target = tiny_target()
    state, prefix = upstream_checkpoint(target)
    write(tmp_path / "release", state)
    heads = load_hydra_heads(str(tmp_path / "release"), target)
    assert heads.num_heads == 4 and heads.prefix
    h = torch.randn(1, 5, target.config.hidden_size)
    # the prefix layer: upstream's one-layer LlamaModel on inputs_embeds (float16-rounded weights)
    prefix.load_state_dict({k[len("prefix_embeding_layer."):]: v.half().float() for k, v in state.items()
                            if k.startswith("prefix_embeding_layer.")})
    expected = prefix(inputs_embeds=h, position_ids=torch.arange(5)[None]).last_hidden_state
    mask = torch.full((5, 5), torch.finfo(torch.float32).min).triu_(1)[None, None]
    from evaluation.engine.kv_cache import PositionalKVCache

    got = heads.prefix_states(h, torch.arange(5)[None], mask, PositionalKVCache(1, 8))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    # head i: res(x) + SiLU(lin(x)), the shared block three times, the projection with its bias
    for i in range(4):
        x = torch.randn(3, (i + 2) * target.config.hidden_size)

        def w(key):
            return state[key].half().float()

        v = x @ w(f"hydra_mlp.{i}.1.res_connection.weight").T + w(f"hydra_mlp.{i}.1.res_connection.bias") + F.silu(
            x @ w(f"hydra_mlp.{i}.1.linear.weight").T + w(f"hydra_mlp.{i}.1.linear.bias"))
        for _ in range(3):
            v = v + F.silu(v @ w(f"hydra_mlp.{i}.3.linear.weight").T + w(f"hydra_mlp.{i}.3.linear.bias"))
        expected = v @ w(f"hydra_lm_head.{i}.1.weight").T + w(f"hydra_lm_head.{i}.1.bias")
        torch.testing.assert_close(heads.heads[i](x), expected, rtol=1e-4, atol=1e-5)


def test_heads_round_trip_through_upstreams_layout(tmp_path):
    target = tiny_target()
    torch.manual_seed(3)
    heads = HydraHeads.for_target(target, num_heads=2, num_layers=2)
    assert "hydra_mlp.1.1.res_connection.weight" in upstream_state(heads)
    save_upstream(heads, tmp_path / "mine")
    back = load_hydra_heads(str(tmp_path / "mine"), target)
    assert back.num_heads == 2 and back.num_layers == 2
    for key, value in heads.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_checkpoints_that_do_not_fit_give_one_line(tmp_path):
    target = tiny_target()
    state, _ = upstream_checkpoint(target)
    state["hydra_lm_head.0.1.weight"] = torch.zeros(7, target.config.hidden_size)
    write(tmp_path / "wide", state)
    write(tmp_path / "ungrounded", upstream_checkpoint(target)[0], grounded_heads=False)
    write(tmp_path / "few", upstream_checkpoint(target)[0], hydra_num_heads=2)
    cases = [("wide", None, "hydra_lm_head.0.1.weight is"), ("ungrounded", None, "not supported"),
             ("few", 4, "4 heads asked for, 2 stored")]
    for name, count, message in cases:
        with pytest.raises(HarnessError, match=message) as info:
            load_hydra_heads(str(tmp_path / name), target, count)
        assert "\n" not in str(info.value)


def test_a_nodes_children_come_from_its_own_path(lm, lossless_prompts):
    """Node (c1..cd)'s children are the ranked predictions of head d on [P ; emb(pending) ; emb(c1..cd tokens)]."""
    from evaluation.engine import decode_turn
    from evaluation.engine.method import DecodeState

    method = Hydra(Hydra.Config(heads="random"), lm)
    prompt = lossless_prompts["q401"]
    decode_turn(lm, method, prompt, 3)
    pending = 1234
    tree = method.draft(DecodeState(list(prompt) + [pending], len(prompt), torch.zeros(1), 8))
    assert len(tree) == 63 and tree.parents[:10] == [0] * 10
    embed = lm.model.get_input_embeddings()
    for node in (0, 10, 40, 61):  # depths 1, 2, 3, 4
        path, ancestors = method.tree.paths[node], []
        parent = method.tree.parents[node]
        while parent >= 0:
            ancestors.insert(0, tree.tokens[parent])
            parent = method.tree.parents[parent]
        with torch.inference_mode():
            row = torch.cat([method.prefix_state, *embed(torch.tensor([pending, *ancestors]))])
            ranked = method.heads.heads[len(path) - 1](row).topk(10).indices
        assert tree.tokens[node] == int(ranked[path[-1]]), node


def test_random_heads_are_lossless(lm, assert_lossless):
    assert_lossless(Hydra(Hydra.Config(heads="random"), lm), names=("q81-turn2",))


def test_options_are_checked(lm):
    with pytest.raises(HarnessError, match="4 deep"):
        Hydra(Hydra.Config(heads="random", num_heads=2), lm)
    with pytest.raises(HarnessError, match="no Hydra\+\+ heads committed or released for no-such-model"):
        import dataclasses

        Hydra(Hydra.Config(), dataclasses.replace(lm, name="no-such-model"))


@pytest.mark.skipif(not Hydra.ready_for("smollm2-135m"), reason="no Hydra heads committed for the embedded model")
def test_the_committed_heads_are_lossless_and_accept_drafts(lm, assert_lossless):
    """medusa/drafts/hydra/<model>/, what `make bench` runs for hydra: exact, and trained (their reduced vocabulary
    mapped back to the target's ids: random heads' drafts are almost never accepted)."""
    method = Hydra(Hydra.Config(), lm)
    assert method.heads.vocab_ids is not None and method.heads.vocab < lm.model.config.vocab_size
    results = assert_lossless(method, names=("q81-turn2", "q241"))
    tokens = sum(len(r.new_ids) for r in results.values())
    assert tokens > 1.05 * sum(r.steps for r in results.values())
