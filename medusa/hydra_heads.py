"""Hydra's heads (Hydra++, `zankner/Hydra` `hydra_heads/prefix_mlp_head.py`) and their checkpoints
(docs/methods/hydra.md, Heads and Checkpoints).

  - A prefix layer (Hydra++): one Llama decoder layer and a final norm run over the target's last hidden states of
    the committed positions, with its own KV cache: P_t = norm(layer(h_t)).
  - Head i (0-based, depth i + 1) reads [P_t ; emb(y_1) ; ... ; emb(y_{i+1})], the prefix state and the embeddings
    of the tokens drafted so far on its path (y_1 = the pending token), so the heads are sequentially dependent:
    a conditioned residual block (i + 2)H -> H, v = W_res x + b_res + SiLU(W x + b), then one residual block
    v + SiLU(W v + b) applied `num_layers - 1` times (upstream repeats one module: shared weights), then a
    projection with a bias onto the vocabulary.
  - Plain Hydra (`hydra_head_arch: mlp`) has no prefix layer: the heads read h_t itself.
  - Dropout (0.2) before every block and before the projection, in training only.

Released checkpoints (`ankner/hydra-vicuna-7b-v1.3`, ...): `config.json` (`hydra_head_arch`, `grounded_heads`,
`hydra_num_heads`, `hydra_num_layers`) and `hydra_lm_head.pt` with keys `prefix_embeding_layer.layers.0.*`,
`prefix_embeding_layer.norm.weight` (and an unused `prefix_embeding_layer.embed_tokens.weight`),
`input_embed_fn.weight` (a copy of the target's embedding, not used: the target's own is), `hydra_mlp.{i}.1.*`
(the conditioned block), `hydra_mlp.{i}.3.linear.*` (the shared block, also stored under `.5.` and `.7.`),
`hydra_lm_head.{i}.1.weight|bias`. Heads trained here are written by the drafts' writer
(`drafts.checkpoint.save_draft`: float16 `model.safetensors` under this module's own keys, upstream's config fields,
a manifest), plus `vocab_ids` when the projections cover a reduced vocabulary; `save_upstream` writes upstream's
layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from evaluation.engine.errors import HarnessError
from evaluation.engine.kv_cache import cache_argument
from drafts.serial_draft import draft_config
from evaluation.hub import resolve
from medusa.heads import read_state

WEIGHTS = ("model.safetensors", "hydra_lm_head.safetensors", "hydra_lm_head.pt")
ARCHITECTURES = ("prefix-mlp", "mlp")
DROPOUT = 0.2  # upstream's training dropout (heads only; the prefix layer has none)


class ConditionedBlock(nn.Module):
    """W_res x + b_res + SiLU(W x + b): a residual block whose input is wider than its output."""

    def __init__(self, hidden: int, inputs: int):
        super().__init__()
        self.linear = nn.Linear(inputs * hidden, hidden)
        self.res_connection = nn.Linear(inputs * hidden, hidden)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x):
        return self.res_connection(x) + torch.nn.functional.silu(self.linear(x))


class SharedBlock(nn.Module):
    """v + SiLU(W v + b), applied `repeats` times with the same weights (upstream's `[Dropout, block] * n`)."""

    def __init__(self, hidden: int, repeats: int, dropout: nn.Module):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        self.repeats, self.dropout = repeats, dropout

    def forward(self, v):
        for _ in range(self.repeats):
            v = self.dropout(v)
            v = v + torch.nn.functional.silu(self.linear(v))
        return v


class HydraHead(nn.Module):
    """Dropout before every block and before the projection, as upstream trains (identity in eval mode)."""

    def __init__(self, hidden: int, vocab: int, depth_index: int, num_layers: int, dropout: float = DROPOUT):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.conditioned = ConditionedBlock(hidden, depth_index + 2)
        self.shared = SharedBlock(hidden, num_layers - 1, self.dropout) if num_layers > 1 else None
        self.lm_head = nn.Linear(hidden, vocab)

    def forward(self, x):
        v = self.conditioned(self.dropout(x))
        if self.shared is not None:
            v = self.shared(v)
        return self.lm_head(self.dropout(v))


class HydraHeads(nn.Module):
    """The prefix layer (Hydra++) and the heads; the token embedding is the target's (`embed`). The projections
    cover the target's vocabulary, or the rows `vocab_ids` of it (a reduced draft vocabulary, heads trained here)."""

    def __init__(self, target_config, num_heads: int, num_layers: int, prefix: bool = True,
                 vocab_ids: torch.Tensor | None = None):
        super().__init__()
        hidden = target_config.hidden_size
        vocab = target_config.vocab_size if vocab_ids is None else int(vocab_ids.numel())
        self.num_heads, self.num_layers = num_heads, num_layers
        self.prefix = prefix
        self.base_model = getattr(target_config, "_name_or_path", "")
        if prefix:
            # A Llama decoder layer with the target's sizes, head_dim and RoPE, whatever the target's own layers
            # are (upstream's is Llama's; a Qwen3 config lacks fields a Llama layer reads, e.g. `mlp_bias`)
            config = draft_config(target_config, getattr(target_config, "_attn_implementation", None) or "sdpa", 1)
            self.prefix_layer = LlamaDecoderLayer(config, layer_idx=0)
            self.prefix_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
            self.rotary = LlamaRotaryEmbedding(config)
        self.heads = nn.ModuleList(HydraHead(hidden, vocab, i, num_layers) for i in range(num_heads))
        self.register_buffer("vocab_ids", vocab_ids, persistent=vocab_ids is not None)

    @classmethod
    def for_target(cls, target, num_heads: int = 4, num_layers: int = 4, prefix: bool = True,
                   vocab_ids: torch.Tensor | None = None) -> "HydraHeads":
        """New heads as upstream starts them: the projections as the target's head (its rows `vocab_ids`) with a
        zero bias, the prefix layer as a fresh transformers layer (normal weights, std `initializer_range`)."""
        heads = cls(target.config, num_heads, num_layers, prefix, vocab_ids)
        weight = target.lm_head.weight.detach()
        if vocab_ids is not None:
            weight = weight[vocab_ids.to(weight.device)]
        with torch.no_grad():
            for head in heads.heads:
                head.lm_head.weight.copy_(weight)
                head.lm_head.bias.zero_()
            if prefix:
                for module in heads.prefix_layer.modules():
                    if isinstance(module, nn.Linear):
                        module.weight.normal_(0.0, getattr(target.config, "initializer_range", 0.02))
        return heads

    @property
    def vocab(self) -> int:
        return self.heads[0].lm_head.weight.shape[0]

    def target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Target token ids of vocabulary rows."""
        return rows if self.vocab_ids is None else self.vocab_ids[rows]

    def trainable_parameters(self):
        return list(self.parameters())

    # what the drafts' writer (`drafts.checkpoint.save_draft`) asks of a draft: upstream's config fields
    @property
    def config(self) -> SimpleNamespace:
        fields = {"hydra_head_arch": "prefix-mlp" if self.prefix else "mlp", "grounded_heads": True,
                  "hidden_state_offset": 0, "hydra_num_heads": self.num_heads, "hydra_num_layers": self.num_layers,
                  "base_model_name_or_path": self.base_model}
        return SimpleNamespace(to_dict=lambda: dict(fields))

    def saved_fields(self) -> dict:
        return {"family": "hydra", "draft_vocab_size": self.vocab}

    def prefix_states(self, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """P for target states `hidden` [1, n, H] at `positions` [1, n]; writes the prefix layer's cache."""
        if not self.prefix:
            return hidden
        embeddings = self.rotary(hidden, positions)
        out = self.prefix_layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=embeddings,
                                **cache_argument(self.prefix_layer, cache), use_cache=True)
        return self.prefix_norm(out)


def _upstream_key(key: str) -> str:
    """Our key -> upstream's (`hydra_lm_head.pt`)."""
    if key.startswith("prefix_layer."):
        return "prefix_embeding_layer.layers.0." + key[len("prefix_layer."):]
    if key.startswith("prefix_norm."):
        return "prefix_embeding_layer.norm." + key[len("prefix_norm."):]
    index, part, rest = key.split(".", 3)[1:]
    if part == "conditioned":
        return f"hydra_mlp.{index}.1.{rest}"
    if part == "shared":
        return f"hydra_mlp.{index}.3.{rest}"
    return f"hydra_lm_head.{index}.1.{rest}"  # lm_head


def upstream_state(heads: HydraHeads) -> dict[str, torch.Tensor]:
    """The heads' weights under upstream's keys (the shared block once, under `.3.`; `vocab_ids` as it is)."""
    return {(k if k == "vocab_ids" else _upstream_key(k)): v for k, v in heads.state_dict().items()
            if not k.startswith("rotary.")}


def load_hydra_heads(source: str, target, num_heads: int | None = None) -> HydraHeads:
    """Hydra heads from a folder or hub id in upstream's layout, checked against `target`; one line when they do
    not fit."""
    folder = resolve(source, WEIGHTS, "Hydra heads")
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    arch = config.get("hydra_head_arch", "prefix-mlp")
    if arch not in ARCHITECTURES or not config.get("grounded_heads", True):
        raise HarnessError(f"Hydra heads {source!r}: head architecture {arch!r} "
                           f"(grounded_heads={config.get('grounded_heads')}) is not supported; supported: grounded "
                           f"{' or '.join(ARCHITECTURES)}")
    files = [folder / name for name in WEIGHTS if (folder / name).is_file()]
    if not files:
        raise HarnessError(f"Hydra heads {source!r}: no {' or '.join(WEIGHTS)} in {folder}")
    state = read_state(files[0])
    if any(k.startswith("heads.") for k in state):  # heads trained here: our keys (drafts.checkpoint.save_draft)
        state = {(k if k == "vocab_ids" else _upstream_key(k)): v for k, v in state.items()}
    vocab_ids = state.get("vocab_ids")
    if vocab_ids is not None and (vocab_ids.min() < 0 or vocab_ids.max() >= target.config.vocab_size):
        raise HarnessError(f"Hydra heads {source!r}: vocab_ids beyond the target's vocabulary of "
                           f"{target.config.vocab_size}")
    stored = int(config.get("hydra_num_heads", 0)) or len({k.split(".")[1] for k in state
                                                           if k.startswith("hydra_lm_head.")})
    count = stored if num_heads is None else num_heads
    if count > stored:
        raise HarnessError(f"Hydra heads {source!r}: {count} heads asked for, {stored} stored")
    heads = HydraHeads(target.config, count, int(config.get("hydra_num_layers", 4)), prefix=arch == "prefix-mlp",
                       vocab_ids=None if vocab_ids is None else vocab_ids.long())
    wanted = upstream_state(heads)
    rows = heads.vocab
    for key, value in wanted.items():
        if key == "vocab_ids":
            continue
        if key not in state:
            raise HarnessError(f"Hydra heads {source!r}: key {key} missing from {files[0].name}")
        if tuple(state[key].shape) != tuple(value.shape):
            raise HarnessError(f"Hydra heads {source!r}: {key} is {tuple(state[key].shape)}, the target "
                               f"(hidden {target.config.hidden_size}, vocabulary {rows}) needs "
                               f"{tuple(value.shape)}")
    ours = {k: (heads.vocab_ids if k == "vocab_ids" else state[_upstream_key(k)].float())
            for k in heads.state_dict() if not k.startswith("rotary.")}
    heads.load_state_dict(ours)
    return heads.eval()  # dropout off: loaded heads are for drafting


def save_upstream(heads: HydraHeads, folder: str | Path, base_model: str = "") -> None:
    """Write heads as upstream's release does (`config.json`, `hydra_lm_head.pt`), for tests and for users who
    take heads trained here to upstream's code."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(upstream_state(heads), folder / "hydra_lm_head.pt")
    config = {"hydra_head_arch": "prefix-mlp" if heads.prefix else "mlp", "grounded_heads": True,
              "hidden_state_offset": 0, "hydra_num_heads": heads.num_heads, "hydra_num_layers": heads.num_layers,
              "base_model_name_or_path": base_model}
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
