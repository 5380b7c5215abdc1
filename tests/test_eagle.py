"""The EAGLE family: checkpoints in upstream's layouts (EAGLE-1/2 and EAGLE-3), the static tree, the engine's
multi-layer hidden states, the reduced draft vocabulary, and losslessness on the real embedded model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from eagle.checkpoint import load_eagle3_draft
from eagle.draft_model import fused_layers, vocabulary_maps
from eagle.method import Eagle, Eagle2, Eagle2Config, Eagle3, EagleConfig
from drafts.tree import StaticTree
from eagle.tree import MC_SIM_7B_63
from evaluation.engine import decode_turn
from evaluation.engine.errors import HarnessError, OptionError
from evaluation.engine.method import Method
from drafts.checkpoint import TOKEN_COUNTS, load_draft, save_draft, token_counts_text
from drafts.data import most_frequent
from drafts.serial_draft import SerialDraft
from drafts.tree import root_paths
from tests.conftest import THREE
from tests.test_gumiho import tiny_target


# A random draft accepts almost nothing, so every step verifies a whole tree for one token: small trees and short
# answers keep these cheap, and every code path of the drafting still runs (the trained drafts' tests use the
# upstream tree sizes).
SMALL_TREE = {"total_tokens": 24, "depth": 3}


def random_tensors(shapes: dict, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {key: torch.randn(shape, generator=g) * 0.2 for key, shape in shapes.items()}


def eagle1_state_dict(h: int, inter: int, vocab: int, heads: int, kv: int, head_dim: int | None = None,
                      fc_bias: bool = True) -> dict:
    """EAGLE-1/2's released keys and shapes (one layer, no input norm in it, the embedding included); the Llama-3
    drafts (config `"bias": false`) have no fc.bias."""
    d = head_dim or h // heads
    return random_tensors({
        "embed_tokens.weight": (vocab, h), "fc.weight": (h, 2 * h), **({"fc.bias": (h,)} if fc_bias else {}),
        "layers.0.self_attn.q_proj.weight": (heads * d, h), "layers.0.self_attn.k_proj.weight": (kv * d, h),
        "layers.0.self_attn.v_proj.weight": (kv * d, h), "layers.0.self_attn.o_proj.weight": (h, heads * d),
        "layers.0.mlp.gate_proj.weight": (inter, h), "layers.0.mlp.up_proj.weight": (inter, h),
        "layers.0.mlp.down_proj.weight": (h, inter), "layers.0.post_attention_layernorm.weight": (h,)})


def eagle3_state_dict(h: int, inter: int, heads: int, kv: int, draft_vocab: int, head_dim: int | None = None) -> dict:
    """EAGLE-3's released keys and shapes (cnets.py `Model`, saved without the frozen embedding); `head_dim`: a
    draft whose heads are not hidden / heads wide (AngelSlim's, from its config)."""
    d = head_dim or h // heads
    return random_tensors({
        "fc.weight": (h, 3 * h),
        "midlayer.self_attn.q_proj.weight": (heads * d, 2 * h), "midlayer.self_attn.k_proj.weight": (kv * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * d, 2 * h), "midlayer.self_attn.o_proj.weight": (h, heads * d),
        "midlayer.mlp.gate_proj.weight": (inter, h), "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter), "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,), "midlayer.post_attention_layernorm.weight": (h,),
        "norm.weight": (h,), "lm_head.weight": (draft_vocab, h)}, seed=2)


def write_release(folder, state: dict, config: dict):
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(config, default=str))
    return folder


def tiny_shapes(target):
    c = target.config
    return c.hidden_size, c.intermediate_size, c.vocab_size, c.num_attention_heads, c.num_key_value_heads


# ------------------------------------------------------------------------------------------ loaders
def test_an_eagle_checkpoint_loads_and_round_trips(tmp_path):
    target = tiny_target()
    h, inter, vocab, heads, kv = tiny_shapes(target)
    state = eagle1_state_dict(h, inter, vocab, heads, kv)
    folder = write_release(tmp_path / "released", state, dict(target.config.to_dict(), num_hidden_layers=1))
    draft = load_draft(folder, target)
    assert (draft.num_layers, draft.mlp_num, draft.family) == (1, 0, "eagle")
    own = draft.state_dict()
    assert set(own) == set(state) - {"embed_tokens.weight"}
    assert all(torch.equal(own[k], v) for k, v in state.items() if k in own)
    assert draft.embed is target.get_input_embeddings() and draft.head is target.get_output_embeddings()
    again = load_draft(save_draft(draft, tmp_path / "ours", {"note": "round trip"}), target)
    assert all(torch.equal(again.state_dict()[k], v.half().float()) for k, v in own.items())
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["family"] == "eagle"


def eagle3_reference(state: dict, target, features: torch.Tensor, tokens: torch.Tensor, head_dim: int | None = None,
                     rotary=None) -> torch.Tensor:
    """Upstream's EAGLE-3 layer written out by hand for one causal sequence: fc, [input_norm(e) ; hidden_norm(g)]
    into attention with the un-normalised g as the residual, then the MLP block, the norm and the head. `head_dim`
    and `rotary` (the draft's RoPE): the target's hidden / heads and RoPE unless given."""
    c = target.config
    h, heads, kv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    d = head_dim or h // heads

    def rms(x, key):
        return state[key] * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps)

    e, g = target.get_input_embeddings()(tokens), features @ state["fc.weight"].T
    x = torch.cat((rms(e, "midlayer.input_layernorm.weight"), rms(g, "midlayer.hidden_norm.weight")), -1)
    n = x.shape[0]
    q = (x @ state["midlayer.self_attn.q_proj.weight"].T).view(n, heads, d).transpose(0, 1)
    k = (x @ state["midlayer.self_attn.k_proj.weight"].T).view(n, kv, d).transpose(0, 1)
    v = (x @ state["midlayer.self_attn.v_proj.weight"].T).view(n, kv, d).transpose(0, 1)
    cos, sin = (target.model.rotary_emb if rotary is None else rotary)(x[None], torch.arange(n)[None])
    q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
    k, v = k[0].repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    scores = (q[0] @ k.transpose(1, 2)) / d ** 0.5 + torch.full((n, n), float("-inf")).triu(1)
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, heads * d)
    attended = attended @ state["midlayer.self_attn.o_proj.weight"].T
    g = g + attended
    m = rms(g, "midlayer.post_attention_layernorm.weight")
    mlp = (torch.nn.functional.silu(m @ state["midlayer.mlp.gate_proj.weight"].T)
           * (m @ state["midlayer.mlp.up_proj.weight"].T)) @ state["midlayer.mlp.down_proj.weight"].T
    return rms(g + mlp, "norm.weight") @ state["lm_head.weight"].T


@torch.no_grad()
def test_an_eagle3_checkpoint_with_a_reduced_vocabulary_computes_what_upstream_does(tmp_path):
    target = tiny_target()
    h, inter, vocab, heads, kv = tiny_shapes(target)
    used = torch.tensor([1, 2, 5, 7, 8, 11, 20, 31])
    state = eagle3_state_dict(h, inter, heads, kv, used.numel())
    state["d2t"], state["t2d"] = vocabulary_maps(used, vocab)
    config = dict(target.config.to_dict(), num_hidden_layers=1, draft_vocab_size=used.numel())
    draft = load_eagle3_draft(write_release(tmp_path / "released", state, config), target)
    assert torch.equal(draft.vocab_ids, used) and torch.equal(draft.t2d, state["t2d"])
    features, tokens = torch.randn(1, 6, 3 * h), torch.tensor([[3, 9, 1, 4, 4, 2]])
    mask = torch.full((6, 6), torch.finfo(torch.float32).min).triu(1)[None, None]
    ours = draft.vocab_logits(draft.serial(draft.pair_input(tokens, features), torch.arange(6)[None], mask))
    assert torch.allclose(ours[0], eagle3_reference(state, target, features[0], tokens[0]), atol=1e-5)
    # round trip through our format (the maps stay integers)
    again = load_eagle3_draft(save_draft(draft, tmp_path / "ours", {}), target)
    assert torch.equal(again.vocab_ids, used) and again.d2t.dtype == torch.long


def test_an_eagle3_checkpoint_over_the_whole_vocabulary_needs_no_maps(tmp_path):
    target = tiny_target()
    h, inter, vocab, heads, kv = tiny_shapes(target)
    state = eagle3_state_dict(h, inter, heads, kv, vocab)
    draft = load_eagle3_draft(write_release(tmp_path / "released", state, {"rope_theta": 1e4}), target)
    assert draft.vocab_ids is None and draft.config.rope_parameters["rope_theta"] == 1e4


def test_checkpoints_that_do_not_fit_give_one_line(tmp_path):
    target = tiny_target()
    h, inter, vocab, heads, kv = tiny_shapes(target)
    wide = eagle3_state_dict(h, inter, heads, kv, vocab)
    wide["fc.weight"] = torch.zeros(h, 2 * h)
    with pytest.raises(HarnessError, match=r"wrong shape \['fc.weight'\] \(fc.weight: \(16, 32\) for \(16, 48\)\)"):
        load_eagle3_draft(write_release(tmp_path / "wide", wide, {}), target)
    with pytest.raises(HarnessError, match="is an EAGLE-3 draft"):
        load_draft(tmp_path / "wide", target)
    with pytest.raises(HarnessError, match="not an EAGLE-3 draft"):
        load_eagle3_draft(write_release(tmp_path / "one", eagle1_state_dict(h, inter, vocab, heads, kv), {}), target)
    with pytest.raises(HarnessError, match="hidden_size 64, the target 16"):
        load_eagle3_draft(write_release(tmp_path / "big", wide, {"hidden_size": 64}), target)
    reduced = eagle3_state_dict(h, inter, heads, kv, 8)
    with pytest.raises(HarnessError, match="no d2t map"):
        load_eagle3_draft(write_release(tmp_path / "nomap", reduced, {}), target)
    reduced["d2t"], reduced["t2d"] = torch.full((8,), vocab, dtype=torch.long), torch.zeros(vocab, dtype=torch.bool)
    with pytest.raises(HarnessError, match="outside the target's vocabulary"):
        load_eagle3_draft(write_release(tmp_path / "badmap", reduced, {}), target)


# ------------------------------------------------------------------------------------- the trees
def test_the_static_tree_is_upstreams_mc_sim_7b_63():
    tree = StaticTree.from_paths(MC_SIM_7B_63)
    assert [p for p in tree.paths] == list(MC_SIM_7B_63)  # already in (depth, path) order
    depths = [len(p) for p in tree.paths]
    assert [depths.count(d) for d in range(1, 6)] == [4, 8, 8, 3, 2]
    assert [len(level) for level in tree.expanded_by_depth] == [4, 4, 1, 1]
    # upstream's 15 verification paths (its retrieve indices, node 0 = the pending token)
    upstream = [[0, 1, 5, 13, 21, 24], [0, 1, 5, 13, 21, 25], [0, 1, 5, 13, 22], [0, 1, 5, 13, 23], [0, 1, 5, 14],
                [0, 1, 5, 15], [0, 1, 6, 16], [0, 1, 6, 17], [0, 1, 7, 18], [0, 1, 7, 19], [0, 2, 8, 20], [0, 2, 9],
                [0, 3, 10], [0, 3, 11], [0, 4, 12]]
    assert sorted(root_paths([p + 1 for p in tree.parents])) == sorted(upstream)
    with pytest.raises(ValueError, match="no parent path"):
        StaticTree.from_paths([(0,), (1, 0, 0)])


@pytest.mark.parametrize("method,config", [(Eagle, EagleConfig(draft="random")),
                                           (Eagle2, Eagle2Config(draft="random")),
                                           (Eagle3, Eagle2Config(draft="random"))])
def test_the_trees_drafted_on_the_model_are_well_formed(lm, lossless_prompts, method, config):
    from evaluation.engine.method import DecodeState

    m = method(config, lm)
    prompt = lossless_prompts["q81"]
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([prompt]), output_hidden_states=True, logits_to_keep=1)
        m.reset(prompt, torch.cat([out.hidden_states[i][0] for i in m.hidden_state_layers], -1))
        tree = m.draft(DecodeState(list(prompt) + [out.logits[0, -1].argmax().item()], len(prompt),
                                   torch.zeros(1), 8))
    assert len(tree) == (25 if method is Eagle else 59)
    assert all(p < i + 1 for i, p in enumerate(tree.parents))  # ancestor-closed, parents first
    siblings = {}
    for token, parent in zip(tree.tokens, tree.parents):
        siblings.setdefault(parent, []).append(token)
    assert all(len(set(ts)) == len(ts) for ts in siblings.values())  # distinct tokens under each parent
    assert m.cache.length == len(prompt)  # the tree rows are cropped away


# ---------------------------------------------------------------------- multi-layer hidden states
class Probe(Method):
    """Records the hidden states the engine hands over."""

    needs_hidden_states = True

    def __init__(self, layers):
        super().__init__(None, None)
        self.hidden_state_layers = layers
        self.seen = []

    @property
    def max_nodes(self) -> int:
        return 2

    def reset(self, prompt_ids, hidden_states=None):
        self.seen = [hidden_states]

    def draft(self, state):
        from evaluation.engine.tree import DraftTree

        return DraftTree.chain([state.tokens[-1], state.tokens[-2]])

    def update(self, state, outcome):
        self.seen.append(outcome.hidden_states)


def test_the_engine_hands_over_exactly_the_layers_asked_for(lm, lossless_prompts):
    prompt = lossless_prompts["q241"][-40:]
    layers = fused_layers(lm.model.config.num_hidden_layers)
    assert layers == (2, 15, 27)
    probe = Probe(layers)
    result = decode_turn(lm, probe, prompt, 3)
    with torch.no_grad():
        plain = lm.model(input_ids=torch.tensor([prompt + result.new_ids]), output_hidden_states=True).hidden_states
    fused = torch.cat([plain[i][0] for i in layers], -1)
    assert probe.seen[0].shape == (len(prompt), 3 * lm.model.config.hidden_size)
    assert torch.allclose(probe.seen[0], fused[: len(prompt)], atol=1e-4)
    # the first step's node 0 is the first generated token, at position len(prompt)
    assert torch.allclose(probe.seen[1][0], fused[len(prompt)], atol=1e-4)
    last = Probe((-1,))
    decode_turn(lm, last, prompt, 2)
    assert torch.allclose(last.seen[0], plain[-1][0, : len(prompt)], atol=1e-4)
    none = Probe(layers)
    none.needs_hidden_states = False
    decode_turn(lm, none, prompt, 6)
    assert len(none.seen) >= 2 and all(seen is None for seen in none.seen)  # the prompt's and every step's


# ------------------------------------------------------------------------ reduced draft vocabulary
def test_the_vocabulary_maps_round_trip_ids():
    ids = torch.tensor([3, 4, 9, 17, 40])
    d2t, t2d = vocabulary_maps(ids, 50)
    assert torch.equal(d2t + torch.arange(5), ids) and t2d.nonzero().flatten().tolist() == ids.tolist()
    counts = torch.tensor([0, 5, 2, 5, 0, 9, 2])
    assert most_frequent(counts, 4).tolist() == [5, 1, 3, 2]  # ties to the lower id
    text = token_counts_text(counts)
    assert text.splitlines() == ["token_id,count", "5,9", "1,5", "3,5", "2,2", "6,2"]


def test_a_reduced_vocabulary_proposes_only_its_tokens_and_stays_lossless(lm, tmp_path, assert_lossless):
    """A draft folder with token counts (as training writes it); the draft proposes from the 512 most frequent."""
    torch.manual_seed(0)
    draft = SerialDraft.for_target(lm.model, mlp_num=0, layers=1)
    counts = torch.zeros(lm.model.config.vocab_size, dtype=torch.long)
    counts[torch.randperm(counts.numel(), generator=torch.Generator().manual_seed(3))[:600]] = torch.arange(600) + 1
    folder = save_draft(draft, tmp_path / "draft", {"note": "test"}, files={TOKEN_COUNTS: token_counts_text(counts)})
    method = Eagle2(Eagle2Config(draft=str(folder), draft_vocab=512, **SMALL_TREE), lm)
    allowed = set(most_frequent(counts, 512).tolist())
    assert set(method.vocab_ids.tolist()) == allowed
    proposed = []
    original = method.draft
    method.draft = lambda state: proposed.append(original(state)) or proposed[-1]
    assert_lossless(method, max_new_tokens=32, names=("q241",))
    assert proposed and all(set(tree.tokens) <= allowed for tree in proposed)
    with pytest.raises(HarnessError, match="only 600 distinct tokens"):
        Eagle2(Eagle2Config(draft=str(folder), draft_vocab=700), lm)
    with pytest.raises(HarnessError, match="needs the token counts"):
        Eagle(EagleConfig(draft=str(save_draft(draft, tmp_path / "bare", {})), draft_vocab=512), lm)


def test_options_are_checked(lm):
    with pytest.raises(OptionError, match="tree"):
        EagleConfig(tree="medusa").check()
    with pytest.raises(OptionError, match="draft_vocab"):
        Eagle2Config(draft_vocab=0).check()
    with pytest.raises(HarnessError, match="make train FAMILY=eagle MODEL=no-such-model"):
        Eagle2(Eagle2Config(), dataclasses.replace(lm, name="no-such-model"))


# ---------------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("method,config,prompt", [
    (Eagle, EagleConfig(draft="random"), "q81-turn2"),
    (Eagle2, Eagle2Config(draft="random", draft_vocab=4096, **SMALL_TREE), "q241"),
    (Eagle3, Eagle2Config(draft="random", **SMALL_TREE), "q401"),
    (Eagle3, Eagle2Config(draft="random", seed=1, draft_vocab=4096, **SMALL_TREE), "q81-turn2"),
], ids=["eagle", "eagle2-reduced", "eagle3", "eagle3-reduced"])
def test_random_drafts_are_lossless(lm, assert_lossless, method, config, prompt):
    assert_lossless(method(config, lm), max_new_tokens=32, names=(prompt,))


def mean_accepted(results: dict) -> float:
    return sum(len(r.new_ids) for r in results.values()) / sum(r.steps for r in results.values())


def test_the_committed_eagle_draft_is_lossless_and_accepts_drafts(lm, assert_lossless):
    """eagle/drafts/eagle/<model>/, what `make bench` runs for eagle and eagle2: exact, and trained (a random
    draft's mean accepted tokens is about 1)."""
    assert Eagle2.ready_for(lm.name) and Eagle.ready_for(lm.name)
    assert mean_accepted(assert_lossless(Eagle2(Eagle2Config(), lm), names=THREE)) > 1.2
    assert mean_accepted(assert_lossless(Eagle(EagleConfig(draft_vocab=8192), lm), names=("q241",))) > 1.1


def test_the_committed_eagle3_draft_is_lossless_and_accepts_drafts(lm, assert_lossless):
    """eagle/drafts/eagle3/<model>/: fused features and its own head over the 8,192 most frequent tokens, exact."""
    assert Eagle3.ready_for(lm.name)
    method = Eagle3(Eagle2Config(), lm)
    assert tuple(method.hidden_state_layers) == (2, 15, 27) and method.vocab_ids.numel() == 8192
    assert mean_accepted(assert_lossless(method, names=THREE)) > 1.2


def test_the_family_table_reads_a_report(tmp_path):
    """`make bench-families`' table: one row per method setting, in table order, the draft split and equality."""
    from evaluation.tools.family_table import family_table

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"environment": {"cpu": "Test CPU", "cpu_count": 2,
                                                                   "torch_threads": 2, "git_commit": "abcdef0123"}}))
    common = {"subtask": "overall", "model": "m", "dtype": "float32", "max_new_tokens": 128, "questions": 6,
              "run_dir": str(run), "tokens_per_s": 5.0, "verified_per_step": 59, "ms_per_step_forward": 200.0}
    rows = [dict(common, method_label="eagle2,draft_vocab=4096", speedup=0.42, mat=1.56, ms_per_step_draft=39.0,
                 ms_per_step_draft_head=10.0),
            dict(common, method_label="vanilla", speedup=1.0, mat=1.0, ms_per_step_draft=0.0),
            dict(common, method_label="eagle2", speedup=0.33, mat=1.49, ms_per_step_draft=88.0,
                 ms_per_step_draft_head=55.0),
            dict(common, method_label="eagle2", subtask="rag", speedup=9.0, mat=9.0)]
    import pandas as pd

    pd.DataFrame(rows).to_csv(tmp_path / "report.csv", index=False)
    pd.DataFrame({"method_label": ["eagle2", "eagle2", "eagle2,draft_vocab=4096"],
                  "equal": [True, False, True]}).to_csv(tmp_path / "lossless.csv", index=False)
    table, where = family_table(tmp_path)
    assert list(table.method) == ["vanilla", "eagle2", "eagle2,draft_vocab=4096"]
    assert list(table["speedup"]) == ["1.00", "0.33", "0.42"] and list(table["equal to vanilla"]) == ["–", "1/2", "1/1"]
    assert list(table["of which vocabulary head"]) == ["–", "55", "10"]
    assert where.startswith("Measured on Test CPU (2 cores, 2 torch threads) at commit `abcdef0`: m, float32")
    with pytest.raises(HarnessError, match="make bench-families"):
        family_table(tmp_path / "nothing")
