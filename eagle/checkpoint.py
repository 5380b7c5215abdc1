"""EAGLE-3 draft checkpoints: the released ones (`yuhuili/EAGLE3-*`: `pytorch_model.bin` or `model.safetensors`) and
ours (safetensors float16, written by `drafts.checkpoint.save_draft`), one loader.

Upstream's keys: `fc.weight` [H, 3H], `midlayer.self_attn.{q,k,v}_proj.weight` [., 2H], `midlayer.self_attn.o_proj`,
`midlayer.mlp.{gate,up,down}_proj`, `midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}`, `norm`,
`lm_head.weight` [draft vocabulary, H], and `d2t` / `t2d` when the draft vocabulary is reduced (upstream drops them
when it is not). An `embed_tokens.weight` is ignored: the draft uses the loaded target's own embedding. The draft's
attention heads, MLP width, norm epsilon and RoPE are its own config's where it names them, as upstream builds the
draft from that config (RoPE: `rope_theta`, else 10000, whatever the target uses), and its head size is the one its
weights hold (EAGLE's hidden // heads, or AngelSlim's config `head_dim` for the Qwen3 drafts).
"""

from __future__ import annotations

import os

import torch

from evaluation.engine.errors import HarnessError
from eagle.draft_model import Eagle3Draft
from drafts.checkpoint import checkpoint_rope, check_fits_target, fill, read_config, read_weights, resolve


# What a draft's config.json may set differently from the target's (upstream builds the draft from its own config).
OWN_FIELDS = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps", "hidden_act")


def released_shape(source, config: dict, state: dict, target_model) -> dict:
    """The draft config's own fields over the target's: its attention heads, MLP width, norm epsilon and RoPE
    (`checkpoint_rope`), and the head size its q_proj holds. EAGLE's code takes hidden // heads and ignores a
    config `head_dim`; AngelSlim's (the Qwen3 drafts) takes the config's `head_dim` (Qwen3-4B's: 128 x 32 heads
    over a hidden size of 2560); the weights hold whichever was used, so it is read from them."""
    fields = {key: config[key] for key in OWN_FIELDS if config.get(key) is not None}
    fields["rope_parameters"] = checkpoint_rope(config)
    heads = int(fields.get("num_attention_heads", target_model.config.num_attention_heads))
    query = state.get("midlayer.self_attn.q_proj.weight")
    if query is not None and query.dim() == 2:
        if query.shape[0] % heads:
            raise HarnessError(f"draft {source}: q_proj has {query.shape[0]} rows, not a multiple of its "
                               f"{heads} attention heads")
        fields["head_dim"] = query.shape[0] // heads
    return fields


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
    draft = Eagle3Draft.for_target(target_model, int(head.shape[0]), attn_implementation,
                                   released_shape(source, config, state, target_model))
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
