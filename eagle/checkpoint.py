"""EAGLE-3 draft checkpoints: the released ones (`yuhuili/EAGLE3-*`: `pytorch_model.bin` or `model.safetensors`) and
ours (safetensors float16, written by `gumiho.checkpoint.save_draft`), one loader.

Upstream's keys: `fc.weight` [H, 3H], `midlayer.self_attn.{q,k,v}_proj.weight` [., 2H], `midlayer.self_attn.o_proj`,
`midlayer.mlp.{gate,up,down}_proj`, `midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}`, `norm`,
`lm_head.weight` [draft vocabulary, H], and `d2t` / `t2d` when the draft vocabulary is reduced (upstream drops them
when it is not). An `embed_tokens.weight` is ignored: the draft uses the loaded target's own embedding. The RoPE
base is the folder config's `rope_theta` when it has one (upstream reads the draft's config), else the target's.
"""

from __future__ import annotations

import os

import torch

from evaluation.engine.errors import HarnessError
from eagle.draft_model import Eagle3Draft
from gumiho.checkpoint import check_fits_target, fill, read_config, read_weights, resolve


def load_eagle3_draft(source: str | os.PathLike, target_model, attn_implementation: str = "sdpa") -> Eagle3Draft:
    """An EAGLE-3 draft for `target_model` from a local folder or hub id, on the target's device and dtype; one
    `HarnessError` line when it cannot be read or does not fit."""
    folder = resolve(source)
    config = read_config(folder)
    check_fits_target(source, config, target_model)
    state = {k: v for k, v in read_weights(folder).items() if k != "embed_tokens.weight"}
    if not any(key.startswith("midlayer.") for key in state):
        raise HarnessError(f"draft {source} is not an EAGLE-3 draft (no midlayer.* keys): use method=eagle or eagle2")
    head = state.get("lm_head.weight")
    if head is None or head.dim() != 2:
        raise HarnessError(f"draft {source} has no lm_head.weight matrix")
    draft = Eagle3Draft.for_target(target_model, int(head.shape[0]), attn_implementation)
    if "rope_theta" in config:
        draft.config.rope_parameters = {"rope_type": "default", "rope_theta": float(config["rope_theta"])}
        draft.rotary = type(draft.rotary)(draft.config)
    if "d2t" not in state:  # upstream saves no maps for a head over the whole vocabulary
        if head.shape[0] != target_model.config.vocab_size:
            raise HarnessError(f"draft {source} has a head of {head.shape[0]} tokens but no d2t map")
        state["d2t"] = torch.zeros(head.shape[0], dtype=torch.long)
        state["t2d"] = torch.ones(target_model.config.vocab_size, dtype=torch.bool)
    draft = fill(draft, state, source, target_model)
    ids = draft.d2t + torch.arange(draft.draft_vocab_size, device=draft.d2t.device)
    if bool((ids < 0).any()) or bool((ids >= target_model.config.vocab_size).any()):
        raise HarnessError(f"draft {source}: its d2t map points outside the target's vocabulary")
    return draft
