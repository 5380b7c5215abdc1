"""Vanilla greedy decoding: the baseline. It drafts nothing, so each step verifies only the pending token."""

from evaluation.engine.method import Method
from evaluation.engine.registry import register_method


@register_method("vanilla")
class Vanilla(Method):
    """One target forward per token, on the same model, cache and timers as every speculative method."""

    title, family, table_order, colour = "vanilla", "baseline", 0, "#7f7f7f"
    published_names = ("Vanilla AR",)
