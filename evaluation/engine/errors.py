"""The exception types the command line turns into a one-line message (exit status 2, no traceback)."""

from __future__ import annotations


class HarnessError(Exception):
    """A problem with the user's input or set-up, reported as one line without a traceback."""


class OptionError(HarnessError):
    """An option whose value is out of range or inconsistent with another: names the option, the value and
    what is allowed. A config's `check()` raises it with the option's own name; the caller that knows the group
    (`method.`, `bench.`, ...) prefixes it with `in_group`."""

    def __init__(self, option: str, value, allowed: str):
        self.option, self.value, self.allowed = option, value, allowed
        super().__init__(f"bad value for {option}: {value!r} (allowed: {allowed})")

    def in_group(self, group: str) -> "OptionError":
        return OptionError(f"{group}.{self.option}", self.value, self.allowed)


def require(ok: bool, option: str, value, allowed: str) -> None:
    """`require(k >= 1, "num_pred_tokens", k, "an integer >= 1")` inside a config's `check()`."""
    if not ok:
        raise OptionError(option, value, allowed)
