"""The methods, found through their configs: each `conf/method/<name>.yaml` that names a class with `_target_`
(Hydra's convention) defines a method, and its `display` block says how the method shows in tables and figures.

A new method is one module with its class and one YAML file; nothing else lists methods. Reading the catalog
imports no method and no torch (the report runs where neither is installed); `method_class` imports the one
class asked for. Variant files (`gumiho-fta.yaml`: `defaults: [gumiho]` and other option values) define no
method of their own.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from evaluation.engine.errors import HarnessError

METHOD_CONF = Path(__file__).resolve().parent.parent / "conf" / "method"
# Method families, in table order.
FAMILIES = ("baseline", "retrieval", "training-free", "draft model", "trained draft", "other")
# Keys of a method's YAML that are not options of its class.
NOT_OPTIONS = ("_target_", "name", "display", "defaults")


@dataclass(frozen=True)
class MethodDisplay:
    """How a method shows: its title, its family (groups rows), its row order, colour and published names."""

    name: str
    title: str = ""
    family: str = "other"
    order: int = 100  # rows sort by this, then by name: vanilla 0, then each family in turn
    colour: str = ""  # a matplotlib colour, the same in every figure ("": one from a spare palette)
    published_names: tuple[str, ...] = field(default_factory=tuple)  # its names in published tables (e.g. "PLD")

    @classmethod
    def from_config(cls, name: str, display) -> "MethodDisplay":
        """From a config's `display` block (a dict, or None for a method that says nothing of itself)."""
        display = dict(display or {})
        unknown = sorted(set(display) - {"title", "family", "order", "colour", "published_names"})
        if unknown:
            raise HarnessError(f"method {name!r}: unknown display key {unknown[0]!r} "
                               "(keys: title, family, order, colour, published_names)")
        family = display.get("family", "other")
        if family not in FAMILIES:
            raise HarnessError(f"method {name!r}: display.family {family!r} is not one of {', '.join(FAMILIES)}")
        return cls(name=name, title=str(display.get("title") or name), family=family,
                   order=int(display.get("order", 100)), colour=str(display.get("colour") or ""),
                   published_names=tuple(display.get("published_names") or ()))


@dataclass(frozen=True)
class MethodEntry:
    """One method of the catalog: its name, the class its config names and how it shows."""

    name: str
    target: str
    display: MethodDisplay
    config_file: Path


@functools.lru_cache(maxsize=4)
def _catalog(folder: Path) -> dict[str, MethodEntry]:
    entries: dict[str, MethodEntry] = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            node = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise HarnessError(f"{path}: not a readable YAML file ({' '.join(str(exc).split())[:200]})") from None
        if not isinstance(node, dict) or "_target_" not in node:
            continue
        name = node.get("name") or path.stem
        if name in entries:
            raise HarnessError(f"method {name!r} is defined twice: {entries[name].config_file} and {path}")
        entries[name] = MethodEntry(name, str(node["_target_"]), MethodDisplay.from_config(name, node.get("display")),
                                    path)
    return entries


def catalog(folder: Path | None = None) -> dict[str, MethodEntry]:
    """Every method of `conf/method` (or `folder`), by name."""
    return _catalog(Path(folder or METHOD_CONF).resolve())


def available_methods() -> list[str]:
    return sorted(catalog())


# Displays read from saved runs' manifests (`remember_display`): a run carries how its method shows, so a report
# shows it so even where this checkout's `conf/method` lacks the method.
_SAVED_DISPLAYS: dict[str, MethodDisplay] = {}


def remember_display(name: str, saved: dict | None) -> None:
    """Note how a saved run says its method `name` shows (the manifest's `method_display`; None: it says nothing)."""
    if saved:
        _SAVED_DISPLAYS[name] = MethodDisplay.from_config(name, saved)


def method_display(name: str) -> MethodDisplay:
    """How `name` shows: as its config says, else as a saved run said (`remember_display`); a method neither
    knows shows under its own name."""
    entry = catalog().get(name)
    if entry is not None:
        return entry.display
    return _SAVED_DISPLAYS.get(name) or MethodDisplay(name=name, title=name)


def import_class(target: str, name: str = ""):
    """The class a `_target_` names (`package.module.Class`), imported; one line when it cannot be."""
    module_name, _, class_name = target.rpartition(".")
    label = f"method {name!r}: " if name else ""
    try:
        cls = getattr(importlib.import_module(module_name), class_name) if module_name else None
    except ImportError as exc:
        raise HarnessError(f"{label}_target_ {target!r} cannot be imported ({exc})") from None
    except AttributeError:
        cls = None
    if not isinstance(cls, type):
        raise HarnessError(f"{label}_target_ {target!r} names no class")
    return cls


def unknown_name(kind: str, name: str, choices: list[str]) -> HarnessError:
    """`unknown method 'logitsepc' (did you mean 'logitspec'?); available: ...`: one line, the closest name first."""
    hint = difflib.get_close_matches(name, choices, n=1)
    suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
    return HarnessError(f"unknown {kind} {name!r}{suggestion}; available: {', '.join(choices)}")


def unknown_method(name: str) -> HarnessError:
    return unknown_name("method", name, available_methods())


def method_class(name: str):
    """The class of the method `name` of `conf/method` (for tools and tests that build a method by name)."""
    entry = catalog().get(name)
    if entry is None:
        raise unknown_method(name)
    return import_class(entry.target, name)


def model_name(model: str) -> str:
    """The `name` of `conf/model/<model>.yaml`, through a short name's `defaults` (vicuna-7b -> vicuna-7b-v1.3)."""
    path = METHOD_CONF.parent / "model" / f"{model}.yaml"
    node = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    if not isinstance(node, dict):
        return model
    if "name" in node:
        return str(node["name"])
    included = [d for d in node.get("defaults") or [] if isinstance(d, str) and d != "_self_"]
    return model_name(included[0]) if included else model


def config_method(config_name: str) -> MethodEntry:
    """The method a config file of `conf/method` defines or varies (a variant names its method in `defaults`)."""
    by_file = {entry.config_file.stem: entry for entry in catalog().values()}
    seen = []
    while config_name not in by_file:
        path = METHOD_CONF / f"{config_name}.yaml"
        node = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
        parents = [d for d in (node or {}).get("defaults") or [] if isinstance(d, str) and d != "_self_"]
        if not parents or config_name in seen:
            raise HarnessError(f"conf/method/{config_name}.yaml defines no method and varies none")
        seen.append(config_name)
        config_name = parents[0]
    return by_file[config_name]


def bench_settings(model: str) -> list[str]:
    """The method configs a bench runs for `model` (file names of `conf/method`, variants included), vanilla first."""
    return bench_plan(model)[0]


def bench_plan(model: str) -> tuple[list[str], dict[str, str]]:
    """The method configs a bench runs for `model`, vanilla first, and those it leaves out with why (one clause
    each). A method joins when its class's `unavailable_reason` has nothing against it with its defaults (a trained
    method: a draft committed for the model or a checkpoint released for it, conf/checkpoints.yaml; SpS: a draft
    model paired with the target); the only place this imports method classes."""
    names = sorted(path.stem for path in METHOD_CONF.glob("*.yaml"))
    name = model_name(model)
    kept, left_out = [], {}
    for config_name in names:
        entry = config_method(config_name)
        if config_name == "vanilla":
            continue
        reason = import_class(entry.target, entry.name).unavailable_reason(name)
        if reason is None:
            kept.append(config_name)
        else:
            left_out[config_name] = reason
    return ["vanilla", *kept], left_out


if __name__ == "__main__":  # `python -m evaluation.catalog bench-settings MODEL`: what `make bench` runs
    import sys

    if sys.argv[1:2] != ["bench-settings"] or len(sys.argv) != 3:
        sys.exit("usage: python -m evaluation.catalog bench-settings MODEL")
    try:
        settings, left_out = bench_plan(sys.argv[2])
    except HarnessError as exc:
        sys.exit(f"error: {exc}")
    for config_name, reason in left_out.items():  # on stderr: make reads the list from stdout
        print(f"leaves out {config_name}: {reason}", file=sys.stderr)
    print(",".join(settings))
