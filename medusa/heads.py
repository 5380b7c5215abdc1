"""Medusa-1's heads and their checkpoints (docs/methods/medusa.md, Heads and Checkpoints).

Head k is a residual block v = h + SiLU(W_k h + b_k) on the target's last hidden state h (after the final norm),
then a projection of v onto the vocabulary; it predicts the token k + 2 places after the one h was computed at
(the target's own head predicts the next one). Released checkpoints (`FasterDecoding/medusa-vicuna-7b-v1.3`, ...)
are a `config.json` (`medusa_num_heads`, `medusa_num_layers`) and `medusa_lm_head.pt`, a state dict with keys
`{k}.{i}.linear.weight|bias` (block i of head k) and `{k}.{n}.weight` (its projection, n = the block count).
Heads trained here are written by the drafts' writer (`drafts.checkpoint.save_draft`: float16 `model.safetensors`
with the same keys, a config with the same fields, a manifest), plus `vocab_ids` when the projection covers a
reduced vocabulary (the sorted target ids of its rows).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from evaluation.engine.errors import HarnessError, require
from evaluation.engine.options import require_int_range
from evaluation.hub import is_folder_or_hub_id, resolve

WEIGHTS = ("model.safetensors", "medusa_lm_head.safetensors", "medusa_lm_head.pt")


class ResBlock(nn.Module):
    """v + SiLU(W v + b); W starts at zero, so a new block is the identity (upstream's initialisation)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """K heads over a vocabulary of `vocab` rows; `vocab_ids` maps a row to its target id (None: row = id). A
    ModuleList of Sequential(blocks..., projection), so its state dict has upstream's keys."""

    def __init__(self, hidden: int, vocab: int, num_heads: int, num_layers: int = 1,
                 vocab_ids: torch.Tensor | None = None, base_model: str = ""):
        super().__init__(
            nn.Sequential(*[ResBlock(hidden) for _ in range(num_layers)], nn.Linear(hidden, vocab, bias=False))
            for _ in range(num_heads))
        self.num_heads, self.num_layers, self.base_model = num_heads, num_layers, base_model
        self.register_buffer("vocab_ids", vocab_ids, persistent=vocab_ids is not None)

    @classmethod
    def for_target(cls, target, num_heads: int, num_layers: int = 1, vocab_ids: torch.Tensor | None = None):
        """New heads whose projections start as the target's head (its rows `vocab_ids`), as upstream trains them."""
        weight = target.lm_head.weight.detach()
        if vocab_ids is not None:
            weight = weight[vocab_ids.to(weight.device)]
        heads = cls(weight.shape[1], weight.shape[0], num_heads, num_layers, vocab_ids,
                    getattr(target.config, "_name_or_path", ""))
        with torch.no_grad():
            for head in heads:
                head[-1].weight.copy_(weight)
        return heads

    @property
    def vocab(self) -> int:
        return self[0][-1].weight.shape[0]

    def forward(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """Logits [count, ..., vocab] of the first `count` heads (all by default) on `hidden` [..., H]."""
        return torch.stack([head(hidden) for head in list(self)[: count or self.num_heads]])

    def target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Target token ids of vocabulary rows."""
        return rows if self.vocab_ids is None else self.vocab_ids[rows]

    def trainable_parameters(self):
        return list(self.parameters())

    # what the drafts' writer (`drafts.checkpoint.save_draft`) asks of a draft
    @property
    def config(self) -> SimpleNamespace:
        fields = {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                  "base_model_name_or_path": self.base_model}
        return SimpleNamespace(to_dict=lambda: dict(fields))

    def saved_fields(self) -> dict:
        return {"family": "medusa", "draft_vocab_size": self.vocab}


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """A heads file's tensors: safetensors, or a torch pickle read with `weights_only` (never runs code)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def check_heads_source(heads, seed) -> None:
    """`heads` is null, `random`, an existing folder or a hub id (owner/name); the seed fits torch's."""
    ok = heads is None or heads == "random" or is_folder_or_hub_id(heads)
    require(ok, "heads", heads, "null (the committed heads), random, an existing folder or a hub id owner/name")
    require_int_range("seed", seed, 0, 2**63 - 1)


def load_heads(source: str, target, num_heads: int | None = None) -> MedusaHeads:
    """Heads from a folder or hub id in upstream's layout, checked against `target`; `num_heads` keeps the first
    ones (Spec-Bench runs 4 of the 5 the Vicuna checkpoints hold). One line when they do not fit."""
    folder = resolve(source, WEIGHTS, "Medusa heads")
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    files = [folder / name for name in WEIGHTS if (folder / name).is_file()]
    if not files:
        raise HarnessError(f"Medusa heads {source!r}: no {' or '.join(WEIGHTS)} in {folder}")
    state = read_state(files[0])
    stored = sorted({int(key.split(".")[0]) for key in state if key.split(".")[0].isdigit()})
    if not stored or stored != list(range(len(stored))):
        raise HarnessError(f"Medusa heads {source!r}: no heads numbered 0, 1, ... in {files[0].name}")
    # The stored head count wins over config.json's (the Vicuna releases say 2 and hold 5).
    layers = int(config.get("medusa_num_layers", 1))
    count = len(stored) if num_heads is None else num_heads
    if count > len(stored):
        raise HarnessError(f"Medusa heads {source!r}: {count} heads asked for, {len(stored)} stored")
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    vocab_ids = state.get("vocab_ids")
    rows = vocab if vocab_ids is None else int(vocab_ids.numel())
    heads = MedusaHeads(hidden, rows, count, layers, None if vocab_ids is None else vocab_ids.long(),
                        str(config.get("base_model_name_or_path", "")))
    for key, value in heads.state_dict().items():
        if key == "vocab_ids":
            continue
        if key not in state:
            raise HarnessError(f"Medusa heads {source!r}: key {key} missing from {files[0].name}")
        if tuple(state[key].shape) != tuple(value.shape):
            raise HarnessError(f"Medusa heads {source!r}: {key} is {tuple(state[key].shape)}, the target "
                               f"(hidden {hidden}, vocabulary {rows}) needs {tuple(value.shape)}")
    if vocab_ids is not None and (vocab_ids.min() < 0 or vocab_ids.max() >= vocab):
        raise HarnessError(f"Medusa heads {source!r}: vocab_ids beyond the target's vocabulary of {vocab}")
    with torch.no_grad():
        for k, head in enumerate(heads):
            head.load_state_dict({key: state[f"{k}.{key}"].float() for key in head.state_dict()})
    return heads
