"""A checkpoint named by a local folder or a hub id (owner/name), the one way every trained draft, head set and draft
model is found: `is_folder_or_hub_id` checks the name as an option is checked, `resolve` gives the folder (a hub
id through huggingface_hub's snapshot cache, which the offline node fills beforehand)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from evaluation.engine.errors import HarnessError

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def is_folder_or_hub_id(name) -> bool:
    """An existing folder, or a name shaped like a hub id (owner/name), of a plausible length."""
    return isinstance(name, str) and 0 < len(name) <= 4096 and (
        is_dir(name) or (HUB_ID.fullmatch(name) is not None and not name.startswith((".", "/"))))


def is_dir(path: str) -> bool:
    try:
        return Path(path).expanduser().is_dir()
    except OSError:  # e.g. a name too long for the file system
        return False


def resolve(source: str | os.PathLike, files: Iterable[str], what: str = "draft") -> Path:
    """A local folder as is; anything else is a hub id whose `config.json` and `files` are fetched into the hub's
    cache (or found there). A path that is not a folder, or a hub id that cannot be had, is one line naming `what`."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(source).startswith((".", "/", "~")):
        raise HarnessError(f"{what} folder not found: {path}")
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(str(source), allow_patterns=["config.json", *files])
    except Exception as exc:  # noqa: BLE001 - network, auth, unknown repo: one line for the user
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise HarnessError(f"cannot fetch {what} {source!r} from the hub: {first} (give a local folder)") from None
    return Path(folder)
