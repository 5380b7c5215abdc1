"""Draft checkpoints: the released Gumiho ones (`pytorch_model.bin`) and ours (safetensors float16), one loader.

Released checkpoints (`amd/Gumiho-*`) hold `embed_tokens.weight`, `fc.*`, `layers.{0,1}.*` (no
`layers.0.input_layernorm`) and the heads as `mlp.<i>.<block>.linear.*`; upstream's inference wrapper renames the
heads to `mlp.mlp.<i>.*`, and both spellings are accepted here. Their config.json is the target's config with two
layers. The embedding is not loaded: the draft uses the loaded target's own (frozen) embedding and head.

Our drafts are a folder with `model.safetensors` (float16), `config.json` (the draft config plus `mlp_num`) and
`manifest.json` (how it was trained). A hub id goes through huggingface_hub's snapshot cache; a local folder is
read directly; both then take the same path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch

from evaluation.engine.errors import HarnessError
from gumiho.draft_model import GumihoDraft

OUR_WEIGHTS = "model.safetensors"
UPSTREAM_WEIGHTS = "pytorch_model.bin"
FORMAT = "gumiho-draft-v1"
_MLP_KEY = re.compile(r"^mlp\.(?:mlp\.)?(\d+)\.(.*)$")


def resolve(source: str | os.PathLike) -> Path:
    """A local folder as is; anything else is taken as a hub id and fetched into huggingface_hub's cache."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(source).startswith((".", "/", "~")):
        raise HarnessError(f"draft folder not found: {path}")
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(str(source), allow_patterns=["config.json", UPSTREAM_WEIGHTS, OUR_WEIGHTS,
                                                                "manifest.json"])
    except Exception as exc:  # noqa: BLE001 - network, auth, unknown repo: one line for the user
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise HarnessError(f"cannot fetch draft {source!r} from the hub: {first} (give a local folder)") from None
    return Path(folder)


def normalise_keys(state: dict) -> dict:
    """Upstream's keys (either spelling of the heads) as this draft names them; the embedding is dropped."""
    out = {}
    for key, value in state.items():
        if key in ("embed_tokens.weight", "lm_head.weight"):
            continue
        match = _MLP_KEY.match(key)
        out[f"mlp.{match.group(1)}.{match.group(2)}" if match else key] = value
    return out


def count_heads(state: dict) -> int:
    heads = {int(m.group(1)) for m in map(_MLP_KEY.match, state) if m}
    return max(heads) + 1 if heads else 0


def _read_weights(folder: Path) -> dict:
    if (folder / OUR_WEIGHTS).is_file():
        from safetensors.torch import load_file

        return load_file(folder / OUR_WEIGHTS)
    if (folder / UPSTREAM_WEIGHTS).is_file():
        return torch.load(folder / UPSTREAM_WEIGHTS, map_location="cpu", weights_only=True)
    raise HarnessError(f"no {OUR_WEIGHTS} or {UPSTREAM_WEIGHTS} in {folder}")


def load_draft(source: str | os.PathLike, target_model, attn_implementation: str = "sdpa") -> GumihoDraft:
    """A draft for `target_model` from a local folder or hub id, on the target's device and dtype."""
    folder = resolve(source)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    target = target_model.config
    for key in ("hidden_size", "vocab_size"):
        if key in config and config[key] != getattr(target, key):
            raise HarnessError(f"draft {source} has {key} {config[key]}, the target {getattr(target, key)}")
    state = normalise_keys(_read_weights(folder))
    draft = GumihoDraft.for_target(target_model, count_heads(state), attn_implementation)
    own = draft.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        raise HarnessError(f"draft {source} does not fit the target: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}, wrong shape {wrong[:3]}")
    draft.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
    param = next(target_model.parameters())
    return draft.to(device=param.device, dtype=param.dtype).eval()


def save_draft(draft: GumihoDraft, folder: str | os.PathLike, manifest: dict) -> Path:
    """Write weights (float16 safetensors), config and manifest into `folder`, atomically (tmp, then rename)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in draft.state_dict().items()}
    save_file(weights, tmp / OUR_WEIGHTS, metadata={"format": "pt"})
    config = draft.config.to_dict()
    config.update(format=FORMAT, mlp_num=draft.mlp_num)
    (tmp / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True, default=str) + "\n")
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n")
    old = folder.with_name(folder.name + f".old{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder
