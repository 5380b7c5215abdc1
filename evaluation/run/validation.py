"""Every option is checked before any work: types against the schemas, ranges and relations by each config's
own `check()`, files and folders for existence. A bad option ends the command with one line naming it, its value
and what is allowed (exit status 2), before the model loads and before anything is written under `results/`.

`validate(cfg)` is the one entry point; every command that runs calls it first, and it returns the run's typed
specification (`evaluation.run.spec.RunSpec`). The groups it checks are the dataclass fields of the root `Config`
plus `EXTRA_GROUPS` (see `evaluation.run.config.config_groups`), and the method's own `Config`. The option checks
the configs' `check()` methods share are in `evaluation.engine.options`.
"""

from __future__ import annotations

import re
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path

from evaluation.catalog import (NOT_OPTIONS, MethodDisplay, catalog, import_class, method_display, unknown_method,
                                unknown_name)
from evaluation.engine.errors import HarnessError, OptionError
from evaluation.run.config import config_groups
from evaluation.run.spec import MethodSpec, RunSpec


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


def option_error_from_hydra(exc, overrides: list[str] | None = None) -> HarnessError | None:
    """The one-line error for a Hydra composition error about an option's value or name, or about a config group
    choice that does not exist (with the closest names); None for anything else (a broken YAML), which Hydra
    reports itself. `overrides` (the command line) says which method an unknown `method.<key>` was meant for."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    if isinstance(exc, MissingConfigException):
        return unknown_choice(exc)
    cause = exc.__cause__
    if not isinstance(cause, (ValidationError, ConfigKeyError, ConfigAttributeError)):
        return None
    full_key = str(getattr(cause, "full_key", "") or "")
    group = full_key.split(".", 1)[0]
    if group == "method" and "." in full_key:
        return unknown_method_option(full_key.split(".", 1)[1], cause, overrides or [])
    groups = config_groups()
    if group not in groups or "." not in full_key:
        return None
    return schema_error(group, groups[group], cause)


def unknown_choice(exc) -> HarnessError | None:
    """`method=logitsepc`: the closest config name and the group's choices, instead of Hydra's page of them."""
    missing, choices = str(exc.missing_cfg_file or ""), [str(c) for c in exc.options or []]
    if "/" not in missing or not choices:
        return None
    group, name = missing.rsplit("/", 1)
    return unknown_name(group, name, choices)


def unknown_method_option(key: str, cause, overrides: list[str]) -> HarnessError:
    """`method.<key>=...` that the chosen method's config lacks, a value of the wrong type (Hydra's own `+key` hint
    would only add a key the method then refuses): named with the method's options."""
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("method=")]
    name = chosen[-1] if chosen else "vanilla"  # conf/config.yaml's default
    entry = catalog().get(name)
    if entry is None:
        return HarnessError(f"unknown option method.{key}")
    config = import_class(entry.target, name).Config
    if key.split(".")[0] in {f.name for f in fields(config)}:
        return schema_error("method", config, cause, f"method {name!r}")
    return option_problem("method", config, key, label=f"method {name!r}")


# ----------------------------------------------------------------------------------------------- config files
# Keys under `hydra:` that make Hydra run code as it starts, before any option is checked: callbacks, and the
# factories a logging configuration may name.
CODE_KEYS = ("callbacks", "_target_", "()")


def code_in_config_files(overrides: list[str], conf_dir: Path) -> str | None:
    """What an experiment or local config file named by the command line would run when Hydra starts (its
    `hydra:` block setting callbacks or a factory), as one line; None when nothing. Checked before Hydra starts,
    since its callbacks run before the task: a file is data, and code is run only when the command line says so."""
    import yaml

    folders = [conf_dir]
    for override in overrides:
        if override.startswith("hydra.searchpath="):
            for item in override.split("=", 1)[1].strip("[]").split(","):
                item = item.strip().strip("'\"")
                folders.append(Path(item[len("file://"):] if item.startswith("file://") else item))
    names = [("local", "default")]
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key in ("experiment", "local") and value and value != "null":
            names += [(key, v.strip()) for v in value.split(",")]
    for folder in folders:
        for group, name in names:
            path = folder / group / f"{name}.yaml"
            try:
                config = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
            except (OSError, yaml.YAMLError):
                continue  # Hydra reports a file it cannot read
            block = config.get("hydra") if isinstance(config, dict) else None
            found = _code_keys(block, "hydra") if isinstance(block, dict) else []
            if found:
                return (f"{path}: {found[0]} runs code when Hydra starts, and a config file may not set it (give it "
                        f"on the command line if you mean it)")
    return None


def _code_keys(node, where: str) -> list[str]:
    if isinstance(node, dict):
        found = [f"{where}.{key}" for key in node if key in CODE_KEYS and node[key] not in (None, {}, [])]
        return found + [k for key, value in node.items() for k in _code_keys(value, f"{where}.{key}")]
    if isinstance(node, list):
        return [k for i, value in enumerate(node) for k in _code_keys(value, f"{where}[{i}]")]
    return []


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


def method_options(method_cls, method_cfg, name: str):
    """The method's options from its YAML, checked against the method's `Config` dataclass (types only; the
    caller runs its `check()`)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    given = {k: v for k, v in OmegaConf.to_container(method_cfg, resolve=True).items() if k not in NOT_OPTIONS}
    known = {f.name for f in fields(method_cls.Config)}
    label = f"method {name!r}"
    for key in given:
        if key not in known:
            raise option_problem("method", method_cls.Config, key, label=label)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(method_cls.Config), given)
    except OmegaConfBaseException as exc:
        raise schema_error("method", method_cls.Config, exc, label) from None
    return OmegaConf.to_object(merged)


def method_spec(method_cfg) -> MethodSpec:
    """The method a config names: its class (`_target_`, else the catalog's entry of that name), its options
    checked against the class's `Config`, and how it shows (its `display`, else the catalog's)."""
    from omegaconf import OmegaConf

    name = method_cfg.get("name")
    if not name:
        raise HarnessError("method: the config names no method (give method=<name>)")
    target = method_cfg.get("_target_")
    if target is not None:
        cls = import_class(str(target), name)
    elif name in catalog():
        cls = import_class(catalog()[name].target, name)
    else:
        raise unknown_method(name)
    from evaluation.engine.method import Method

    if not issubclass(cls, Method):
        raise HarnessError(f"method {name!r}: _target_ {cls.__module__}.{cls.__qualname__} is not a decoding method "
                           f"(a subclass of evaluation.engine.method.Method)")
    display = method_cfg.get("display")
    display = MethodDisplay.from_config(name, OmegaConf.to_container(display, resolve=True)) if display is not None \
        else method_display(name)
    options = method_options(cls, method_cfg, name)
    check_config("method", options)
    return MethodSpec(name=name, cls=cls, options=options, display=display)


def validate(cfg) -> RunSpec:
    """Check every option of `cfg` (all groups and the method's) and return the run's specification.

    Raises `HarnessError` (an `OptionError` for a value) with a one-line message. Loads no model, writes nothing.
    """
    groups = {group: group_config(group, dataclass_type, cfg.get(group))
              for group, dataclass_type in config_groups().items()}
    for group, config in groups.items():
        check_config(group, config)
    method = method_spec(cfg.method)
    return RunSpec(config=cfg, model=groups["model"], bench=groups["bench"], run=groups["run"],
                   paths=groups["paths"], method=method)
