"""Method registry: `@register_method("name")` on the class, `method_class("name")` to look it up."""

from __future__ import annotations

import difflib
import importlib

from evaluation.errors import HarnessError

_METHODS: dict = {}
# Packages whose import registers methods.
METHOD_PACKAGES = ("baselines", "logitspec", "gumiho")


def register_method(name: str):
    def decorate(cls):
        if name in _METHODS and _METHODS[name] is not cls:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        _METHODS[name] = cls
        return cls

    return decorate


def available_methods() -> list[str]:
    for package in METHOD_PACKAGES:
        importlib.import_module(package)
    return sorted(_METHODS)


def method_info(name: str):
    """The class registered under `name`, or None (e.g. a saved run of a method this checkout lacks); tables and
    figures read its `title`, `family`, `table_order`, `colour` and `published_names`."""
    available_methods()
    return _METHODS.get(name)


def method_class(name: str):
    names = available_methods()
    if name not in _METHODS:
        hint = difflib.get_close_matches(name, names, n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise HarnessError(f"unknown method {name!r}{suggestion}; available: {', '.join(names)}")
    return _METHODS[name]
