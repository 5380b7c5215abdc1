"""The checks a config's or a method's options run in their `check()`: one `OptionError` naming the option, its
value and what is allowed. Shared by the run's configs and every method; standard library only."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from evaluation.engine.errors import require

# Draft plus side nodes per step: the attention mask is nodes x (context + nodes), the cache reserves as many slots.
MAX_DRAFT_NODES = 4096
# Token ids: below every vocabulary's size is checked once the model is loaded; this only keeps them plausible.
MAX_TOKEN_ID = 2**31 - 1
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def require_int_range(option: str, value, low: int, high: int | None = None) -> None:
    """`low <= value <= high` (no upper bound when `high` is None)."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    require(isinstance(value, int) and value >= low and (high is None or value <= high), option, value, allowed)


def require_number_range(option: str, value, low: float, high: float) -> None:
    """A finite number in [low, high] (NaN and infinities are refused)."""
    ok = isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high
    require(ok, option, value, f"a number in [{low}, {high}]")


def require_choice(option: str, value, choices) -> None:
    require(value in choices, option, value, "one of " + ", ".join(map(str, choices)))


def require_name(option: str, value) -> None:
    """A name used as a folder name: letters, digits, `.`, `_`, `+`, `-`; no path separators."""
    require(isinstance(value, str) and NAME.fullmatch(value) is not None, option, value,
            "a name of letters, digits, '.', '_', '+', '-' (at most 100 characters)")


def _exists(path: Path, kind: str) -> bool:
    """`path.is_file()` / `is_dir()`, false for a path the system refuses (a name too long)."""
    try:
        return getattr(path, kind)()
    except OSError:
        return False


def require_file(option: str, value, fix: str = "") -> None:
    """An existing file; `fix` says how to get the expected one (named in the error)."""
    ok = isinstance(value, str) and value != "" and _exists(Path(value).expanduser(), "is_file")
    require(ok, option, value, "an existing file" + (f"; {fix}" if fix else ""))


def require_dir(option: str, value, containing: str | None = None) -> None:
    path = Path(value).expanduser() if isinstance(value, str) and value else None
    ok = path is not None and _exists(path, "is_dir") and (containing is None or _exists(path / containing, "is_file"))
    require(ok, option, value, "an existing folder" + (f" with a {containing}" if containing else ""))


def require_writable_dir(option: str, value) -> None:
    """A folder that exists or can be created: every part a valid name, the nearest existing parent a writable
    folder. Checked without creating anything."""
    allowed = "a folder that exists or can be created"
    require(isinstance(value, str) and value.strip() != "", option, value, allowed)
    path = Path(value).expanduser().absolute()
    require(all(len(part.encode()) <= 255 for part in path.parts), option, value, allowed + " (a name is too long)")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    ok = existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)
    require(ok, option, value, allowed + (f" ({existing} is not a folder)" if not existing.is_dir() else
                                          f" ({existing} is not writable)"))


def require_token_id(option: str, value, lm) -> None:
    """Below the target's vocabulary size; for a method's constructor, once the model is loaded (no model: no check,
    as unit tests build methods on `None`)."""
    vocab = getattr(getattr(getattr(lm, "model", None), "config", None), "vocab_size", None)
    if vocab is not None:
        require(0 <= value < vocab, option, value, f"a token id below the vocabulary size {vocab}")


def require_increasing(option: str, values) -> None:
    ok = all(a < b for a, b in zip(values, values[1:]))
    require(ok, option, list(values), "strictly increasing values")
