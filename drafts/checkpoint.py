"""Draft checkpoints, read and written: the released serial drafts (Gumiho's and EAGLE's, `pytorch_model.bin`) and
ours (safetensors float16) through one loader, the checks every family's loader shares, and `save_draft`.

Released checkpoints (`amd/Gumiho-*`) hold `embed_tokens.weight`, `fc.*`, `layers.{0,1}.*` (no
`layers.0.input_layernorm`) and the heads as `mlp.<i>.<block>.linear.*`; upstream's inference wrapper renames the
heads to `mlp.mlp.<i>.*`, and both spellings are accepted here. Their config.json is the target's config with two
layers. EAGLE's released drafts (`yuhuili/EAGLE-Vicuna-7B-v1.3`, ...) are the same layout with one layer and no
heads. The layer and head counts are read from the keys. The embedding is not loaded: the draft uses the loaded
target's own (frozen) embedding and head.

Our drafts are a folder with `model.safetensors` (float16), `config.json` (the draft config plus `family` and
`mlp_num`), `manifest.json` (how it was trained) and `token_counts.csv` (how often each target token occurs in the
assistant text it was trained on: the reduced draft vocabulary's source). A hub id goes through huggingface_hub's snapshot cache; a local folder is
read directly; both then take the same path. A folder that cannot be read (a broken config.json, weights that are
not safetensors or not a state dict of tensors) is one `HarnessError` naming the file.

`save_draft` writes the whole folder beside its destination under a temporary name, then renames it into place;
it replaces only a folder that is itself a draft it wrote (`is_harness_draft`), never any other file or folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Optional

import torch

from evaluation import hub
from evaluation.engine.errors import HarnessError
from drafts.data import most_frequent
from drafts.serial_draft import SerialDraft, config_rope

OUR_WEIGHTS = "model.safetensors"
UPSTREAM_WEIGHTS = "pytorch_model.bin"
FORMAT = "gumiho-draft-v1"
TOKEN_COUNTS = "token_counts.csv"
_MLP_KEY = re.compile(r"^mlp\.(?:mlp\.)?(\d+)\.(.*)$")
_LAYER_KEY = re.compile(r"^layers\.(\d+)\.")


def resolve(source: str | os.PathLike) -> Path:
    """A draft's folder: a local folder as is, a hub id through the hub's cache (`evaluation.hub.resolve`)."""
    return hub.resolve(source, [UPSTREAM_WEIGHTS, OUR_WEIGHTS, "manifest.json", TOKEN_COUNTS], "draft")


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


def count_layers(state: dict) -> int:
    layers = {int(m.group(1)) for m in map(_LAYER_KEY.match, state) if m}
    return max(layers) + 1 if layers else 0


def reason(exc: BaseException) -> str:
    """What went wrong, in one short line: torch's weights-only refusal is several lines whose useful one is the
    unpickler's own; for anything else the first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for k, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            rest = line.split("WeightsUnpickler error:", 1)[1].strip() or (lines[k + 1] if k + 1 < len(lines) else "")
            return f"weights-only unpickler: {rest.split('. ')[0].rstrip('.')}"[:300]
    return (lines[0] if lines else type(exc).__name__)[:300]


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HarnessError(f"draft config {path} is not valid JSON ({reason(exc)})") from None
    if not isinstance(config, dict):
        raise HarnessError(f"draft config {path} is not a JSON object (it holds a {type(config).__name__})")
    return config


def read_weights(folder: Path) -> dict:
    path = folder / OUR_WEIGHTS
    if path.is_file():
        from safetensors.torch import load_file

        try:
            state = load_file(path)
        except Exception as exc:  # noqa: BLE001 - any unreadable file: one line naming it
            raise HarnessError(f"draft weights {path} cannot be read as safetensors ({reason(exc)})") from None
    elif (folder / UPSTREAM_WEIGHTS).is_file():
        path = folder / UPSTREAM_WEIGHTS
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)  # never runs code from the file
        except Exception as exc:  # noqa: BLE001 - any unreadable file: one line naming it
            raise HarnessError(f"draft weights {path} cannot be read as a PyTorch state dict ({reason(exc)})") \
                from None
    else:
        raise HarnessError(f"no {OUR_WEIGHTS} or {UPSTREAM_WEIGHTS} in {folder}")
    if not isinstance(state, dict):
        raise HarnessError(f"draft weights {path} hold a {type(state).__name__}, not a dict of tensors")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise HarnessError(f"draft weights {path}: {key!r} is a {type(value).__name__}, not a tensor")
    return state


def load_draft(source: str | os.PathLike, target_model, attn_implementation: str = "sdpa") -> SerialDraft:
    """A draft for `target_model` from a local folder or hub id, on the target's device and dtype; a folder that
    cannot be read or does not fit the target raises `HarnessError` (one line naming the file)."""
    folder = resolve(source)
    config = read_config(folder)
    check_fits_target(source, config, target_model)
    state = normalise_keys(read_weights(folder))
    if any(key.startswith("midlayer.") for key in state):
        raise HarnessError(f"draft {source} is an EAGLE-3 draft (midlayer.* keys): use method=eagle3")
    layers = count_layers(state)
    if not layers:
        raise HarnessError(f"draft {source} has no decoder layers (no layers.<i>.* keys)")
    if "fc.bias" not in state and config.get("bias") is False and "fc.weight" in state:
        # EAGLE's `"bias": false` (its Llama-3 drafts): upstream builds fc without a bias and saves none; a zero
        # bias is the same map. (Gumiho's configs say false too but its code ignores it: theirs hold fc.bias.)
        state["fc.bias"] = torch.zeros(state["fc.weight"].shape[0], dtype=state["fc.weight"].dtype)
    draft = SerialDraft.for_target(target_model, count_heads(state), attn_implementation, layers,
                                   {"rope_parameters": checkpoint_rope(config)})
    return fill(draft, state, source, target_model)


# Upstream's draft code (EAGLE's cnets, Gumiho's, AngelSlim's) builds its RoPE from the draft's own config.json:
# `rope_theta`, else this base, whatever the target uses.
UPSTREAM_ROPE_THETA = 10000.0


def checkpoint_rope(config: dict) -> dict:
    """The RoPE of a draft checkpoint, in transformers 5's form: what its own config.json names (ours:
    `rope_parameters`, the target's at training; upstream's: `rope_theta` and a `rope_scaling`), else upstream's
    default base. Never the target's: a released draft runs with the RoPE it was trained with, which may differ
    (EAGLE-3's Llama-3.1 training config names no base, so its draft runs at 10000 without llama3 scaling under a
    target at 500000 with it; EAGLE's Llama-3 configs name 500000 without the scaling)."""
    return config_rope(config) or {"rope_type": "default", "rope_theta": UPSTREAM_ROPE_THETA}


def check_fits_target(source, config: dict, target_model) -> None:
    """The draft's config.json names the target's hidden size and vocabulary, or nothing."""
    target = target_model.config
    for key in ("hidden_size", "vocab_size"):
        if key in config and config[key] != getattr(target, key):
            raise HarnessError(f"draft {source} has {key} {config[key]}, the target {getattr(target, key)}")


def fill(draft, state: dict, source, target_model):
    """Load `state` into `draft` (every key, every shape exact, else one line), on the target's device and dtype."""
    own = draft.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        detail = "; ".join(f"{k}: {tuple(state[k].shape)} for {tuple(own[k].shape)}" for k in wrong[:2])
        raise HarnessError(f"draft {source} does not fit the target: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}, wrong shape {wrong[:3]}" + (f" ({detail})" if detail else ""))
    draft.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
    param = next(target_model.parameters())
    return draft.to(device=param.device, dtype=param.dtype).eval()


def read_token_counts(folder: Path) -> Optional[torch.Tensor]:
    """The draft's token counts [vocab] (int64), or None when the folder has none."""
    path = Path(folder) / TOKEN_COUNTS
    if not path.is_file():
        return None
    try:
        rows = [line.split(",") for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
        pairs = [(int(token), int(count)) for token, count in rows]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise HarnessError(f"token counts {path} cannot be read as token_id,count rows ({reason(exc)})") from None
    size = max((t for t, _ in pairs), default=-1) + 1
    counts = torch.zeros(size, dtype=torch.long)
    for token, count in pairs:
        counts[token] = count
    return counts


def token_counts_text(counts: torch.Tensor) -> str:
    """`token_id,count` rows for the tokens that occur, most frequent first (ties: lower id first)."""
    order = most_frequent(counts, int((counts > 0).sum()))
    return "token_id,count\n" + "".join(f"{int(t)},{int(counts[t])}\n" for t in order)


def is_harness_draft(folder: Path) -> bool:
    """A folder `save_draft` wrote: a real folder (not a link) with a manifest.json object and a config.json of
    this format."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(manifest, dict) and isinstance(config, dict) and config.get("format") == FORMAT


def check_destination(folder: str | os.PathLike) -> None:
    """`folder` may receive a draft: it does not exist, or it is a draft the harness wrote (which is replaced).
    Anything else stops with one line; nothing is ever deleted that the harness did not write."""
    folder = Path(folder)
    if (folder.exists() or folder.is_symlink()) and not is_harness_draft(folder):
        raise HarnessError(f"{folder} exists and is not a draft written by the harness (no manifest.json and "
                           f"config.json of {FORMAT}); it is never replaced: choose another out_dir or remove it "
                           f"yourself")


def _write_whole(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sibling(folder: Path, kind: str) -> Path:
    """A new, empty folder beside `folder` that this process created (hidden, so no reader takes it for a draft)."""
    path = folder.with_name(f".{folder.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    path.mkdir()
    return path


def save_draft(draft, folder: str | os.PathLike, manifest: dict,
               files: Optional[dict[str, str]] = None) -> Path:
    """Write weights (float16 safetensors), config, manifest and `files` ({name: text}, e.g. the curve) into a new
    folder beside `folder`, then rename it into place. An existing `folder` is replaced only when it is a draft the
    harness wrote (`check_destination`); the old one is moved aside first and removed once the new one is in
    place, or moved back if that fails. A kill never leaves a half-written folder under the draft's name."""
    from safetensors.torch import save_file

    folder = Path(folder)
    clash = [n for n in files or {} if n in (OUR_WEIGHTS, "config.json", "manifest.json") or Path(n).name != n]
    if clash:
        raise ValueError(f"save_draft: files {clash} would replace the draft's own or leave the folder")
    check_destination(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp: Optional[Path] = _sibling(folder, "tmp")
    aside: Optional[Path] = None
    try:
        weights = {k: v.detach().to("cpu", torch.float16 if v.is_floating_point() else v.dtype).contiguous()
                   for k, v in draft.state_dict().items()}
        save_file(weights, tmp / OUR_WEIGHTS, metadata={"format": "pt"})
        with open(tmp / OUR_WEIGHTS, "rb") as f:
            os.fsync(f.fileno())
        config = draft.config.to_dict()
        config.update(format=FORMAT, **draft.saved_fields())
        texts = {"config.json": json.dumps(config, indent=1, sort_keys=True, default=str) + "\n",
                 "manifest.json": json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n",
                 **(files or {})}
        for name, text in texts.items():
            _write_whole(tmp / name, text.encode())
        check_destination(folder)  # still nothing but a draft of ours there
        if folder.exists():
            aside = _sibling(folder, "old")
            folder.rename(aside / folder.name)
        tmp.rename(folder)
        tmp = None
    finally:
        if tmp is not None:  # failed or interrupted: the old draft goes back, the new files go
            if aside is not None and not folder.exists():
                (aside / folder.name).rename(folder)
                shutil.rmtree(aside)
                aside = None
            shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None:  # the new draft is in place: the old one (a draft of ours) goes
            shutil.rmtree(aside, ignore_errors=True)
    return folder
