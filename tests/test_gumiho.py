"""Gumiho: the draft tree (docs/methods/gumiho.md, Draft tree search) on hand-made scores, FTA rows, the checkpoint loader, and
losslessness on the real embedded model with a seeded random draft."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from evaluation.engine import decode_turn
from evaluation.engine.tree import DraftTree, build_tree_inputs, verify_greedy, verify_rows
from evaluation.engine.errors import HarnessError, OptionError
from drafts.checkpoint import load_draft, save_draft
from eagle.method import Eagle2Config, GumihoSerial
from gumiho.method import Gumiho, GumihoConfig
from drafts.tree import ROOT, Pool, expand, fta_rows, layout, root_paths, select_nodes


def log(*probs):
    return torch.log(torch.tensor(probs, dtype=torch.float64))


# ----------------------------------------------------------------------------------------- the tree
def test_tree_on_hand_made_head_outputs_follows_the_spec():
    # top_k 2, one serial step, one MLP head with mlptopk 2 and pruning 2, over a 5-token vocabulary.
    pool = Pool()
    top = torch.topk(log(0.5, 0.3, 0.1, 0.06, 0.04), 2)
    level1 = pool.add(top.indices, top.values, [ROOT, ROOT])  # tokens 0, 1
    serial = torch.stack([log(0.02, 0.03, 0.6, 0.3, 0.05), log(0.05, 0.02, 0.01, 0.02, 0.9)])
    _, kept = expand(top.values, serial, 2, 2)  # 0.30 (beam 0, token 2), 0.27 (beam 1, token 4)
    assert kept.beam.tolist() == [0, 1] and kept.tokens.tolist() == [2, 4]
    level2 = pool.add(kept.tokens, kept.scores, [level1[b] for b in kept.beam])
    heads = torch.stack([log(0.02, 0.7, 0.03, 0.2, 0.05), log(0.04, 0.4, 0.5, 0.03, 0.03)])
    _, mlp = expand(kept.scores, heads, 2, 2)  # 0.21 (anchor 0, token 1), 0.135 (anchor 1, token 2)
    assert mlp.beam.tolist() == [0, 1] and mlp.tokens.tolist() == [1, 2]
    pool.add(mlp.tokens, mlp.scores, [level2[b] for b in mlp.beam])
    assert np.allclose(np.exp(pool.scores), [0.5, 0.3, 0.30, 0.27, 0.21, 0.135])
    assert layout(pool, select_nodes(pool, 4)) == ([0, 1, 2, 4], [0, 0, 1, 2])
    assert layout(pool, select_nodes(pool, 5)) == ([0, 1, 2, 4, 1], [0, 0, 1, 2, 3])


def test_selection_invariants_on_random_pools_with_ties():
    rng = random.Random(0)
    for _ in range(300):
        pool = Pool()
        for i in range(rng.randrange(1, 40)):
            parent = rng.choice([ROOT] + list(range(i)))
            base = 0.0 if parent == ROOT else pool.scores[parent]
            step = rng.choice([0.0, -0.5, -1.0])  # many exact ties, a child can tie with its parent
            pool.add([rng.randrange(9)], [base + step], [parent])
        budget = rng.randrange(1, 45)
        chosen = select_nodes(pool, budget)
        assert len(chosen) == min(budget, len(pool))
        assert all(pool.parents[i] == ROOT or pool.parents[i] in chosen for i in chosen)
        # the chosen set is the top `budget` by (score desc, pool index)
        ranked = sorted(range(len(pool)), key=lambda i: (-pool.scores[i], i))
        assert chosen == sorted(ranked[:budget])
        tokens, parents = layout(pool, chosen)
        assert all(p < i + 1 for i, p in enumerate(parents))


def test_a_tie_at_the_cut_off_never_takes_a_child_without_its_parent():
    pool = Pool()
    pool.add([5, 6], [-1.0, -1.0], [ROOT, ROOT])
    pool.add([7], [-1.0], [1])  # the child of node 1 ties with both roots
    assert select_nodes(pool, 1) == [0]
    assert select_nodes(pool, 2) == [0, 1]
    assert layout(pool, select_nodes(pool, 3)) == ([5, 6, 7], [0, 0, 2])


# ---------------------------------------------------------------------------------------------- FTA
PARENTS = [0, 0, 0, 2, 3, 5, 3]  # nodes 1..7


def test_fta_pads_short_paths_with_the_most_frequent_column_node():
    paths = root_paths(PARENTS)
    assert paths == [[0, 1], [0, 2, 4], [0, 3, 5, 6], [0, 3, 7]]
    # column 2: 4, 5, 7 once each -> the smallest, 4; column 3: only 6
    assert fta_rows(paths) == [[0, 1, 4, 6], [0, 2, 4, 6], [0, 3, 5, 6], [0, 3, 7, 6]]


def test_row_verification_accepts_a_padded_row_that_tree_verification_cannot():
    tokens = [10, 11, 12, 13, 14, 15, 16, 17]  # node i holds token 10 + i
    tree = DraftTree(tokens[1:], PARENTS)
    inputs = build_tree_inputs(tokens[0], tree, 0, torch.float32, torch.device("cpu"))
    predicted = {0: 11, 1: 14, 4: 16, 6: 3}  # node 1's argmax is node 4's token, though 4 is not its child
    logits = torch.zeros(8, 20)
    for node in range(8):
        logits[node, predicted.get(node, 0)] = 1.0
    exact = verify_greedy(inputs, logits)
    assert exact.path == [0, 1] and exact.bonus == 14
    # the paths as rows give the same verdict as tree verification
    assert verify_rows(inputs, logits, root_paths(PARENTS)).path == exact.path
    padded = verify_rows(inputs, logits, fta_rows(root_paths(PARENTS)))
    assert padded.path == [0, 1, 4, 6] and padded.accepted_tokens == [11, 14, 16] and padded.bonus == 3


# --------------------------------------------------------------------------------------- the loader
def tiny_target():
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def upstream_state_dict(h: int, inter: int, vocab: int, kv: int, heads: int, mlp_num: int) -> dict:
    """The released checkpoints' keys and shapes (upstream cnets.Model), written out by hand."""
    g = torch.Generator().manual_seed(1)
    shapes = {"embed_tokens.weight": (vocab, h), "fc.weight": (h, 2 * h), "fc.bias": (h,)}
    head_dim = h // heads
    for i in range(2):
        shapes.update({
            f"layers.{i}.self_attn.q_proj.weight": (h, h), f"layers.{i}.self_attn.k_proj.weight": (kv * head_dim, h),
            f"layers.{i}.self_attn.v_proj.weight": (kv * head_dim, h), f"layers.{i}.self_attn.o_proj.weight": (h, h),
            f"layers.{i}.mlp.gate_proj.weight": (inter, h), f"layers.{i}.mlp.up_proj.weight": (inter, h),
            f"layers.{i}.mlp.down_proj.weight": (h, inter), f"layers.{i}.post_attention_layernorm.weight": (h,),
        })
    shapes["layers.1.input_layernorm.weight"] = (h,)  # layer 0 has none
    for i in range(mlp_num):
        shapes[f"mlp.{i}.0.linear.weight"] = (h, 2 * h)
        shapes[f"mlp.{i}.0.linear.bias"] = (h,)
        for block in range(1, 6):
            shapes[f"mlp.{i}.{block}.linear.weight"] = (h, h)
            shapes[f"mlp.{i}.{block}.linear.bias"] = (h,)
    return {key: torch.randn(shape, generator=g) for key, shape in shapes.items()}


@pytest.mark.parametrize("renamed", [False, True])
def test_released_checkpoint_loads_and_round_trips(tmp_path, renamed):
    target = tiny_target()
    state = upstream_state_dict(16, 32, 64, 2, 4, 5)
    written = {(k.replace("mlp.", "mlp.mlp.", 1) if renamed and k.startswith("mlp.") else k): v
               for k, v in state.items()}
    released = tmp_path / "released"
    released.mkdir()
    torch.save(written, released / "pytorch_model.bin")
    config = dict(target.config.to_dict(), num_hidden_layers=2)
    (released / "config.json").write_text(json.dumps(config, default=str))

    draft = load_draft(released, target)
    assert draft.mlp_num == 5
    own = draft.state_dict()
    for key, value in state.items():
        if key != "embed_tokens.weight":
            assert torch.equal(own[key], value), key
    assert draft.embed is target.get_input_embeddings() and draft.head is target.get_output_embeddings()
    assert draft.config.rope_parameters["rope_theta"] == 5e5
    assert torch.allclose(draft.rotary.inv_freq, target.model.rotary_emb.inv_freq)

    ours = save_draft(draft, tmp_path / "ours", {"note": "round trip"})
    again = load_draft(ours, target)
    for key, value in again.state_dict().items():
        assert torch.equal(value, own[key].half().float()), key
    assert json.loads((ours / "manifest.json").read_text()) == {"note": "round trip"}


def test_a_checkpoint_that_does_not_fit_gives_one_line(tmp_path):
    target = tiny_target()
    state = upstream_state_dict(16, 32, 64, 2, 4, 1)
    del state["fc.bias"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(HarnessError, match="missing \\['fc.bias'\\]"):
        load_draft(tmp_path, target)
    with pytest.raises(HarnessError, match="not found"):
        load_draft(tmp_path / "nowhere", target)


# ---------------------------------------------------------------------------------- options, errors
def test_options_are_checked():
    with pytest.raises(OptionError, match="top_k"):
        GumihoConfig(top_k=0).check()
    with pytest.raises(OptionError, match="depth"):
        GumihoConfig(depth=5, mlp_num=5).check()
    with pytest.raises(OptionError, match="sibling_mask"):
        GumihoConfig(sibling_mask="identity").check()
    with pytest.raises(OptionError, match="total_tokens"):
        Eagle2Config(total_tokens=0).check()


def test_missing_committed_draft_names_the_training_command(lm):
    other = dataclasses.replace(lm, name="no-such-model")
    with pytest.raises(HarnessError, match="make train FAMILY=gumiho MODEL=no-such-model"):
        Gumiho(GumihoConfig(), other)


def test_metadata():
    from evaluation.catalog import method_class, method_display

    assert method_class("gumiho") is Gumiho and method_class("gumiho-serial") is GumihoSerial
    gumiho = method_display("gumiho")
    assert (gumiho.title, gumiho.family, gumiho.order, gumiho.colour) == ("Gumiho", "trained draft", 50, "#17becf")


# ------------------------------------------------------------------------------------ on the model
def test_draft_tree_from_the_model_has_the_budget_and_valid_parents(lm, lossless_prompts):
    method = Gumiho(GumihoConfig(draft="random"), lm)
    prompt = lossless_prompts["q81"]
    result = decode_turn(lm, method, prompt, 3)
    assert len(result.new_ids) == 3
    # the first draft again, by hand
    tree = _draft_once(method, lm, prompt, result.new_ids[0])
    assert len(tree) == 63 and tree.rows is None
    assert all(p < i + 1 for i, p in enumerate(tree.parents))
    depths = [0]
    for p in tree.parents:
        depths.append(depths[p] + 1)
    assert max(depths) <= 7


@torch.inference_mode()
def _draft_once(method, lm, prompt, first_token):
    """The first draft of a turn, as the engine asks for it (inference mode, prompt hidden states)."""
    from evaluation.engine.method import DecodeState

    out = lm.model(input_ids=torch.tensor([prompt]), output_hidden_states=True, logits_to_keep=1)
    method.reset(prompt, hidden_states=out.hidden_states[-1][0])
    return method.draft(DecodeState(list(prompt) + [first_token], len(prompt), torch.zeros(1), 8))


def test_gumiho_random_draft_is_lossless(lm, assert_lossless):
    torch.manual_seed(0)
    assert_lossless(Gumiho(GumihoConfig(draft="random", seed=0), lm), max_new_tokens=32, names=("q81", "q481"))


def test_the_committed_drafts_are_lossless_and_accept_drafts(lm, assert_lossless):
    """gumiho/drafts/<model>/, what `make bench` runs: exact, and trained (a random draft's MAT is about 1)."""
    results = assert_lossless(Gumiho(GumihoConfig(), lm), names=("q81", "q81-turn2", "q161", "q321", "q481"))
    mat = sum(len(r.new_ids) for r in results.values()) / sum(r.steps for r in results.values())
    assert mat > 1.2, mat
    assert_lossless(GumihoSerial(Eagle2Config(), lm), names=("q241",))


def test_gumiho_principled_switches_are_lossless(lm, assert_lossless):
    config = GumihoConfig(draft="random", seed=1, sibling_mask="tree", mlp_first_slot="parent")
    assert_lossless(Gumiho(config, lm), max_new_tokens=32, names=("q81", "q241"))


def test_fta_runs_and_its_departures_from_vanilla_are_counted(lm, lossless_prompts, vanilla_reference):
    method = Gumiho(GumihoConfig(draft="random", fta=True), lm)
    departures = {}
    for name in ("q81", "q161"):
        result = decode_turn(lm, method, lossless_prompts[name], 32)
        expected = vanilla_reference(lossless_prompts[name], 32)
        assert sum(result.accept_lengths) == len(result.new_ids) <= 32
        departures[name] = next((i for i, (a, b) in enumerate(zip(result.new_ids, expected)) if a != b), None)
    print(f"FTA first departure from vanilla per prompt (None = equal): {departures}")
    # the rows the engine verifies are the padded paths of the drafted tree
    prompt = lossless_prompts["q81"]
    tree = _draft_once(method, lm, prompt, vanilla_reference(prompt, 1)[0])
    assert tree.rows == fta_rows(root_paths(tree.parents))
