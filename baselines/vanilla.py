"""Vanilla greedy decoding: the baseline. It drafts nothing, so each step verifies only the pending token."""

from evaluation.engine.method import Method
from evaluation.engine.registry import register_method


@register_method("vanilla")
class Vanilla(Method):
    """One target forward per token, on the same model, cache and timers as every speculative method."""
