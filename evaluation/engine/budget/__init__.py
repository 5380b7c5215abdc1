"""The draft budget: each step keeps only the part of a method's tree that is expected to pay on this machine.

With `run.draft_budget=auto` the loop hands every proposed tree to `DraftBudget.select`, which keeps the subtree
(a node only with its parent) that maximises the run's expected committed tokens per second: each step keeps what
maximises

    (1 + sum of the kept nodes' acceptance probabilities) - R * (c + t(1 + kept nodes + side nodes)),

its expected tokens less what its time would commit at R, the rate the run is expected to commit at (recent
steps), where t(k) is the target's forward time for k new tokens on this model, device, dtype and thread count, c
the rest of the step (this step's drafting, then tree layout, verification, cache and method updates, learned
online), and a node's acceptance probability is the chance that its whole path is accepted. Keeping nothing is
one of the choices. (Maximising each step's own rate, (1 + sum p) / (c + t(...)), is the same choice when R is
that step's best rate, but a run's rate is its total tokens over its total time: a step with likely drafts should
keep more, one with unlikely drafts less.) Before drafting, `wants_draft` also decides whether drafting at all
pays: when the expected rate of the recent drafted steps, their drafting time included, falls below that of a
step that drafts nothing (a method
whose drafting alone costs more than it brings, such as a weak trained draft on a CPU), the step is vanilla's and
the method is not asked, with two drafted steps now and then (further apart while drafting keeps losing, and
far enough apart that they cost at most 1% of the time) to notice when it pays again. A method whose drafted step
costs next to nothing beyond a plain one when the selection keeps nothing (under 1% of a step: cheap drafting
and nothing that cannot be cut) is never skipped: skipping would save nothing and only delay noticing. Neither
changes the greedy output: the bonus token after the last accepted node is the target's own argmax whatever was
drafted, and with sampling the engine's rule keeps the target's distribution for any draft.

The parts, one module each: `latency` (t(k)), `acceptance` (node probabilities), `selection` (the best subtree),
`policy` (`DraftBudget`: when to draft, what to keep, what to learn). The loop sees only the interface below.

- Latency: `LatencyCurve`, measured by a short calibration (`calibrate`, a few seconds) and cached on disk under
  the harness cache dir with its key, or replayed from a file (`run.latency_curve=FILE`, e.g. the
  `forward_latency.csv` that `python -m evaluation.tools.bench_engine` writes on another machine). A measured curve is
  kept honest online from the forward times the loop measures anyway; a replayed one is left as given.
- Acceptance: `AcceptanceModel`, the probability that a node is accepted given that its parent is, from its depth,
  its rank among its siblings and what the method may say about the node: a score (`DraftTree.scores`, in [0, 1],
  e.g. a logit candidate's probability) and a source (`DraftTree.sources`, a small integer naming what drafted it,
  e.g. LogitSpec's retrieval continuation by its n-gram match length), learned online as Beta counts per bucket
  (fading, so they follow a change of question or subtask) from every proposed node, verified or cut: a node's
  path is right when it equals the tokens that end up committed after its pending token, known a few steps later (the
  output does not depend on the draft, so a cut node is judged as surely as a verified one, at every depth). A path's
  probability is the product along it.
- Selection: a child's path probability never exceeds its parent's, so the best subtree of n nodes is the n most
  probable nodes (ties broken by layout order, which puts parents first); one sort and a scan over n finds the
  best n. `tests/test_budget.py` checks this against brute force over all subtrees.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from evaluation.engine.budget.acceptance import AcceptanceModel
from evaluation.engine.budget.latency import (
    CALIBRATION_WIDTHS,
    LatencyCurve,
    calibrate,
    check_curve_table,
    forward_latency,
)
from evaluation.engine.budget.policy import BUDGET_MODES, DraftBudget, RateMeter, make_budget
from evaluation.engine.budget.selection import best_subtree, prune
from evaluation.engine.tree import DraftTree


class Budget(Protocol):
    """What the decode loop asks of a draft budget, step by step (`evaluation.engine.loop.decode_turn`)."""

    latency: LatencyCurve  # its `source` is recorded in the run's manifest

    def wants_draft(self) -> bool:
        """Whether this step drafts at all (False: the step is vanilla's and the method is not asked)."""

    def select(self, tree: DraftTree, position: int = 0, draft_seconds: float = 0.0
               ) -> tuple[DraftTree, np.ndarray | None]:
        """The part of `tree` to verify, and the proposed index of each kept node (None: nothing was cut)."""

    def observe(self, tokens: list[int], drafted: bool, committed: int, step_seconds: float, draft_seconds: float,
                forward_tokens: int, forward_seconds: float) -> None:
        """Learn from the step just taken: what was committed, in how long, and what the forward cost."""

    def end_turn(self, tokens: list[int]) -> None:
        """The turn is over: judge the nodes still waiting for their outcome."""


__all__ = ["AcceptanceModel", "BUDGET_MODES", "Budget", "CALIBRATION_WIDTHS", "DraftBudget", "LatencyCurve",
           "RateMeter", "best_subtree", "calibrate", "check_curve_table", "forward_latency", "make_budget", "prune"]
