"""The newer targets, Llama-3.1-Instruct and Qwen3, on the CPU without their weights: tiny random models built here
with each architecture's features (grouped-query attention and llama3 RoPE scaling; RMS-normed queries and keys, a
head size other than hidden / heads and an untied head), saved with the embedded model's tokenizer and loaded the way
a user loads the real ones (`model=llama-3.1-8b-instruct model.path=<folder>`, `model=qwen3-8b ...`).

On both, every method of conf/method decodes real Spec-Bench prompts token for token as vanilla does (gumiho-fta
excepted: not exact by design); each released checkpoint conf/checkpoints.yaml pairs with them loads, through its
method's own option, from a stand-in with the release's file names and key layout, scaled down, and decodes
losslessly; and the two model configs compose, validate and stop at the end of a turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from eagle.draft_model import vocabulary_maps
from evaluation.catalog import METHOD_CONF, config_method, import_class
from evaluation.checkpoints import kinds, pairing_table
from evaluation.engine import decode_turn
from evaluation.engine.errors import HarnessError, OptionError
from evaluation.models import load_model, stop_token_ids
from evaluation.questions import load_questions, select_questions
from evaluation.run.answerers import build_method, check_loaded_model
from evaluation.run.validation import validate
from evaluation.templates import build_prompt_ids
from drafts.checkpoint import load_draft
from tests.conftest import compose_config
from tests.test_eagle import eagle1_state_dict, eagle3_reference, eagle3_state_dict

LLAMA, QWEN = "llama-3.1-8b-instruct", "qwen3-8b"  # conf/model names
TARGETS = (LLAMA, QWEN)
NEW_TOKENS = 40
ORIGINAL_POSITIONS = 64  # llama3 scaling's original_max_position_embeddings: every prompt plus answer goes past it
# Not lossless by design: FTA verifies padded rows that are not parent chains (docs/methods/gumiho.md).
NOT_LOSSLESS = {"gumiho-fta"}
# Weights drawn with this standard deviation (transformers' default, 0.02, gives a model that repeats one token
# whatever the prompt): answers that follow the prompt and the positions, with stretches that repeat, so the
# retrieval methods' trees are accepted several tokens at a time (Token Recycling about 3 a step), and no
# near-tie (top-2 logit margins above 1e-3) that a tree forward's rounding could flip.
INIT_STD = 0.1


def tiny_llama(vocab: int, tokenizer) -> LlamaForCausalLM:
    """Llama-3.1's shape, scaled down: 4 query heads over 2 key/value heads, llama3 RoPE scaling (factor 8, low and
    high frequency factors 1 and 4, base 500,000), an untied head, 8 layers (EAGLE-3 then fuses three distinct ones,
    2, 4 and 5)."""
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
        initializer_range=INIT_STD,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL_POSITIONS},
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def tiny_qwen3(vocab: int, tokenizer) -> Qwen3ForCausalLM:
    """Qwen3's shape, scaled down: q/k RMS norms, heads of 32 over a hidden size of 64 with 4 query heads (as
    Qwen3-4B's 128 x 32 over 2,560), 2 key/value heads, base 1,000,000, an untied head."""
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-6,
        tie_word_embeddings=False, initializer_range=INIT_STD,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Models this small run faster on one thread; two threads spin-wait for each other on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folders(lm, tmp_path_factory) -> dict[str, Path]:
    """The two tiny targets saved as Hugging Face folders with the embedded model's tokenizer (its vocabulary size)."""
    root = tmp_path_factory.mktemp("new-targets")
    tokenizer, vocab = lm.tokenizer, len(lm.tokenizer)
    out = {}
    for name, build in ((LLAMA, tiny_llama), (QWEN, tiny_qwen3)):
        folder = root / name
        build(vocab, tokenizer).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        hub_style_rope(folder / "config.json")
        out[name] = folder
    return out


def hub_style_rope(path: Path) -> None:
    """The RoPE fields as the published config.json files spell them (written by transformers 4): `rope_theta` and
    `rope_scaling` (Llama-3.1's {rope_type: llama3, factor, ...}, Qwen3's null), not transformers 5's
    `rope_parameters`, so the loader reads what a user's copy of the real model holds."""
    config = json.loads(path.read_text())
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = None if rope["rope_type"] == "default" else rope
    path.write_text(json.dumps(config, indent=2))


def model_overrides(name: str, folder: Path) -> list[str]:
    # The real vocabularies' turn-end ids (128009, 151645, ...) lie beyond the tiny models' 49,152 tokens, and the
    # runner refuses a stop id beyond the vocabulary (test_a_stand_in_needs_its_stop_ids_cleared), so the tiny
    # stand-ins clear them; the tokenizer's own end of turn (<|im_end|>) still stops.
    return [f"model={name}", f"model.path={folder}", "model.dtype=float32", "model.extra_stop_ids=[]"]


@pytest.fixture(scope="module")
def targets(folders) -> dict:
    """Each tiny target through the harness's own loader, as `model=<name> model.path=<folder>` gives it."""
    return {name: load_model(compose_config(*model_overrides(name, folder)).model, "cpu")
            for name, folder in folders.items()}


@pytest.fixture(scope="module")
def prompts(targets, spec_bench_file) -> dict[str, list[list[int]]]:
    """The first multi-turn conversation and the first maths question of Spec-Bench, through each target's template."""
    questions = select_questions(load_questions(spec_bench_file), ["mt_bench", "math_reasoning"], 1)
    return {name: [build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0]) for q in questions]
            for name, lm in targets.items()}


@pytest.fixture(scope="module")
def vanilla(targets, folders, prompts) -> dict[str, list[list[int]]]:
    """Vanilla's answers, built from its config like every method below."""
    return {name: [decode_turn(lm, method_from_config(name, folders[name], "vanilla", lm), p, NEW_TOKENS).new_ids
                   for p in prompts[name]]
            for name, lm in targets.items()}


def method_from_config(target: str, folder: Path, config_name: str, lm, *options: str):
    """`method=<config_name>` with its defaults and `options`, composed, validated and built as `run.py` does."""
    cfg = compose_config(*model_overrides(target, folder), f"method={config_name}", *options)
    return build_method(validate(cfg), lm)


def assert_lossless(lm, method, prompts: list[list[int]], expected: list[list[int]]) -> list:
    results = [decode_turn(lm, method, prompt, NEW_TOKENS) for prompt in prompts]
    for result, reference in zip(results, expected):
        assert sum(result.accept_lengths) == len(result.new_ids)
        if result.new_ids != reference:
            at = next((i for i, (a, b) in enumerate(zip(result.new_ids, reference)) if a != b),
                      min(len(result.new_ids), len(reference)))
            pytest.fail(f"{type(method).__name__} differs from vanilla at token {at}")
    return results


# ------------------------------------------------------------------------------------------------ the targets
def test_the_tiny_targets_load_through_the_harness_with_their_architectures_features(targets, folders, prompts):
    llama, qwen = targets[LLAMA], targets[QWEN]
    for name, lm in targets.items():
        assert (lm.name, lm.source, lm.dtype, lm.chat_template) == (name, str(folders[name]), torch.float32,
                                                                    "tokenizer")
        config = lm.model.config
        assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
        assert lm.model.lm_head.weight.data_ptr() != lm.model.model.embed_tokens.weight.data_ptr()  # untied
        assert all(len(p) + NEW_TOKENS > ORIGINAL_POSITIONS for p in prompts[name])

    assert type(llama.model).__name__ == "LlamaForCausalLM"
    rope = llama.model.config.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("llama3", 8.0, 64)
    rotary = llama.model.model.rotary_emb
    d = llama.model.config.hidden_size // llama.model.config.num_attention_heads
    plain = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    assert rotary.rope_type == "llama3" and torch.allclose(rotary.inv_freq[0], plain[0])
    assert torch.allclose(rotary.inv_freq[-1], plain[-1] / 8)  # the low frequencies are scaled by the factor

    assert type(qwen.model).__name__ == "Qwen3ForCausalLM"
    attention = qwen.model.model.layers[0].self_attn
    assert isinstance(attention.q_norm, Qwen3RMSNorm) and isinstance(attention.k_norm, Qwen3RMSNorm)
    assert attention.head_dim == 32 != qwen.model.config.hidden_size // qwen.model.config.num_attention_heads
    assert qwen.model.model.rotary_emb.inv_freq.numel() == 16  # RoPE over the 32-wide heads, base 1e6


# ------------------------------------------------------------------------------------------ every method
def method_configs() -> list[str]:
    """Every config file of conf/method (variants included) but those not lossless by design."""
    return sorted(path.stem for path in METHOD_CONF.glob("*.yaml") if path.stem not in NOT_LOSSLESS)


def trained_part(config_name: str, folder: Path) -> list[str]:
    """A trained method's part where none exists for a tiny target: seeded random drafts and heads, and for SpS
    the target's own folder as its draft model (the target itself, so its chains are accepted whole)."""
    cls = import_class(config_method(config_name).target, config_name)
    option = getattr(cls, "checkpoint_option", None)
    if option is None or compose_config(f"method={config_name}").method.get(option) is not None:
        return []  # nothing trained, or its default names one (sps-self: the target's own layers)
    return [f"method.{option}={folder if option == 'draft_model' else 'random'}"]


def test_the_method_list_covers_every_family():
    configs = set(method_configs())
    assert NOT_LOSSLESS <= {path.stem for path in METHOD_CONF.glob("*.yaml")}  # the exclusion names a real config
    assert {"eagle", "eagle2", "eagle3", "gumiho", "gumiho-serial", "medusa", "hydra", "sps", "sps-self", "pld",
            "lookahead", "rest", "sam", "logitspec", "recycling"} <= configs


@pytest.mark.parametrize("config_name", method_configs())
@pytest.mark.parametrize("target", TARGETS)
def test_every_method_is_lossless_on_the_new_architectures(targets, folders, prompts, vanilla, target, config_name):
    lm = targets[target]
    method = method_from_config(target, folders[target], config_name, lm, *trained_part(config_name, folders[target]))
    results = assert_lossless(lm, method, prompts[target], vanilla[target])
    if config_name == "sps":  # the draft model is the target itself: its chains are accepted whole
        assert sum(len(r.new_ids) for r in results) / sum(r.steps for r in results) > 3


# --------------------------------------------------------------------------------- released checkpoints
def random_state(shapes: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {key: torch.randn(shape, generator=g) * 0.2 for key, shape in shapes.items()}


def write_release(folder: Path, state: dict, config: dict) -> Path:
    """A release's two files: its config.json and its pytorch_model.bin (float16 weights, as published)."""
    folder.mkdir(parents=True)
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def draft_vocabulary(vocab: int, seed: int) -> torch.Tensor:
    """A quarter of the vocabulary (EAGLE-3's 32,000 of Llama-3.1's 128,256), sorted: the draft's target ids."""
    return torch.sort(torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[: vocab // 4]).values


def eagle3_llama31(folder: Path, target) -> dict:
    """`yuhuili/EAGLE3-LLaMA3.1-Instruct-8B`: the config of EAGLE's traineagle3/config.json (LlamaForCausalLM, one
    layer, draft_vocab_size, no head_dim and no rope_theta: upstream runs it at base 10000), and pytorch_model.bin
    with fc, midlayer.*, norm, lm_head over the draft vocabulary, d2t and t2d."""
    c = target.config
    h, inter, heads, kv, vocab = (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                                  c.vocab_size)
    ids = draft_vocabulary(vocab, 5)
    state = eagle3_state_dict(h, inter, heads, kv, ids.numel())
    state["d2t"], state["t2d"] = vocabulary_maps(ids, vocab)
    config = {"architectures": ["LlamaForCausalLM"], "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
              "hidden_act": "silu", "hidden_size": h, "initializer_range": 0.02, "intermediate_size": inter,
              "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": heads,
              "num_key_value_heads": kv, "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05,
              "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.28.1",
              "use_cache": True, "vocab_size": vocab, "draft_vocab_size": ids.numel()}
    write_release(folder, state, config)
    return {"state": state, "vocab_ids": ids, "head_dim": h // heads, "rope_theta": 10000.0}


def eagle3_angelslim_qwen3(folder: Path, target) -> dict:
    """`AngelSlim/Qwen3-8B_eagle3`: a Llama-type one-layer draft whose config (AngelSlim's qwen3-8b-eagle3.json)
    names the target's head_dim and rope_theta; AngelSlim's code sizes the heads by that head_dim (here 32, not
    hidden / heads = 16), with EAGLE-3's keys."""
    c = target.config
    h, inter, heads, kv, vocab = (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                                  c.vocab_size)
    ids = draft_vocabulary(vocab, 6)
    state = eagle3_state_dict(h, inter, heads, kv, ids.numel(), head_dim=c.head_dim)
    state["d2t"], state["t2d"] = vocabulary_maps(ids, vocab)
    config = {"architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": c.bos_token_id,
              "eos_token_id": c.eos_token_id, "head_dim": c.head_dim, "hidden_act": "silu", "hidden_size": h,
              "initializer_range": 0.02, "intermediate_size": inter, "max_position_embeddings": 40960,
              "max_window_layers": c.num_hidden_layers, "num_attention_heads": heads, "num_hidden_layers": 1,
              "num_key_value_heads": kv, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
              "sliding_window": None, "tie_word_embeddings": False, "transformers_version": "4.51.0",
              "use_cache": True, "use_sliding_window": False, "vocab_size": vocab, "draft_vocab_size": ids.numel()}
    write_release(folder, state, config)
    return {"state": state, "vocab_ids": ids, "head_dim": c.head_dim, "rope_theta": 1000000.0}


def eagle_llama31(folder: Path, target) -> dict:
    """`yuhuili/EAGLE-LLaMA3.1-Instruct-8B`: EAGLE's Llama-3 config (train/EAGLE-LLaMA3-Instruct-8B.json: the
    target's with one layer, rope_theta 500000 without llama3 scaling, `"bias": false`) and pytorch_model.bin with
    the embedding, fc.weight (no bias) and layers.0.*."""
    c = target.config
    h, inter, heads, kv, vocab = (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                                  c.vocab_size)
    state = eagle1_state_dict(h, inter, vocab, heads, kv, fc_bias=False)
    config = {"architectures": ["LlamaForCausalLM"], "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
              "hidden_act": "silu", "hidden_size": h, "initializer_range": 0.02, "intermediate_size": inter,
              "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": heads,
              "num_key_value_heads": kv, "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05,
              "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.28.1",
              "use_cache": True, "vocab_size": vocab, "rope_theta": 500000.0, "bias": False}
    write_release(folder, state, config)
    return {"state": state, "head_dim": h // heads, "rope_theta": 500000.0}


# (target, kind) -> the stand-in of the release conf/checkpoints.yaml pairs with it
STAND_INS = {(LLAMA, "eagle3"): eagle3_llama31, (QWEN, "eagle3"): eagle3_angelslim_qwen3,
             (LLAMA, "eagle"): eagle_llama31}


def releases() -> list[tuple[str, str, str, str]]:
    """(target, kind, hub id, method) for every method that reads a checkpoint paired with the new targets."""
    return [(entry.target, entry.kind, entry.hub_id, method) for entry in pairing_table() if entry.target in TARGETS
            for method in kinds()[entry.kind].methods if method not in NOT_LOSSLESS]


@pytest.fixture(scope="module")
def stand_ins(targets, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("releases")
    out = {}
    for (target, kind), write in STAND_INS.items():
        folder = root / f"{target}-{kind}"
        out[target, kind] = {"folder": folder, **write(folder, targets[target].model)}
    return out


def test_every_release_paired_with_the_new_targets_has_a_stand_in():
    paired = {(target, kind) for target, kind, _, _ in releases()}
    assert paired == set(STAND_INS)


@pytest.mark.parametrize("target, kind, hub_id, config_name", releases(),
                         ids=[f"{m}-{h}" for _, _, h, m in releases()])
def test_a_released_checkpoint_loads_from_its_layout_and_is_lossless(targets, folders, prompts, vanilla, stand_ins,
                                                                      target, kind, hub_id, config_name):
    lm, release = targets[target], stand_ins[target, kind]
    cls = import_class(config_method(config_name).target, config_name)
    option = kinds()[kind].option
    # What the method loads for this target by default is this release (no draft is committed for it here).
    assert cls.trained_source(cls.Config(), target) == hub_id
    method = method_from_config(target, folders[target], config_name, lm, f"method.{option}={release['folder']}")
    draft = method.draft_model
    assert draft.config.rope_parameters == {"rope_type": "default", "rope_theta": release["rope_theta"]}
    attention = draft.midlayer.self_attn if kind == "eagle3" else draft.layers[0].self_attn
    assert attention.head_dim == release["head_dim"]
    if kind == "eagle3":
        assert torch.equal(draft.vocab_ids, release["vocab_ids"])
        assert tuple(method.hidden_state_layers) == (2, 4, 5)  # layers 2, L // 2, L - 3 of 8
    else:
        assert not draft.fc.bias.any()  # `"bias": false`: upstream's fc has none
    assert_lossless(lm, method, prompts[target], vanilla[target])


@torch.no_grad()
@pytest.mark.parametrize("target", TARGETS)
def test_the_eagle3_stand_ins_compute_what_upstream_does(targets, folders, stand_ins, target):
    """The draft as loaded against EAGLE-3's layer written out by hand, with the release's own head size and RoPE
    (Llama-3.1's at base 10000 without scaling under a target at 500,000 with it; AngelSlim's over 32-wide heads)."""
    lm, release = targets[target], stand_ins[target, "eagle3"]
    draft = method_from_config(target, folders[target], "eagle3", lm, f"method.draft={release['folder']}").draft_model
    c = lm.model.config
    rotary = LlamaRotaryEmbedding(LlamaConfig(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                                              head_dim=release["head_dim"],
                                              rope_parameters={"rope_type": "default",
                                                               "rope_theta": release["rope_theta"]}))
    state = {k: v.half().float() for k, v in release["state"].items() if v.is_floating_point()}  # as published
    n, h = 6, c.hidden_size
    features = torch.randn(1, n, 3 * h, generator=torch.Generator().manual_seed(3))
    tokens = torch.tensor([[3, 9, 1, 4, 4, 2]])
    mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
    ours = draft.vocab_logits(draft.serial(draft.pair_input(tokens, features), torch.arange(n)[None], mask))
    reference = eagle3_reference(state, lm.model, features[0], tokens[0], release["head_dim"], rotary)
    assert torch.allclose(ours[0], reference, atol=1e-4)


def test_an_eagle_release_without_fc_bias_needs_its_config_to_say_so(targets, folders, tmp_path):
    """`"bias": false` reads as a zero bias; without it a missing fc.bias is a key missing from the release."""
    lm = targets[LLAMA]
    eagle_llama31(tmp_path / "release", lm.model)
    config = json.loads((tmp_path / "release" / "config.json").read_text())
    del config["bias"]
    (tmp_path / "release" / "config.json").write_text(json.dumps(config))
    with pytest.raises(HarnessError, match=r"missing \['fc.bias'\]"):
        load_draft(tmp_path / "release", lm.model)


# ------------------------------------------------------------------------------------------- the model configs
END_OF_TURN = {  # conf/model name -> (turn-end ids, the real tokenizer's eos, its generation config's eos ids)
    LLAMA: ({128009, 128008}, 128009, [128001, 128008, 128009]),  # <|eot_id|>, <|eom_id|>
    "llama-3.1-8b": ({128009, 128008}, 128009, [128001, 128008, 128009]),
    QWEN: ({151645}, 151645, [151645, 151643]),  # <|im_end|>
}


@pytest.mark.parametrize("model", sorted(END_OF_TURN))
def test_the_model_configs_compose_validate_and_stop_at_the_end_of_a_turn(model):
    spec = validate(compose_config(f"model={model}"))
    assert spec.model.name == (QWEN if model == QWEN else LLAMA) and spec.model.chat_template == "tokenizer"
    assert spec.model.hf_id in ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B") and spec.model.path is None
    turn_end, eos, generation_eos = END_OF_TURN[model]
    extra = list(spec.model.extra_stop_ids)
    stops = stop_token_ids(SimpleNamespace(eos_token_id=eos), SimpleNamespace(eos_token_id=generation_eos), extra)
    assert turn_end <= stops
    # The config's own ids end a turn even where the tokenizer and generation config name only a document's end
    # (<|end_of_text|>, <|endoftext|>), as a base model's or an older copy's do.
    assert turn_end <= stop_token_ids(SimpleNamespace(eos_token_id=generation_eos[0]), None, extra)


@pytest.mark.parametrize("target", TARGETS)
def test_a_stand_in_needs_its_stop_ids_cleared(targets, folders, target):
    """The runner refuses a stop id beyond the loaded vocabulary in one line (a stop that could never fire is a
    misconfiguration on a real model); a stand-in with a smaller vocabulary runs with `model.extra_stop_ids=[]`."""
    lm, folder = targets[target], folders[target]
    real = validate(compose_config(f"model={target}", f"model.path={folder}", "model.dtype=float32"))
    with pytest.raises(OptionError, match=r"model.extra_stop_ids\[0\]: 1\d{5} .*below the vocabulary size 49152"):
        check_loaded_model(real, lm)
    check_loaded_model(validate(compose_config(*model_overrides(target, folder))), lm)
    assert lm.tokenizer.eos_token_id in lm.stop_ids  # <|im_end|> of the embedded tokenizer still ends a turn
