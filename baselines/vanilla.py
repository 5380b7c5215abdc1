"""Vanilla greedy decoding: the baseline. It drafts nothing, so each step verifies only the pending token."""

from evaluation.engine.method import Method


class Vanilla(Method):
    """One target forward per token, on the same model, cache and timers as every speculative method."""

