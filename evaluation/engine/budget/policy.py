"""The budget itself: whether to draft this step, what to keep of the tree, and what it learns from each step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evaluation.engine.budget.acceptance import AcceptanceModel
from evaluation.engine.budget.latency import LatencyCurve, calibrate
from evaluation.engine.budget.selection import best_subtree, prune
from evaluation.engine.tree import DraftTree

BUDGET_MODES = ("off", "auto")


@dataclass
class RateMeter:
    """Committed tokens and seconds of some of the recent steps, each step fading the older ones by `decay`."""

    decay: float = 0.97
    tokens: float = 0.0
    seconds: float = 0.0

    def fade(self) -> None:
        self.tokens *= self.decay
        self.seconds *= self.decay

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds

    @property
    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None


class DraftBudget:
    """Decides, each step, whether to draft and how much of the proposed tree to verify; learns from every step.

    The loop calls, per step: `wants_draft()`, then, when it drafted, `select(tree, position, draft_seconds)` on
    what the method proposed, then `observe(...)` once the step is over; `end_turn(tokens)` after a turn.
    """

    DOUBLING_CAP = 128  # the gap between two explorations doubles up to this many skipped steps ...
    EXPLORE_SHARE = 0.01  # ... or more, so that explorations cost at most this share of the skipped steps' time
    MAX_EXPLORE_GAP = 1024  # skipped steps between two explorations, at most
    EXPLORE_STEPS = 2  # drafted steps in a row when exploring

    def __init__(self, latency: LatencyCurve, acceptance: AcceptanceModel | None = None):
        self.latency = latency
        self.acceptance = acceptance or AcceptanceModel()
        self.plain = RateMeter()  # steps that did not draft (vanilla's step), measured
        self.expected = RateMeter(decay=0.99)  # every step's expected tokens and seconds: the run's rate, expected
        self.gain: float | None = None  # running mean of drafted steps' expected rate over the plain step's
        self.other_seconds = 0.0  # the part of a step that is neither drafting nor the forward (running mean)
        self._explore_gap = 0  # while drafting does not pay, explore once every this many steps
        self._skipped = 0
        self._exploring = 0  # drafted steps left in the current exploration
        self._explored = False  # whether this step is one of them
        self.exploration_excess: float | None = None  # seconds an exploratory step costs beyond a plain step (mean)
        # What a drafted step costs beyond a plain step even when it keeps nothing (the drafting, side nodes, rows
        # that cannot be cut): running mean. Skipping saves only this, so a method for which it is tiny always drafts.
        self.drafting_floor: float | None = None
        # (position, depth, proposal, sources) awaiting later tokens
        self._unresolved: list[tuple[int, int, tuple, np.ndarray | None]] = []

    # ---- whether to draft at all

    def plain_rate(self) -> float:
        """Committed tokens per second of a step that drafts nothing: measured once such steps ran, else from
        the latency curve and the rest of the step; always from the curve when it is replayed from another
        machine, which the expected rates of drafted steps then describe too."""
        measured = self.plain.rate
        if self.latency.online and measured is not None and self.plain.seconds > 5 * float(self.latency(1)):
            return measured
        return 1.0 / (float(self.latency(1)) + self.other_seconds)

    def wants_draft(self) -> bool:
        """Draft this step? Yes while the recent drafted steps were expected to commit tokens at least as fast as
        a plain step (or nothing is known yet); otherwise no, except a few drafted steps every `_explore_gap`
        steps, a gap that doubles each time drafting still loses and is never shorter than keeps explorations
        under `EXPLORE_SHARE` of the time, so a method whose drafting never pays costs little however slow its
        drafts (a trained draft head's step costs several plain steps on a CPU). Expected rather than realised
        rates: one step commits 1 or 5 tokens by chance, while the acceptance model's expectation, learned from
        every proposed node, is steady after a few steps."""
        self._explored = self._exploring > 0
        if self._exploring:
            self._exploring -= 1
            return True
        if self.gain is None or self.gain >= 1.0 or not self._skipping_saves():
            self._explore_gap = self._skipped = 0
            return True
        self._skipped += 1
        if self._skipped > self._explore_gap:
            self._skipped = 0
            self._explore_gap = min(max(min(2 * self._explore_gap, self.DOUBLING_CAP), 4, self._gap_for_cost()),
                                    self.MAX_EXPLORE_GAP)
            self._exploring = self.EXPLORE_STEPS - 1
            self._explored = True
            return True
        return False

    def _skipping_saves(self) -> bool:
        """Whether a skipped step saves more than `EXPLORE_SHARE` of a plain step. It does not when drafting costs
        next to nothing (PLD, LogitSpec, SAM): then the method drafts every step and the selection keeps nothing
        while nothing pays, so it learns from every proposal and keeps nodes as soon as they pay, instead of
        waiting for the next exploration."""
        if self.drafting_floor is None:
            return True
        return self.drafting_floor > self.EXPLORE_SHARE / self.plain_rate()

    def _note_floor(self, draft_seconds: float, uncut_nodes: int) -> None:
        """Fold one drafted step's cost beyond a plain step when it keeps only what cannot be cut."""
        floor = draft_seconds + float(self.latency(1 + uncut_nodes)) - float(self.latency(1))
        self.drafting_floor = floor if self.drafting_floor is None else (
            self.drafting_floor + 0.1 * (floor - self.drafting_floor))

    def _gap_for_cost(self) -> int:
        """Skipped steps that make one exploration cost `EXPLORE_SHARE` of their time (0 before any exploration)."""
        if self.exploration_excess is None or self.exploration_excess <= 0:
            return 0
        plain_step_seconds = 1.0 / self.plain_rate()
        return math.ceil(self.EXPLORE_STEPS * self.exploration_excess / (self.EXPLORE_SHARE * plain_step_seconds))

    # ---- what to keep

    def select(self, tree: DraftTree, position: int = 0, draft_seconds: float = 0.0
               ) -> tuple[DraftTree, np.ndarray | None]:
        """The kept tree and, when anything was cut, the proposed index of each kept node (node 0 first).
        `position`: the index the first draft token would take in the turn's token list; `draft_seconds`: what
        this step's drafting took (paid whatever is kept, so part of every choice's cost)."""
        side = len(tree.side.tokens) if tree.side is not None else 0  # e.g. Lookahead's window: verified as is
        fixed = draft_seconds + self.other_seconds
        if not tree.tokens:
            self._note_floor(draft_seconds, side)
            self._note_expected(1.0, fixed + float(self.latency(1 + side)))
            return tree, None

        parents = np.asarray([-1] + list(tree.parents), dtype=np.int64)
        depths = np.zeros(len(parents), dtype=np.int64)
        for i in range(1, len(parents)):
            depths[i] = depths[parents[i]] + 1
        scores = np.asarray(tree.scores, dtype=float) if tree.scores is not None else None  # None -> NaN: no score
        sources = np.asarray(tree.sources, dtype=np.int64) if tree.sources is not None else None
        proposal = (parents, depths, scores, np.asarray([-1] + list(tree.tokens), dtype=np.int64))
        self._unresolved.append((position, int(depths.max()), proposal, sources))
        p = self.acceptance.path_probabilities(parents, depths, scores, sources)
        if tree.rows is not None:  # explicit verification rows (Gumiho's FTA) are verified as the method laid them
            # out, never cut; whether drafting them pays is judged on the whole tree
            self._note_floor(draft_seconds, side + len(p))
            self._note_expected(1.0 + p.sum(), fixed + float(self.latency(1 + side + len(p))))
            return tree, None
        self._note_floor(draft_seconds, side)
        kept = best_subtree(p, parents, self.latency, side, fixed, self.run_rate())
        self._note_expected(1.0 + p[kept - 1].sum(), fixed + float(self.latency(1 + side + len(kept))))
        if len(kept) == len(tree.tokens):
            return tree, None
        return prune(tree, kept), np.concatenate([[0], kept])

    def run_rate(self) -> float:
        """The rate the run is expected to commit at (recent steps, fading), a plain step's before any is known.
        Expected rather than realised, like the gain: the selection weighs expected tokens against it."""
        rate = self.expected.rate
        return rate if rate is not None and self.expected.seconds > 5 * float(self.latency(1)) else self.plain_rate()

    def _note_expected(self, tokens: float, seconds: float) -> None:
        """One drafted step's expected tokens and seconds: into the run's rate, and its rate relative to a plain
        step's into the running mean of the gain."""
        self.expected.add(tokens, seconds)
        gain = tokens / seconds / self.plain_rate()
        weight = 0.5 if self._explored else 0.1  # an exploration speaks for the many steps skipped before it
        self.gain = gain if self.gain is None else self.gain + weight * (gain - self.gain)

    # ---- learning

    def observe(self, tokens: list[int], drafted: bool, committed: int, step_seconds: float,
                draft_seconds: float, forward_tokens: int, forward_seconds: float) -> None:
        """Learn from one finished step: `tokens` is the turn's token list with this step's `committed` tokens."""
        if drafted and self._explored:  # what exploring costs: the step's time beyond plain steps committing as much
            # (signed: an exploration that commits several tokens gains time, which offsets one that commits one)
            excess = step_seconds - committed / self.plain_rate()
            self.exploration_excess = excess if self.exploration_excess is None else (
                self.exploration_excess + 0.5 * (excess - self.exploration_excess))
        self.plain.fade()
        self.expected.fade()
        if not drafted:
            self.plain.add(committed, step_seconds)
            self.expected.add(1.0, 1.0 / self.plain_rate())
        other = max(step_seconds - draft_seconds - forward_seconds, 0.0)
        self.other_seconds += 0.05 * (other - self.other_seconds) if self.other_seconds else other
        self.latency.observe(forward_tokens, forward_seconds)
        self._resolve(tokens, final=False)

    def end_turn(self, tokens: list[int]) -> None:
        """The turn is over: judge what is left against the tokens it ended with (deeper nodes stay unknown)."""
        self._resolve(tokens, final=True)

    def _resolve(self, tokens: list[int], final: bool) -> None:
        """Count the proposals whose every node can now be judged (all of them at the end of a turn)."""
        waiting = []
        for position, depth, proposal, sources in self._unresolved:
            if final or position + depth <= len(tokens):
                self.acceptance.observe(*proposal, tokens[position:position + depth], sources)
            else:
                waiting.append((position, depth, proposal, sources))
        self._unresolved = waiting


def make_budget(mode: str, lm, curve_file: str | None, cache_dir: Path, model: str) -> DraftBudget | None:
    """The run's budget: None when off; with `auto`, a replayed curve file or this machine's calibration."""
    if mode == "off":
        return None
    if curve_file:
        return DraftBudget(LatencyCurve.read(curve_file, online=False, model=model))
    return DraftBudget(calibrate(lm, cache_dir))
