"""The EAGLE-3 draft network (docs/methods/eagle.md, EAGLE-3): fused features of three target layers, one decoder
layer that reads [embedding ; feature], its own norm and a head over a reduced draft vocabulary.

At draft position j the input is the pair (token x_{j+1}, feature g_j):
  - g_j = fc(F_j) when F_j is the target's fused feature (three hidden states side by side, 3H wide);
  - g_j is the draft's own output when it continues from a draft node (H wide; fc is skipped, as upstream tells
    the two apart by width);
  - the decoder layer's attention reads [input_norm(emb(x_{j+1})) ; hidden_norm(g_j)] (2H) and adds its output to
    g_j itself (the residual is the un-normalised feature); then the usual MLP block;
  - logits = lm_head(norm(o_j)) over `draft_vocab_size` tokens; draft index i is target id i + d2t[i].

The embedding is the target's own, held by reference (never saved); everything else is the draft's.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from evaluation.engine.kv_cache import cache_argument
from drafts.serial_draft import draft_config


def fused_layers(num_layers: int) -> tuple[int, int, int]:
    """The target hidden states EAGLE-3 fuses, as transformers numbers them (`output_hidden_states`): the inputs
    of layers 2, L // 2 and L - 3 (low, middle, high)."""
    return 2, num_layers // 2, num_layers - 3


def vocabulary_maps(token_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's maps for a sorted set of target ids: d2t[i] = ids[i] - i (draft -> target offset) and t2d[v] =
    whether target id v is in the draft vocabulary."""
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(ids.numel()), t2d


class Eagle3Layer(nn.Module):
    """One decoder layer whose attention reads the embedding and the feature side by side (2H inputs)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        hidden = self.hidden_size = config.hidden_size
        self.self_attn = LlamaAttention(config, layer_idx=0)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = self.self_attn.head_dim
        self.self_attn.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)

    def forward(self, x, attention_mask=None, position_ids=None, cache=None, position_embeddings=None):
        embedded, feature = x[..., : self.hidden_size], x[..., self.hidden_size :]
        attended = torch.cat((self.input_layernorm(embedded), self.hidden_norm(feature)), dim=-1)
        out, _ = self.self_attn(hidden_states=attended, attention_mask=attention_mask, position_ids=position_ids,
                                position_embeddings=position_embeddings, **cache_argument(self.self_attn, cache))
        feature = feature + out
        return feature + self.mlp(self.post_attention_layernorm(feature))


class Eagle3Draft(nn.Module):
    """fc(3H -> H), one `Eagle3Layer`, a final norm and a head over `draft_vocab_size` tokens."""

    family = "eagle3"
    mlp_num = 0

    def __init__(self, config: LlamaConfig, draft_vocab_size: int, target_hidden_size: int | None = None):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.target_hidden_size = target_hidden_size or hidden
        self.draft_vocab_size = draft_vocab_size
        self.fc = nn.Linear(3 * self.target_hidden_size, hidden, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)
        self._embedding = ()  # the target's, set by attach(); a tuple so it is not a submodule
        self.hidden_state_layers: tuple[int, ...] = ()  # the target layers it fuses, set by for_target

    num_layers = 1  # decoder layers (one KV cache layer each)

    @classmethod
    def for_target(cls, target_model, draft_vocab_size: int | None = None,
                   attn_implementation: str = "sdpa", overrides: dict | None = None) -> "Eagle3Draft":
        """A draft shaped by the target's config, or by `overrides` where a released draft's own config says
        otherwise (its RoPE, its attention heads and head size)."""
        config = draft_config(target_model.config, attn_implementation, 1, overrides)
        if "head_dim" not in (overrides or {}):  # upstream (EAGLE's cnets.py) ignores a config head_dim
            config.head_dim = config.hidden_size // config.num_attention_heads
        draft = cls(config, draft_vocab_size or config.vocab_size)
        draft.hidden_state_layers = fused_layers(target_model.config.num_hidden_layers)
        return draft.attach(target_model.get_input_embeddings())

    def attach(self, embedding: nn.Module) -> "Eagle3Draft":
        self._embedding = (embedding,)
        return self

    @property
    def embed(self) -> nn.Module:
        return self._embedding[0]

    def saved_fields(self) -> dict:
        return {"family": self.family, "draft_vocab_size": self.draft_vocab_size,
                "target_hidden_size": self.target_hidden_size}

    def set_vocabulary(self, token_ids: torch.Tensor) -> None:
        """The draft vocabulary: these target ids, sorted, one per head row."""
        ids = torch.sort(torch.as_tensor(token_ids, dtype=torch.long)).values
        if ids.numel() != self.draft_vocab_size:
            raise ValueError(f"{ids.numel()} ids for a head of {self.draft_vocab_size} rows")
        d2t, t2d = vocabulary_maps(ids, self.config.vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    @property
    def vocab_ids(self) -> torch.Tensor | None:
        """Draft index -> target id; None when the head covers the whole vocabulary in order."""
        if self.draft_vocab_size == self.config.vocab_size and not bool(self.d2t.any()):
            return None
        return self.d2t + torch.arange(self.draft_vocab_size, device=self.d2t.device)

    def trainable_parameters(self):
        return [p for p in self.parameters() if p.requires_grad]

    def use_vocabulary(self, token_ids) -> None:
        raise ValueError("an EAGLE-3 draft's vocabulary is its head's, fixed when it was trained")

    # ------------------------------------------------------------------------------------------- pieces
    def pair_input(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """[emb(token) ; g]: g = fc(features) for the target's fused features, the features themselves for the
        draft's own outputs."""
        with torch.no_grad():
            embedded = self.embed(tokens)
        if features.shape[-1] != self.config.hidden_size:
            features = self.fc(features)
        return torch.cat((embedded.to(features.dtype), features), dim=-1)

    def serial(self, x: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               cache=None) -> torch.Tensor:
        position_embeddings = self.rotary(x, position_ids)
        return self.midlayer(x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                             position_embeddings=position_embeddings)

    def vocab_logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(features))

    def candidate_logits(self, features: torch.Tensor, rows: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
        """Logits of features [n, H] at head rows `rows` [n, k] (each its own) and `shared` [m] (all alike)."""
        normed, weight = self.norm(features), self.lm_head.weight
        # `embedding` gathers the rows: its backward adds the gradients up in a fixed order (plain indexing's
        # scatter-add does not on a multi-threaded CPU, and a resumed training would drift from an unbroken one)
        own = torch.einsum("nh,nkh->nk", normed, nn.functional.embedding(rows, weight))
        return torch.cat((own, normed @ nn.functional.embedding(shared, weight).T), dim=-1)
