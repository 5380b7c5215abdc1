"""Every option is checked before any work: types against the schemas, ranges and relations by each config's
own `check()`, files and folders for existence. A bad option ends the command with one line naming it, its value
and what is allowed (exit status 2), before the model loads and before anything is written under `results/`.

`validate(cfg)` is the one entry point; the runner calls it first. The groups it checks are the dataclass fields of
the root `Config` plus `EXTRA_GROUPS` (see `evaluation.config.config_groups`), and the method's own `Config`.
The helpers below are shared by the configs' `check()` methods.
"""

from __future__ import annotations

import math
import os
import re
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path

from evaluation.errors import HarnessError, OptionError, require

# Draft plus side nodes per step: the attention mask is nodes x (context + nodes), the cache reserves as many slots.
MAX_DRAFT_NODES = 4096
# Token ids: below every vocabulary's size is checked once the model is loaded; this only keeps them plausible.
MAX_TOKEN_ID = 2**31 - 1
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


# ----------------------------------------------------------------------------------------------- check helpers
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


def require_file(option: str, value) -> None:
    ok = isinstance(value, str) and value != "" and _exists(Path(value).expanduser(), "is_file")
    require(ok, option, value, "an existing file")


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


# ----------------------------------------------------------------------------------------------- messages
def describe_type(annotation) -> str:
    """What a schema type allows, in words: `Optional[int]` -> "an integer or null"."""
    if isinstance(annotation, str):
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union:
        rest = [a for a in args if a is not type(None)]
        words = " or ".join(describe_type(a) for a in rest)
        return f"{words} or null" if len(rest) < len(args) else words
    if origin in (list, tuple, typing.List, typing.Tuple):
        inner = describe_type(args[0]) if args else "anything"
        return "a list of " + re.sub(r"^an? ", "", inner) + ("s" if not inner.endswith("s") else "")
    if is_dataclass(annotation):
        return "a group of options"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        annotation, getattr(annotation, "__name__", str(annotation)))


def _field_type(dataclass_type, key: str):
    """The annotation of `key` (`a.b[0]` style paths allowed) in `dataclass_type`; None when unknown."""
    hints = typing.get_type_hints(dataclass_type)
    name = re.split(r"[.\[]", key, maxsplit=1)[0]
    annotation = hints.get(name)
    if annotation is None:
        return None
    if "[" in key and typing.get_origin(annotation) in (list, tuple):  # an element of a list
        return typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is typing.Union:
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if "[" in key and inner and typing.get_origin(inner[0]) in (list, tuple):
            return typing.get_args(inner[0])[0]
    return annotation


def schema_error(group: str, dataclass_type, exc, label: str | None = None) -> HarnessError:
    """One-line error for an OmegaConf type or key error inside `group` (`exc.full_key` relative or absolute)."""
    key = str(getattr(exc, "full_key", "") or getattr(exc, "key", "") or "")
    if key.startswith(group + "."):
        key = key[len(group) + 1:]
    return option_problem(group, dataclass_type, key, getattr(exc, "value", None), label)


def option_problem(group: str, dataclass_type, key: str, value=None, label: str | None = None) -> HarnessError:
    """An unknown option (`key` not in the schema) or a value of the wrong type, as one line."""
    names = ", ".join(f.name for f in fields(dataclass_type)) or "none"
    annotation = _field_type(dataclass_type, key) if key else None
    where = f"{group}.{key}" if key else group
    if annotation is None:
        return HarnessError(f"unknown option {where}{f' for {label}' if label else ''} (options: {names})")
    return OptionError(where, value, describe_type(annotation))


def option_error_from_hydra(exc) -> HarnessError | None:
    """The one-line error for a Hydra composition error about an option's value or name; None for anything else
    (an unknown config group option, a broken YAML), which Hydra reports itself."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    from evaluation.config import config_groups

    cause = exc.__cause__
    if not isinstance(cause, (ValidationError, ConfigKeyError, ConfigAttributeError)):
        return None
    full_key = str(getattr(cause, "full_key", "") or "")
    group = full_key.split(".", 1)[0]
    groups = config_groups()
    if group not in groups or "." not in full_key:
        return None
    return schema_error(group, groups[group], cause)


# ----------------------------------------------------------------------------------------------- the entry point
def check_config(group: str, config) -> None:
    """Run `config.check()` and name the option with its group."""
    check = getattr(config, "check", None)
    if check is None:
        return
    try:
        check()
    except OptionError as exc:
        raise exc.in_group(group) from None


def group_config(group: str, dataclass_type, node):
    """The typed dataclass object of one config group; an option the schema does not know is refused."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    given = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    unknown = [k for k in given if k not in {f.name for f in fields(dataclass_type)}]
    if unknown:
        raise option_problem(group, dataclass_type, unknown[0])
    try:
        merged = OmegaConf.merge(OmegaConf.structured(dataclass_type), given)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise schema_error(group, dataclass_type, exc) from None


def validate(cfg):
    """Check every option of `cfg` (all groups and the method's); return the method's typed options.

    Raises `HarnessError` (an `OptionError` for a value) with a one-line message. Loads no model, writes nothing.
    """
    from evaluation.config import config_groups, method_options
    from evaluation.engine import method_class

    for group, dataclass_type in config_groups().items():
        check_config(group, group_config(group, dataclass_type, cfg.get(group)))
    options = method_options(method_class(cfg.method.name), cfg.method)
    check_config("method", options)
    return options
