"""Our methods beside Spec-Bench's own code, step for step, on the same prompt ids (docs/upstream-parity.md).

    python -m evaluation.tools.upstream_parity --spec-bench PATH [--logitspec PATH] [--methods recycling,sam,...]
        [--questions 81,161,241,321,401,481] [--max-new-tokens 128] [--out results/upstream]

--spec-bench is a clone of hemingkx/Spec-Bench (commit fd2c1cd), --logitspec one of smart-lty/LogitSpec (commit
659bba9). The tool
1. builds a side environment once (`~/.cache/specdec-harness/upstream-env`): transformers 4.37.1, tokenizers
   0.15.2 and huggingface_hub 0.20.3 installed without dependencies, everything else (this project's CPU torch
   included) read from this project's environment;
2. copies each upstream's `model/` and `evaluation/` and patches them only for the device (CUDA to CPU; REST's,
   Medusa's and Hydra's caches for grouped-query attention; the RoPE base of Spec-Bench's EAGLE-1, Medusa and
   Hydra files), and writes the embedded model's config in the form transformers 4.37 reads (`rope_theta`); for
   REST it builds Spec-Bench's DraftRetriever (Rust) with cargo; for Gumiho, EAGLE-1 and EAGLE-2 it hands upstream
   our committed draft in the form upstream reads; for Medusa and Hydra, seeded random heads written in upstream's
   layout, which both sides read;
3. decodes the first turn of each question in order with our method (defaults: upstream's settings; one method
   object for all prompts, so state carried across questions is carried on both sides) and with upstream's loop,
   float32, one thread, the same prompt ids;
4. writes per method and prompt: tokens identical, accepted lengths identical or the first differing step, the
   first steps' trees identical, tokens/s on both sides (`parity.csv`, `parity.md`, with the machine and commit).

Accepted lengths are aligned as both loops count them: ours has a prefill step first (one token, or none when the
prefill stops short, as Token Recycling's upstream does), upstream's lists start at the first tree step; our
answer's last step is cut at max_new_tokens and steps decoded past it are listed apart. A maintainer's script, not
part of CI: it installs a second environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SPEC_BENCH_PINS = ("transformers==4.37.1", "tokenizers==0.15.2", "huggingface_hub==0.20.3")
GUMIHO_PINS = ("transformers==4.36.2", "tokenizers==0.15.2", "huggingface_hub==0.20.3", "loguru==0.7.2",
               "addict==2.4.0")
TREES = 2  # the first tree steps whose fed ids are compared
# Spec-Bench's preallocated caches (REST's, Medusa's, Hydra's, all from Medusa's `kv_cache.py`) hold as many
# key/value heads as query heads (Vicuna's); SmolLM2 has 3 for 9, and its attention writes 3.
KV_HEADS = ("        config.num_attention_heads,\n        config.max_position_embeddings,",
            "        config.num_key_value_heads,\n        config.max_position_embeddings,")
# Spec-Bench's EAGLE-1, Medusa and Hydra Llama files build RoPE with the default base 10000 whatever the config says
# (their Vicuna targets use 10000; EAGLE-2's copy reads `rope_theta`). SmolLM2's base is 100000.
ROPE_BASE = ("                self.head_dim, max_position_embeddings=self.max_position_embeddings\n            )",
             "                self.head_dim, max_position_embeddings=self.max_position_embeddings,"
             "base=self.config.rope_theta\n            )")
# Upstream files patched for the CPU (and a few for the model): (path, text, replacement); every other line runs as
# upstream wrote it.
DEVICE_PATCHES = (
    ("evaluation/inference_lookahead.py", ".cuda()", ".to('cpu')"),
    ("evaluation/inference_recycling.py", ".cuda()", ".to('cpu')"),
    ("evaluation/inference_recycling.py", "torch.device('cuda:0')", "torch.device('cpu')"),
    # Not the device but the model: the cache sized by the key/value heads (KV_HEADS).
    ("model/rest/rest/model/kv_cache.py", *KV_HEADS),
    ("model/medusa/kv_cache.py", *KV_HEADS),
    ("model/hydra/kv_cache.py", *KV_HEADS),
    ("model/logitspec/logitspec.py", "torch.device('cuda:0')", "torch.device('cpu')"),
    # Gumiho compiles its MLP heads for the GPU (torch.compile max-autotune, CUDA synchronisation) after casting
    # them to float16, a no-op for its float16 models; on the CPU in float32 they stay as loaded.
    ("gumiho/model/gumiho_model.py", "        self.gumiho_layer.compile_mlp()\n", "\n"),
    # Its draft casts to float16 before the head, again a no-op for its models: here, to the head's dtype.
    ("gumiho/model/cnets.py", "head(out_hidden[0].half())", "head(out_hidden[0].to(head.weight.dtype))"),
    ("gumiho/model/cnets.py", "head(_out_hidden.half())", "head(_out_hidden.to(head.weight.dtype))"),
    ("evaluation/inference_eagle2.py", ".cuda()", ".to('cpu')"),
    # Not the device but the model: the targets (and EAGLE-1's draft, Hydra's prefix layer, built from the same
    # file) read `rope_theta` (ROPE_BASE); our EAGLE draft was trained on SmolLM2's base.
    ("model/eagle/modeling_llama_kv.py", *ROPE_BASE),
    ("model/eagle/cnets.py",
     "LlamaRotaryEmbedding(self.head_dim, max_position_embeddings=self.max_position_embeddings)",
     "LlamaRotaryEmbedding(self.head_dim, max_position_embeddings=self.max_position_embeddings, "
     "base=getattr(self.config, 'rope_theta', 10000))"),
    ("model/medusa/modeling_llama_kv.py", *ROPE_BASE),
    ("model/hydra/modeling_llama_kv.py", *ROPE_BASE),
)
# The parameters of EAGLE-1/2's draft (`Model` in Spec-Bench's model/eagle*/cnets.py) besides its embedding, which
# upstream's checkpoints hold as a copy of the target's and ours shares with the target. Our draft
# (`SerialDraft` with one layer and no heads) names them the same way: drafts/checkpoint.py reads upstream's as is.
UPSTREAM_EAGLE_KEYS = (
    "fc.weight", "fc.bias",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",  # layer 0 has no input norm, upstream's and ours
)


class Upstream(NamedTuple):
    """A repository that holds upstream loops: how it is named on the command line, how it is recognised, what of
    it is copied and the pins of its side environment."""
    option: str
    repository: str
    commit: str
    marker: str  # a file every checkout of it has
    parts: tuple[str, ...]
    pins: tuple[str, ...]


SPEC_BENCH = Upstream("--spec-bench", "hemingkx/Spec-Bench", "fd2c1cd", "evaluation/inference_recycling.py",
                      ("model", "evaluation"), SPEC_BENCH_PINS)
LOGITSPEC = Upstream("--logitspec", "smart-lty/LogitSpec", "659bba9", "evaluation/inference_logitspec.py",
                     ("model", "evaluation"), SPEC_BENCH_PINS)
GUMIHO = Upstream("--gumiho", "AMD-AIG-AIMA/Gumiho", "9a1bc87", "gumiho/model/gumiho_model.py", ("gumiho",),
                  GUMIHO_PINS)
UPSTREAMS = (SPEC_BENCH, LOGITSPEC, GUMIHO)
# Spec-Bench's methods, compared by default (with --logitspec and --gumiho, theirs too).
DEFAULT_METHODS = "recycling,sam,sam-no-fallback,lookahead,rest,eagle,eagle2,medusa,hydra"
# Where each method's upstream loop lives (Spec-Bench unless named here).
UPSTREAM_OF = {"logitspec": LOGITSPEC, "gumiho": GUMIHO}


class UpstreamFailed(Exception):
    """Upstream's loop ended in an error (its last lines)."""


def side_environment(cache: Path, pins: tuple[str, ...]) -> Path:
    """The side interpreter with upstream's pins, built once per set of pins; this project's packages fill in the
    rest."""
    env = cache / f"upstream-env-{pins[0].replace('==', '-')}"
    python = env / "bin" / "python"
    if python.exists() and (env / ".pins").exists() and (env / ".pins").read_text() == "\n".join(pins):
        return python
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(site_packages(python)), *pins], check=True)
    # After the side's own packages: this environment's (torch, numpy, fschat, ...).
    ours = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (site_packages(python) / "project.pth").write_text(ours + "\n")
    (env / ".pins").write_text("\n".join(pins))
    return python


def draftretriever_installed(python: Path, spec_bench: Path) -> None:
    """REST's `draftretriever` (Spec-Bench's `model/rest/DraftRetriever`, Rust) built with cargo and installed into the
    side environment, once. Its bundled wheel is for CPython 3.9 only, and PyPI's package of that name is another
    project's. Cargo reads its crates as configured for the user (crates.io, or a local mirror such as Debian's
    `librust-*-dev` packages in `/usr/share/cargo/registry`)."""
    package = site_packages(python) / "draftretriever"
    if (package / "draftretriever.so").is_file():
        return
    source = spec_bench / "model" / "rest" / "DraftRetriever"
    if shutil.which("cargo") is None:
        raise UpstreamFailed("REST's upstream needs cargo to build model/rest/DraftRetriever (Rust)")
    build = ROOT / "results" / "scratch" / "upstream" / "DraftRetriever"
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(source, build, ignore=shutil.ignore_patterns("wheels", "target"))
    env = {**os.environ, "PYO3_PYTHON": str(python)}
    done = subprocess.run(["cargo", "build", "--release"], cwd=build, env=env, capture_output=True, text=True)
    if done.returncode and (build / "Cargo.lock").is_file():
        # The lock names upstream's exact crate versions; a local mirror may hold other compatible ones.
        (build / "Cargo.lock").unlink()
        done = subprocess.run(["cargo", "build", "--release"], cwd=build, env=env, capture_output=True, text=True)
    if done.returncode:
        raise UpstreamFailed(f"cargo could not build model/rest/DraftRetriever:\n{done.stderr[-2000:]}")
    package.mkdir(parents=True, exist_ok=True)
    shutil.copy(build / "draftretriever" / "__init__.py", package / "__init__.py")
    shutil.copy(build / "target" / "release" / "libdraftretriever.so", package / "draftretriever.so")


def site_packages(python: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return python.parent.parent / "lib" / version / "site-packages"


def upstream_copy(upstream: Upstream, checkout: Path, scratch: Path) -> Path:
    """The checkout's code folders, patched for the CPU (the DEVICE_PATCHES of files it has)."""
    if not (checkout / upstream.marker).is_file():
        raise SystemExit(f"error: {checkout} is not a {upstream.repository} checkout (no {upstream.marker})")
    copy = scratch / upstream.repository.split("/")[1]
    shutil.rmtree(copy, ignore_errors=True)
    for part in upstream.parts:
        shutil.copytree(checkout / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "data"))
    for path, text, replacement in DEVICE_PATCHES:
        file = copy / path
        if not file.is_file():
            continue  # a file of the other repository
        source = file.read_text()
        if text not in source:
            raise SystemExit(f"error: {path} has no '{text}': another {upstream.repository} commit? "
                             f"({upstream.commit} expected)")
        file.write_text(source.replace(text, replacement))
    return copy


def with_top_level_rope_theta(config: dict) -> dict:
    """A transformers 5 config in the form 4.36/4.37 read: `rope_theta` at the top, not in `rope_parameters`."""
    rope = config.pop("rope_parameters", None) or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    return config


def side_model(source: Path, scratch: Path) -> Path:
    """The model folder as transformers 4.37 reads it: the same weights and tokenizer, `rope_theta` at the top of
    the config, the fast tokenizer's class named as 4.37 names it."""
    folder = scratch / "model"
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    with_top_level_rope_theta(config)
    config["torch_dtype"] = config.pop("dtype", "float32")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer["tokenizer_class"] = "PreTrainedTokenizerFast"  # REST's model loads the tokenizer; 4.37's class name
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2))
    # tokenizers 0.15 reads BPE merges as "a b" strings; later releases write them as pairs
    fast = json.loads((source / "tokenizer.json").read_text())
    merges = fast.get("model", {}).get("merges") or []
    fast["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in merges] if merges else merges
    (folder / "tokenizer.json").write_text(json.dumps(fast, ensure_ascii=False))
    for name in ("model.safetensors", "generation_config.json"):
        target = folder / name
        if not target.exists():
            target.symlink_to(source / name)
    return folder


def first_difference(ours: list[int], past: list[int], upstream: list[int], learns_past: bool,
                     ended_at_stop: bool = False) -> int | None:
    """The first tree step whose accepted length differs, or None: our answer's steps, then the steps decoded past
    it, against upstream's; our answer's last step may be cut short by max_new_tokens. Upstream's steps past our
    answer count only for a method that carries state to the next question (`learns_past`). After an answer that
    ended at a stop token they are compared by number only: a loop that commits its pending token records the stop
    token alone in its step past ours, which we record as that step's own tokens."""
    for i, length in enumerate(ours):
        if i >= len(upstream):
            return i
        last = i == len(ours) - 1
        if length != upstream[i] and not (last and length < upstream[i]):
            return i
    rest = upstream[len(ours):]
    if not learns_past:
        return None
    for j, length in enumerate(past):
        if j >= len(rest) or (rest[j] != length and not ended_at_stop):
            return len(ours) + j
    return None if len(rest) == len(past) else len(ours) + len(past)


def run_ours(lm, method_name: str, prompts: list[list[int]], max_new_tokens: int,
             options: dict | None = None) -> list[dict]:
    """Our method with upstream's settings (UPSTREAM_OPTIONS) and `options` (what its job hands both sides)."""
    from evaluation.engine import decode_turn
    from evaluation.tools.half_precision import build_method

    method = build_method(lm, OUR_CONFIG.get(method_name, method_name),
                          **{**UPSTREAM_OPTIONS.get(method_name, {}), **(options or {})})
    fed: list[list[int]] = []
    draft = method.draft

    def recording_draft(state):
        tree = draft(state)
        # Upstream's Lookahead feeds its first window with the prompt, in its prefill: our step on the last prompt
        # token is part of that forward, and upstream's later forwards lay out the window before the guesses.
        merged = method_name in WINDOW_IN_PREFILL and len(state.tokens) == prompt_length[0]
        if len(fed) < TREES and not merged:
            side = tree.side.tokens if tree.side is not None else []
            fed.append([state.tokens[-1], *side, *tree.tokens])
        return tree

    method.draft = recording_draft
    results = []
    prompt_length = [0]
    for prompt in prompts:
        fed.clear()
        prompt_length[0] = len(prompt)
        result = decode_turn(lm, method, prompt, max_new_tokens)
        results.append({"tokens": result.new_ids, "accept_lengths": result.accept_lengths[1:],
                        "learns_past": method.learns_past_answer,
                        "past": result.past_answer_lengths, "seconds": result.wall_time, "fed": list(fed)})
    return results


def rest_job(lm, scratch: Path) -> dict:
    """Our REST datastore's entries, for upstream's writer to index: the same turns on both sides."""
    from evaluation.tools.half_precision import build_method

    method = build_method(lm, "rest")
    store, config = method.store, method.config
    index = scratch / f"rest-{store.folder.name}.idx"
    return {"rest_tokens": str(store.folder / "tokens.npy"), "rest_starts": str(store.folder / "starts.npy"),
            "rest_index": str(index), "rest_index_ready": index.is_file(), "vocab_size": lm.model.config.vocab_size,
            "rest_num_draft": config.num_draft, "rest_max_token_span": config.max_token_span}


def logitspec_job(lm) -> dict:
    from evaluation.tools.half_precision import build_method

    config = build_method(lm, "logitspec").config
    return {"logitspec_max_ngram_size": config.max_ngram_size, "logitspec_num_pred_tokens": config.num_pred_tokens,
            "logitspec_draft_tree_capacity": config.draft_tree_capacity}


def gumiho_job(lm, scratch: Path) -> dict:
    """Our committed draft in the form upstream's Gumiho reads (its config with `rope_theta` at the top, as
    transformers 4.36 reads it), and our tree settings as upstream's arguments."""
    from evaluation.tools.half_precision import build_method
    from evaluation.families import family

    method = build_method(lm, "gumiho", **UPSTREAM_OPTIONS.get("gumiho", {}))
    config = method.config
    folder = family("gumiho").committed_dir(lm.name) if config.draft is None else Path(config.draft)
    draft_config = json.loads((folder / "config.json").read_text())
    with_top_level_rope_theta(draft_config)
    converted = scratch / "gumiho-draft-config.json"
    converted.write_text(json.dumps(draft_config, indent=2))
    return {"gumiho_config": str(converted), "gumiho_weights": str(folder / "model.safetensors"),
            "gumiho_args": {"total_tokens": config.total_tokens, "depth": config.depth, "top_k": config.top_k,
                            "mlp_num": config.mlp_num, "mlptopk": config.mlptopk, "pruning": config.pruning,
                            "complete_mask": int(config.fta), "serial_head_num": 2}}


def upstream_eagle_config(target_config: dict, fc_bias: bool) -> dict:
    """The draft config upstream's EAGLE reads (`EConfig`, and `EaModel` for fc's `bias`): the target's config with
    one layer, as its released drafts' configs are, in the form transformers 4.37 reads (`rope_theta` at the top)."""
    config = with_top_level_rope_theta(json.loads(json.dumps(target_config)))
    config["torch_dtype"] = config.pop("dtype", "float32")
    config["num_hidden_layers"] = 1
    config["bias"] = fc_bias  # upstream's default when absent is True
    return config


def write_upstream_eagle_draft(draft, target_config: dict, folder: Path) -> Path:
    """Our EAGLE draft as a folder upstream's EAGLE reads: `config.json` (`upstream_eagle_config`) and
    `model.safetensors` with upstream's keys, in the dtype our side runs it. The embedding is left out: the driver
    gives upstream's draft a copy of the target's, which is what ours reads."""
    from safetensors.torch import save_file

    if draft.family != "eagle" or draft.vocab_ids is not None:
        raise SystemExit("error: upstream's EAGLE runs a one-layer draft without MLP heads over the whole vocabulary; "
                         f"this draft is a {draft.family} draft"
                         + ("" if draft.vocab_ids is None else " with a reduced vocabulary"))
    state = {key: value.detach().to("cpu").contiguous() for key, value in draft.state_dict().items()}
    if sorted(state) != sorted(UPSTREAM_EAGLE_KEYS):
        raise SystemExit(f"error: our EAGLE draft's keys {sorted(state)} are not upstream's "
                         f"{sorted(UPSTREAM_EAGLE_KEYS)}")
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = upstream_eagle_config(target_config, fc_bias="fc.bias" in state)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def eagle_job(lm, scratch: Path, method_name: str) -> dict:
    """EAGLE-1 (`eagle`) or EAGLE-2 (`eagle2`): the draft our method loads, written as upstream reads it, and our
    tree settings as upstream's arguments: EAGLE-1's static tree (the driver checks it is the `mc_sim_7b_63` that
    upstream's draft always grows), EAGLE-2's `total_token`, `depth` and `top_k`."""
    from eagle.tree import STATIC_TREES
    from evaluation.tools.half_precision import build_method

    method = build_method(lm, method_name, **UPSTREAM_OPTIONS.get(method_name, {}))
    target_config = json.loads((Path(lm.source) / "config.json").read_text())
    folder = write_upstream_eagle_draft(method.draft_model, target_config, scratch / f"{method_name}-draft")
    job = {"eagle_config": str(folder / "config.json"), "eagle_weights": str(folder / "model.safetensors")}
    config = method.config
    if method_name == "eagle":
        job["eagle_tree_choices"] = [list(path) for path in STATIC_TREES[config.tree]]
    else:  # upstream's total_token counts the pending token, as our total_tokens does
        job["eagle2_args"] = {"total_token": config.total_tokens, "depth": config.depth, "top_k": config.top_k}
    return job


def write_upstream_medusa_heads(heads, folder: Path) -> Path:
    """Medusa heads as upstream's release lays them out: `medusa_lm_head.pt` (our state dict has its keys
    `{k}.{i}.linear.weight|bias`, `{k}.{n}.weight`) and `config.json`, in the dtype our side runs them. Upstream's
    projection has no bias, so only heads over the whole vocabulary can be written exactly."""
    import torch

    if heads.vocab_ids is not None:
        raise SystemExit("error: upstream's Medusa projects onto the whole vocabulary, without a bias; these heads "
                         "cover a reduced one")
    state = {key: value.detach().to("cpu").contiguous() for key, value in heads.state_dict().items()}
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "medusa_lm_head.pt")
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
              "base_model_name_or_path": heads.base_model}
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return folder


def write_upstream_hydra_heads(heads, embedding, folder: Path) -> Path:
    """Hydra heads as upstream's release lays them out (`medusa.hydra_heads.save_upstream`: `hydra_lm_head.pt`,
    `config.json`), plus `input_embed_fn.weight` as the releases hold it: upstream loads that key into the
    target's own embedding (tied to its head on SmolLM2), so it is the target's `embedding`, bit for bit, and
    changes nothing (the driver checks)."""
    import torch

    from medusa.hydra_heads import save_upstream

    if heads.vocab_ids is not None:
        raise SystemExit("error: these Hydra heads cover a reduced vocabulary; upstream's cover the whole one")
    save_upstream(heads, folder, heads.base_model)
    state = torch.load(folder / "hydra_lm_head.pt", map_location="cpu", weights_only=True)
    state["input_embed_fn.weight"] = embedding.detach().to("cpu").clone()
    torch.save(state, folder / "hydra_lm_head.pt")
    return folder


def hydra_heads_over_the_whole_vocabulary(heads, target_config):
    """Trained Hydra heads over a reduced vocabulary (`vocab_ids`) as heads over the target's whole one, for
    upstream: the projection rows of the other tokens zero with a bias of -1e4, so their logits (-1e4) stay below
    every drafted token's and each head's top-k is the reduced heads' top-k, mapped to target ids."""
    from medusa.hydra_heads import HydraHeads

    full = HydraHeads(target_config, heads.num_heads, heads.num_layers, heads.prefix)
    state = {key: value for key, value in heads.state_dict().items() if key != "vocab_ids"}
    ids = heads.vocab_ids.long().cpu()
    for i in range(heads.num_heads):
        weight, bias = state[f"heads.{i}.lm_head.weight"], state[f"heads.{i}.lm_head.bias"]
        state[f"heads.{i}.lm_head.weight"] = weight.new_zeros(target_config.vocab_size, weight.shape[1])
        state[f"heads.{i}.lm_head.weight"][ids] = weight
        state[f"heads.{i}.lm_head.bias"] = bias.new_full((target_config.vocab_size,), -1e4)
        state[f"heads.{i}.lm_head.bias"][ids] = bias
    full.load_state_dict(state)
    return full.eval()


def heads_job(lm, scratch: Path, method_name: str) -> dict:
    """Medusa (`medusa`) or Hydra (`hydra`): our heads built with `heads=random` (seeded; our committed Medusa heads
    cover a reduced vocabulary upstream cannot load), written in upstream's layout over the whole vocabulary;
    `hydra-trained`: our committed Hydra heads, over the whole vocabulary as `hydra_heads_over_the_whole_vocabulary`
    writes them. Both sides then read that one folder: upstream as its `from_pretrained` does, ours as
    `method.heads=<folder>`. The tree goes along for the driver to check it is upstream's `mc_sim_7b_63`, the one
    its scripts run."""
    from evaluation.tools.half_precision import build_method
    from medusa.tree import STATIC_TREES

    config_name = OUR_CONFIG.get(method_name, method_name)
    heads = None if method_name == "hydra-trained" else "random"
    method = build_method(lm, config_name, **{**UPSTREAM_OPTIONS.get(method_name, {}), "heads": heads})
    folder = scratch / f"{method_name}-heads"
    if config_name == "medusa":
        write_upstream_medusa_heads(method.heads, folder)
    else:
        written = method.heads
        if written.vocab_ids is not None:
            written = hydra_heads_over_the_whole_vocabulary(written, lm.model.config)
        write_upstream_hydra_heads(written, lm.model.get_input_embeddings().weight, folder)
    return {"heads": str(folder), "num_heads": method.config.num_heads,
            "tree_choices": [list(path) for path in STATIC_TREES[method.config.tree]],
            "ours": {"heads": str(folder)}}


def lookahead_job(lm) -> dict:
    from evaluation.tools.half_precision import build_method

    config = build_method(lm, "lookahead").config
    return {"lade_level": config.level, "lade_window": config.window, "lade_guess": config.guess}


# Our options that differ from upstream's by default, set to upstream's for the comparison.
UPSTREAM_OPTIONS = {"lookahead": {"full_match_bonus": False}}
# Methods compared under another name than their config's: our committed (trained) Hydra heads.
OUR_CONFIG = {"hydra-trained": "hydra"}
# Methods whose upstream breaks ties in hash order, random per process: upstream runs twice, to show it differs
# from itself (REST's draftretriever, quirk (b) in docs/methods/rest.md).
RANDOM_UPSTREAM = {"rest"}
# Methods whose upstream prefill also feeds the first step's draft (their first compared tree is the next forward).
WINDOW_IN_PREFILL = {"lookahead"}
JOBS = {"rest": rest_job, "lookahead": lambda lm, scratch: lookahead_job(lm),
        "logitspec": lambda lm, scratch: logitspec_job(lm), "gumiho": gumiho_job,
        "eagle": lambda lm, scratch: eagle_job(lm, scratch, "eagle"),
        "eagle2": lambda lm, scratch: eagle_job(lm, scratch, "eagle2"),
        "medusa": lambda lm, scratch: heads_job(lm, scratch, "medusa"),
        "hydra": lambda lm, scratch: heads_job(lm, scratch, "hydra"),
        "hydra-trained": lambda lm, scratch: heads_job(lm, scratch, "hydra-trained")}


def upstream_commit(checkout: Path) -> str:
    """The checkout's commit, or "as given" when it is not a git clone."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True)
    return done.stdout.strip() if done.returncode == 0 else "as given"


def run_upstream(python: Path, copy: Path, model: Path, method: str, prompts: list[list[int]], eos: int,
                 max_new_tokens: int, scratch: Path, extra: dict) -> dict:
    job = {"upstream": str(copy), "model": str(model), "method": method, "prompts": prompts, "eos": eos,
           "max_new_tokens": max_new_tokens, "threads": 1, "trees": TREES, **extra}
    job_file, out_file = scratch / f"{method}.job.json", scratch / f"{method}.out.json"
    job_file.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    driver = Path(__file__).with_name("upstream_driver.py")
    done = subprocess.run([str(python), str(driver), str(job_file), str(out_file)], env=env, cwd=copy,
                          capture_output=True, text=True)
    if done.returncode:
        raise UpstreamFailed(f"upstream {method} failed:\n{done.stderr[-3000:]}")
    return json.loads(out_file.read_text())


def compare(method: str, names: list[str], ours: list[dict], upstream: list[dict], max_new_tokens: int) -> list[dict]:
    rows = []
    for name, mine, theirs in zip(names, ours, upstream):
        difference = first_difference(mine["accept_lengths"], mine["past"], theirs["accept_lengths"],
                                      mine["learns_past"], ended_at_stop=len(mine["tokens"]) < max_new_tokens)
        # upstream may stop a token short (a step cap of max_new_tokens) or run past it: the common part is compared
        common = min(len(mine["tokens"]), len(theirs["tokens"]))
        rows.append({
            "method": method, "prompt": name,
            "tokens_identical": mine["tokens"][:common] == theirs["tokens"][:common],
            "tokens_ours": len(mine["tokens"]), "tokens_upstream": len(theirs["tokens"]),
            "accept_lengths_identical": difference is None,
            "first_differing_step": "" if difference is None else difference,
            "steps_ours": len(mine["accept_lengths"]) + len(mine["past"]),
            "steps_upstream": len(theirs["accept_lengths"]),
            "first_trees_identical": mine["fed"] == theirs["fed"],
            "tok_s_ours": len(mine["tokens"]) / mine["seconds"],
            "tok_s_upstream": len(theirs["tokens"]) / theirs["seconds"],
            "accept_lengths_ours": " ".join(map(str, mine["accept_lengths"])) + (
                " | " + " ".join(map(str, mine["past"])) if mine["past"] else ""),
            "accept_lengths_upstream": " ".join(map(str, theirs["accept_lengths"])),
        })
    return rows


def main(argv: list[str] | None = None) -> None:
    from evaluation.provenance import commit

    code = commit()  # the code that runs: read now, not when the files are written (the tree may move meanwhile)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for upstream in UPSTREAMS:
        parser.add_argument(upstream.option, type=Path,
                            help=f"a clone of {upstream.repository} at {upstream.commit}")
    parser.add_argument("--methods", default=None,
                        help=f"default: {DEFAULT_METHODS}, and logitspec and gumiho with --logitspec and "
                             "--gumiho; "
                             "rest builds Spec-Bench's DraftRetriever with cargo into the side environment")
    parser.add_argument("--questions", default="81,161,241,321,401,481")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "upstream")
    args = parser.parse_args(argv)
    methods = (args.methods or DEFAULT_METHODS + (",logitspec" if args.logitspec else "")
               + (",gumiho" if args.gumiho else "")).split(",")
    driver = Path(__file__).with_name("upstream_driver.py").read_text()
    unknown = [m for m in methods if f'"{m}":' not in driver]
    if unknown:
        raise SystemExit(f"error: no upstream loop for {', '.join(unknown)} (known: eagle, eagle2, gumiho, "
                         "hydra, hydra-trained, lookahead, logitspec, medusa, rest, recycling, sam, sam-no-fallback)")
    checkouts = {}
    for method in methods:
        upstream = UPSTREAM_OF.get(method, SPEC_BENCH)
        checkout = getattr(args, upstream.option[2:].replace("-", "_"))
        if checkout is None:
            raise SystemExit(f"error: {method} needs {upstream.option} <a clone of {upstream.repository} at "
                             f"{upstream.commit}>")
        checkouts[upstream] = checkout.resolve()

    import torch

    from evaluation.engine.device import cpu_name
    from evaluation.models import default_cache_dir
    from evaluation.questions import load_questions
    from evaluation.templates import build_prompt_ids
    from evaluation.tools.half_precision import compose_config

    torch.set_num_threads(1)
    cfg = compose_config("model=smollm2-135m", "model.dtype=float32", "run.device=cpu")
    from evaluation.models import load_model

    lm = load_model(cfg.model, "cpu")
    wanted = [int(q) for q in args.questions.split(",")]
    question_file = Path(cfg.bench.question_file)
    if not question_file.is_file():
        question_file = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
    by_id = {q.question_id: q for q in load_questions(question_file)}
    missing = [q for q in wanted if q not in by_id]
    if missing:
        raise SystemExit(f"error: question ids not in {question_file}: {missing}")
    names = [f"q{q}" for q in wanted]
    prompts = [build_prompt_ids(lm.tokenizer, lm.chat_template, [], by_id[q].turns[0]) for q in wanted]

    scratch = ROOT / "results" / "scratch" / "upstream"
    scratch.mkdir(parents=True, exist_ok=True)
    copies = {upstream: upstream_copy(upstream, checkout, scratch) for upstream, checkout in checkouts.items()}
    model = side_model(Path(lm.source), scratch)
    eos = int(lm.tokenizer.eos_token_id)
    rows, side_versions = [], {}
    for method in methods:
        print(f"{method}: upstream's loop, then ours, on {len(prompts)} prompts...", flush=True)
        started = time.perf_counter()
        upstream = UPSTREAM_OF.get(method, SPEC_BENCH)
        python = side_environment(default_cache_dir(), upstream.pins)
        copy = copies[upstream]
        extra = JOBS[method](lm, scratch) if method in JOBS else {}
        ours = extra.pop("ours", {})  # our options set by the job (the heads folder both sides read)
        try:
            if method == "rest":
                draftretriever_installed(python, checkouts[SPEC_BENCH])
            theirs = run_upstream(python, copy, model, method, prompts, eos, args.max_new_tokens, scratch, extra)
        except UpstreamFailed as failure:  # the others still run; the table says which one failed and why
            print(failure, file=sys.stderr)
            rows.append({"method": method, "prompt": "all", "upstream_error": str(failure).splitlines()[-1]})
            continue
        side_versions[upstream] = theirs["transformers"]
        mine = run_ours(lm, method, prompts, args.max_new_tokens, ours)
        compared = compare(method, names, mine, theirs["results"], args.max_new_tokens)
        if method in RANDOM_UPSTREAM:  # does upstream agree with itself? a second process, the same prompts
            again = run_upstream(python, copy, model, method, prompts, eos, args.max_new_tokens, scratch, extra)
            for row, first, second in zip(compared, theirs["results"], again["results"]):
                row["upstream_repeats_itself"] = (first["accept_lengths"] == second["accept_lengths"]
                                                  and first["fed"] == second["fed"])
        rows += compared
        print(f"{method}: {time.perf_counter() - started:.0f} s", flush=True)
    table = pd.DataFrame(rows)
    if "upstream_repeats_itself" in table:  # asked of some methods only: blank for the others, not NaN
        table["upstream_repeats_itself"] = table["upstream_repeats_itself"].map(
            {True: "True", False: "False"}).fillna("")
    args.out.mkdir(parents=True, exist_ok=True)
    from evaluation.files import replacing, write_text

    with replacing(args.out / "parity.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.2f")
    setting = (f"SmolLM2-135M-Instruct, float32, 1 thread, first turn of questions {args.questions} in that order, "
               f"{args.max_new_tokens} new tokens, one method object (and upstream process) per method. "
               f"Machine: {cpu_name()}. Commit {code['git_commit'][:7]}"
               f"{' (uncommitted changes)' if code['git_dirty'] else ''}; upstream: "
               + ", ".join(f"{u.repository} at {upstream_commit(path)} (transformers {side_versions.get(u, '?')})"
                           for u, path in checkouts.items()) + ".")
    summary = table.drop(columns=["accept_lengths_ours", "accept_lengths_upstream"], errors="ignore")
    write_text(args.out / "parity.md", f"{setting}\n\n{summary.to_markdown(index=False, floatfmt='.1f', missingval='')}\n")
    print(summary.to_markdown(index=False, floatfmt=".1f", missingval=""))


if __name__ == "__main__":
    main()
