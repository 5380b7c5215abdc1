"""The side-by-side tool's own logic (the tool itself installs a second environment and is run by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evaluation.tools.upstream_parity import (JOBS, TREES, UPSTREAM_EAGLE_KEYS, compare, first_difference,
                                              hydra_heads_over_the_whole_vocabulary, run_ours, side_model,
                                              write_upstream_eagle_draft, write_upstream_hydra_heads,
                                              write_upstream_medusa_heads)

# Spec-Bench's model/eagle/choices.py at fd2c1cd, as written there: the only tree its EAGLE-1 draft grows.
UPSTREAM_MC_SIM_7B_63 = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
                         [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
                         [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]


def test_accept_lengths_line_up_as_both_loops_count_them():
    upstream = [3, 1, 4, 2, 5]
    assert first_difference([3, 1, 4], [2, 5], upstream, learns_past=True) is None
    assert first_difference([3, 1, 2], [2, 5], upstream, learns_past=True) is None  # our last step cut short
    assert first_difference([3, 2, 4], [2, 5], upstream, learns_past=True) == 1
    assert first_difference([3, 1, 4], [2], upstream, learns_past=True) == 4  # upstream took a step more
    assert first_difference([3, 1, 4], [2, 6], upstream, learns_past=True) == 4
    assert first_difference([3, 1, 4], [], upstream, learns_past=False) is None  # nothing carried: ignored
    assert first_difference([3, 1, 4, 2, 5, 1], [], upstream, learns_past=False) == 5
    # after a stop token upstream's step past it commits the stop token alone: compared by number only
    assert first_difference([3, 1, 4, 2], [3], upstream, learns_past=True, ended_at_stop=True) is None
    assert first_difference([3, 1, 4], [3], upstream, learns_past=True, ended_at_stop=True) == 4


def test_side_model_config_is_what_transformers_4_37_reads(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": "float32",
                                                    "rope_parameters": {"rope_theta": 100000.0}}))
    (source / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend"}))
    (source / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "merges": [["a", "b"], ["ab", "c"]]}}))
    folder = side_model(source, tmp_path / "scratch")
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_theta"] == 100000.0 and config["torch_dtype"] == "float32"
    assert "rope_parameters" not in config and (folder / "model.safetensors").is_symlink()
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["merges"] == ["a b", "ab c"]


def test_our_side_records_what_upstream_records(lm, lossless_prompts):
    """Our side of the comparison on the real model: the fed ids in upstream's layout, and `compare` finding the
    first differing step (the upstream side needs a Spec-Bench clone and a second environment, so it is run by hand)."""
    prompt = lossless_prompts["q81"]
    for method in ("recycling", "lookahead"):
        ours = run_ours(lm, method, [prompt], 16)
        assert len(ours[0]["tokens"]) == 16 and len(ours[0]["fed"]) == TREES
        same = compare(method, ["q81"], ours, ours, 16)[0]
        assert same["tokens_identical"] and same["accept_lengths_identical"] and same["first_trees_identical"]
        theirs = [{**ours[0], "accept_lengths": list(ours[0]["accept_lengths"])}]
        theirs[0]["accept_lengths"][2] += 1
        assert compare(method, ["q81"], ours, theirs, 16)[0]["first_differing_step"] == 2
    # Lookahead's first window goes with upstream's prefill: the first recorded forward is window step 2, the
    # pending token then 8 + 9 window tokens in level order (no guesses yet).
    assert [len(fed) for fed in ours[0]["fed"]] == [1 + 8 + 9, 1 + 7 + 8 + 8]
    # Medusa and Hydra: the pending token then the 63 nodes of mc_sim_7b_63, as upstream's tree_candidates
    for method in ("medusa", "hydra"):
        ours = run_ours(lm, method, [prompt], 4, {"heads": "random"})
        assert [len(fed) for fed in ours[0]["fed"]] == [1 + 63, 1 + 63]
        assert ours[0]["fed"][0][0] == ours[0]["tokens"][0]  # the pending token: the prefill's


def test_eagle_jobs_hand_upstream_our_draft_as_its_eamodel_loads_it(lm, tmp_path):
    """The draft folder upstream's EAGLE-1 and EAGLE-2 read: `Model`'s keys and shapes (its embedding aside: the
    driver adds the target's), our committed weights, the target's config with one layer, and our tree settings."""
    from safetensors.torch import load_file

    from eagle.method import Eagle
    from drafts.checkpoint import read_weights

    target = lm.model.config
    hidden, head_dim = target.hidden_size, target.hidden_size // target.num_attention_heads  # as upstream computes it
    kv, inner = target.num_key_value_heads * head_dim, target.intermediate_size
    shapes = {"fc.weight": (hidden, 2 * hidden), "fc.bias": (hidden,),
              "layers.0.self_attn.q_proj.weight": (hidden, hidden), "layers.0.self_attn.k_proj.weight": (kv, hidden),
              "layers.0.self_attn.v_proj.weight": (kv, hidden), "layers.0.self_attn.o_proj.weight": (hidden, hidden),
              "layers.0.mlp.gate_proj.weight": (inner, hidden), "layers.0.mlp.up_proj.weight": (inner, hidden),
              "layers.0.mlp.down_proj.weight": (hidden, inner), "layers.0.post_attention_layernorm.weight": (hidden,)}
    assert sorted(shapes) == sorted(UPSTREAM_EAGLE_KEYS)
    committed = read_weights(Eagle.committed_dir(lm.name))
    jobs = {method: JOBS[method](lm, tmp_path) for method in ("eagle", "eagle2")}
    for job in jobs.values():
        state = load_file(job["eagle_weights"])
        assert {key: tuple(value.shape) for key, value in state.items()} == shapes
        assert all(torch.equal(state[key], committed[key].float()) for key in state)
        config = json.loads(Path(job["eagle_config"]).read_text())
        assert config["num_hidden_layers"] == 1 and config["bias"] is True  # fc has its bias, as upstream's default
        # transformers 4.37's form: the RoPE base at the top; no scaling (upstream's EConfig accepts only its own)
        assert config["rope_theta"] == 100000.0 and "rope_parameters" not in config
        assert config.get("rope_scaling") is None
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "rms_norm_eps", "hidden_act", "pad_token_id", "max_position_embeddings"):
            assert config[key] == getattr(target, key), key
    assert jobs["eagle"]["eagle_tree_choices"] == UPSTREAM_MC_SIM_7B_63
    # Spec-Bench's inference_eagle2.py defaults, which are ours; both count the pending token in total_token(s)
    assert jobs["eagle2"]["eagle2_args"] == {"total_token": 60, "depth": 5, "top_k": 10}


def test_only_an_eagle_draft_is_handed_to_upstreams_eagle(lm, tmp_path):
    from drafts.serial_draft import SerialDraft

    gumiho = SerialDraft.for_target(lm.model, mlp_num=1, layers=2)
    with pytest.raises(SystemExit, match="gumiho draft"):
        write_upstream_eagle_draft(gumiho, lm.model.config.to_dict(), tmp_path / "draft")


def test_medusa_heads_are_written_in_upstreams_layout_and_read_back_by_ours(tmp_path):
    """`medusa_lm_head.pt` as `MedusaModel.medusa_head` names it (block `{k}.0.linear`, projection `{k}.1` without a
    bias) and its config; our loader reads the same file back exactly. Reduced-vocabulary heads are refused."""
    from medusa.heads import MedusaHeads, load_heads
    from tests.test_gumiho import tiny_target

    target = tiny_target()
    torch.manual_seed(1)
    heads = MedusaHeads.for_target(target, num_heads=3)
    folder = write_upstream_medusa_heads(heads, tmp_path / "medusa")
    state = torch.load(folder / "medusa_lm_head.pt", weights_only=True)
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    assert {key: tuple(value.shape) for key, value in state.items()} == {
        **{f"{k}.0.linear.weight": (hidden, hidden) for k in range(3)},
        **{f"{k}.0.linear.bias": (hidden,) for k in range(3)},
        **{f"{k}.1.weight": (vocab, hidden) for k in range(3)}}
    assert json.loads((folder / "config.json").read_text())["medusa_num_heads"] == 3
    back = load_heads(str(folder), target, 3)
    assert all(torch.equal(back.state_dict()[key], value) for key, value in heads.state_dict().items())
    reduced = MedusaHeads.for_target(target, num_heads=3, vocab_ids=torch.arange(0, vocab, 2))
    with pytest.raises(SystemExit, match="reduced"):
        write_upstream_medusa_heads(reduced, tmp_path / "reduced")


def test_hydra_heads_carry_the_targets_own_embedding_for_upstream(tmp_path):
    """Upstream loads `input_embed_fn.weight` into the target's embedding (tied to its head here): the file holds
    the target's own, bit for bit. Our loader reads the same file back exactly."""
    from medusa.hydra_heads import HydraHeads, load_hydra_heads
    from tests.test_gumiho import tiny_target

    target = tiny_target()
    torch.manual_seed(2)
    heads = HydraHeads.for_target(target, num_heads=2, num_layers=2)
    folder = write_upstream_hydra_heads(heads, target.get_input_embeddings().weight, tmp_path / "hydra")
    state = torch.load(folder / "hydra_lm_head.pt", weights_only=True)
    assert torch.equal(state["input_embed_fn.weight"], target.get_input_embeddings().weight)
    assert {"prefix_embeding_layer.norm.weight", "hydra_mlp.1.1.res_connection.weight", "hydra_mlp.1.3.linear.bias",
            "hydra_lm_head.1.1.bias"} <= set(state)
    back = load_hydra_heads(str(folder), target)
    assert all(torch.equal(back.state_dict()[key], value) for key, value in heads.state_dict().items())


def test_trained_hydra_heads_over_the_whole_vocabulary_draft_the_same_tokens():
    """Reduced-vocabulary heads widened for upstream: every head's top-10 target ids are the reduced heads'."""
    from medusa.hydra_heads import HydraHeads
    from tests.test_gumiho import tiny_target

    target = tiny_target()
    torch.manual_seed(4)
    reduced = HydraHeads.for_target(target, num_heads=2, num_layers=2, vocab_ids=torch.arange(1, 64, 3)).eval()
    for head in reduced.heads:
        torch.nn.init.normal_(head.lm_head.bias, std=3.0)  # trained biases are not zero
    full = hydra_heads_over_the_whole_vocabulary(reduced, target.config)
    assert full.vocab_ids is None and full.vocab == target.config.vocab_size
    for i in range(2):
        x = torch.randn(5, (i + 2) * target.config.hidden_size)
        ours = reduced.target_ids(reduced.heads[i](x).topk(10, dim=-1).indices)
        assert torch.equal(full.heads[i](x).topk(10, dim=-1).indices, ours)
