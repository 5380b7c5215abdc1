"""The serial draft that reads the target's hidden states: EAGLE's draft (EAGLE-1 and EAGLE-2, docs/methods/eagle.md:
fc(2H -> H) and one Llama decoder layer), and with two layers and parallel MLP heads Gumiho's (docs/methods/gumiho.md,
Draft network). Both families' released checkpoints share this layout, so one class and one loader serve both.

At draft position j the input is fc([emb(token_{j+1}) ; feature_j]) and the decoder layers (the first without an
input norm, no final norm) output a feature whose logits, through the target's own frozen head, predict token j+2.
Gumiho's parallel part is `mlp`, a plain list of heads `A -> R x 5` (the layout of the released checkpoints'
`mlp.<i>.*` keys): each maps the concatenation of two serial (feature, token) pairs, passed through `fc`, to the
feature of a deeper token.

The embedding and the head are the target's own modules, held by reference and never registered here: they are
frozen, not saved with the draft, and a tied-embedding target (SmolLM2) needs no separate copy. A reduced draft
vocabulary (`use_vocabulary`) keeps a copy of the head's rows for those tokens only, so drafting multiplies by N
rows instead of the whole vocabulary; the tree holds target ids (`vocab_ids` maps them back).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from evaluation.engine.kv_cache import cache_argument

SERIAL_LAYERS = 2
RESIDUAL_BLOCKS = 5


class InputBlock(nn.Module):
    """`A(v) = SiLU(W v + b)`, 2H -> H, no residual (upstream `noResBlock`)."""

    def __init__(self, size_in: int, size_out: int):
        super().__init__()
        self.linear = nn.Linear(size_in, size_out)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.linear(x))


class ResidualBlock(nn.Module):
    """`R(v) = v + SiLU(W v + b)`, H -> H (upstream `ResBlock`; its identity shortcut has no weights)."""

    def __init__(self, size: int):
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def mlp_head(hidden_size: int) -> nn.Sequential:
    return nn.Sequential(InputBlock(2 * hidden_size, hidden_size),
                         *[ResidualBlock(hidden_size) for _ in range(RESIDUAL_BLOCKS)])


def config_rope(config: dict) -> dict | None:
    """The RoPE a config (as a dict) names, in transformers 5's form: its `rope_parameters`, or a transformers-4
    config's `rope_theta` with its `rope_scaling` (whose `type` is transformers 5's `rope_type`); None when it
    names no base."""
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        return dict(rope)
    if config.get("rope_theta") is None:
        return None
    rope = {"rope_type": "default", "rope_theta": float(config["rope_theta"])}
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        scaling = dict(scaling)
        kind = scaling.pop("rope_type", None) or scaling.pop("type", None)
        scaling.pop("type", None)
        rope.update(scaling, rope_type=kind or "default")
    return rope


def draft_config(target_config, attn_implementation: str = "sdpa", layers: int = SERIAL_LAYERS,
                 overrides: dict | None = None) -> LlamaConfig:
    """A Llama config copied from the target's with `layers` layers, then `overrides` (a released draft's own
    RoPE or attention shape). RoPE parameters come from the target's config as transformers 5 stores them
    (`rope_parameters`, SmolLM2's base is 1e5), never a silent default."""
    source = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
    source = copy.deepcopy(source)
    for key in ("architectures", "auto_map", "quantization_config", "_name_or_path", "transformers_version"):
        source.pop(key, None)
    # The draft is a stack of full-attention Llama layers whatever the target is: a per-layer list sized for the
    # target's layer count (Qwen3's `layer_types`) would not fit it, and sliding windows are not the draft's.
    for key in ("layer_types", "use_sliding_window", "sliding_window", "max_window_layers"):
        source.pop(key, None)
    source["num_hidden_layers"] = layers
    rope = config_rope(source)
    if rope is None:
        raise ValueError("the target config names no RoPE base (rope_parameters or rope_theta)")
    source.pop("rope_theta", None)
    source.pop("rope_scaling", None)
    source["rope_parameters"] = rope
    source.update(overrides or {})
    source["model_type"] = "llama"
    config = LlamaConfig(**source)
    config._attn_implementation = attn_implementation
    return config


class SerialDraft(nn.Module):
    """`config.num_hidden_layers` serial layers plus `mlp_num` parallel heads; one layer and no heads is EAGLE's
    draft."""

    def __init__(self, config: LlamaConfig, mlp_num: int = 5):
        super().__init__()
        self.config = config
        self.mlp_num = mlp_num
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.layers[0].input_layernorm = nn.Identity()  # upstream: layer 0 has no input norm
        self.mlp = nn.ModuleList([mlp_head(hidden) for _ in range(mlp_num)])
        self.rotary = LlamaRotaryEmbedding(config)
        self._target = ()  # (embedding, head), set by attach(); a tuple so they are not submodules
        self.vocab_ids: torch.Tensor | None = None  # draft index -> target id; None: the whole vocabulary
        self._head_rows = ()  # (the head's rows for vocab_ids,), not a parameter: derived from the frozen head

    def attach(self, embedding: nn.Module, head: nn.Module) -> "SerialDraft":
        """Use the target's own frozen embedding and lm_head."""
        self._target = (embedding, head)
        return self

    @classmethod
    def for_target(cls, target_model, mlp_num: int = 5, attn_implementation: str = "sdpa",
                   layers: int = SERIAL_LAYERS, overrides: dict | None = None) -> "SerialDraft":
        """A draft shaped by the target's config (`overrides`: what a released draft's own config says otherwise,
        its RoPE), using the target's embedding and head."""
        draft = cls(draft_config(target_model.config, attn_implementation, layers, overrides), mlp_num)
        return draft.attach(target_model.get_input_embeddings(), target_model.get_output_embeddings())

    @property
    def num_layers(self) -> int:
        """Decoder layers (one KV cache layer each)."""
        return len(self.layers)

    hidden_state_layers = (-1,)  # the target features it reads: the last layer, after the final norm

    @property
    def family(self) -> str:
        return "eagle" if self.mlp_num == 0 and self.num_layers == 1 else "gumiho"

    def saved_fields(self) -> dict:
        """What config.json records beyond the Llama config, to rebuild this draft."""
        return {"family": self.family, "mlp_num": self.mlp_num}

    def use_vocabulary(self, token_ids: torch.Tensor | None) -> None:
        """Draft over these target ids only (None: the whole vocabulary again)."""
        if token_ids is None:
            self.vocab_ids, self._head_rows = None, ()
            return
        weight = self.head.weight
        if getattr(self.head, "bias", None) is not None:
            raise ValueError("a reduced draft vocabulary needs a head without a bias")
        self.vocab_ids = token_ids.to(weight.device)
        self._head_rows = (weight.detach()[self.vocab_ids].contiguous(),)

    def vocab_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (the target's head, or its rows for `vocab_ids`)."""
        if self._head_rows:
            return features @ self._head_rows[0].T
        return self.head(features)

    @property
    def embed(self) -> nn.Module:
        return self._target[0]

    @property
    def head(self) -> nn.Module:
        return self._target[1]

    def trainable_parameters(self):
        return [p for p in self.parameters() if p.requires_grad]

    # ------------------------------------------------------------------------------------------- pieces
    def pair_input(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """fc([emb(token) ; feature]), the token embedding first, in the draft's dtype."""
        with torch.no_grad():
            embedded = self.embed(tokens)
        return self.fc(torch.cat((embedded.to(features.dtype), features), dim=-1))

    def serial(self, x: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               cache=None) -> torch.Tensor:
        """The two decoder layers on fc outputs `x` [B, Q, H]; `attention_mask` is additive [B, 1, Q, K]."""
        position_embeddings = self.rotary(x, position_ids)
        for layer in self.layers:
            x = layer(x, attention_mask=attention_mask, position_ids=position_ids, **cache_argument(layer, cache),
                      position_embeddings=position_embeddings)
        return x

    def heads(self, v: torch.Tensor) -> list[torch.Tensor]:
        """Every MLP head on the same 2H input."""
        return [head(v) for head in self.mlp]

    # ------------------------------------------------------------------------------------- training
    def forward(self, features: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Teacher-forced train-mode forward (docs/methods/gumiho.md, Training recipe).

        features [B, L, H] = target states h_0..h_{L-1} (noised), input_ids [B, L] = x_1..x_L (shifted left),
        attention_mask [B, L] (1 = real token). Returns o [B, L, H] (o_t ~ h_{t+1}) and the heads' outputs
        (head i at t ~ h_{t+3+i}).
        """
        batch, length, _ = features.shape
        dtype = features.dtype
        x = self.pair_input(input_ids, features)
        causal = torch.ones(length, length, dtype=torch.bool, device=features.device).tril()
        allowed = causal[None] & attention_mask.bool()[:, None, :]
        mask = torch.zeros(batch, 1, length, length, dtype=dtype, device=features.device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        positions = torch.arange(length, device=features.device).unsqueeze(0).expand(batch, -1)
        o = self.serial(x, positions, mask)
        if not self.mlp_num:
            return o, []
        # g_t = fc([emb(x_{t+2}) ; o_t]); v_t = [g_t ; g_{t+1}] (upstream rolls by -1 twice; the wrapped tail is
        # never in the loss because the targets are shifted by 2 + i).
        g = self.pair_input(torch.roll(input_ids, -1, dims=1), o)
        v = torch.cat((g, torch.roll(g, -1, dims=1)), dim=-1)
        return o, self.heads(v)
