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

- Latency: `LatencyCurve`, measured by a short calibration (`calibrate`, a few seconds) and cached on disk under
  the harness cache dir with its key, or replayed from a file (`run.latency_curve=FILE`, e.g. the
  `forward_latency.csv` that `python -m evaluation.bench_engine` writes on another machine). A measured curve is
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

import hashlib
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from evaluation.engine.kv_cache import cache_argument, cache_for
from evaluation.engine.tree import DraftTree, SideNodes, build_tree_inputs
from evaluation.errors import HarnessError

BUDGET_MODES = ("off", "auto")
CALIBRATION_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


# ---------------------------------------------------------------- latency


def forward_latency(lm, context: list[int], widths, repeats: int, warmups: int = 2) -> pd.DataFrame:
    """Median forward time of k new tokens (a chain) over `context`, for each k in `widths`."""
    rows = []
    cache = cache_for(lm.model, len(context) + max(widths) + 1)
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        prefill = build_tree_inputs(context[0], DraftTree.chain(context[1:]), 0, lm.dtype, lm.device)
        lm.model(input_ids=prefill.input_ids, position_ids=prefill.position_ids,
                 attention_mask=prefill.attention_mask, **cache_argument(lm.model, cache), use_cache=True)
        base = cache.length
        for k in widths:
            chain = [context[i % len(context)] for i in range(k - 1)]
            inputs = build_tree_inputs(context[-1], DraftTree.chain(chain), base, lm.dtype, lm.device)
            times = []
            for i in range(repeats + warmups):
                cache.crop(base)
                sync()
                t0 = time.perf_counter()
                lm.model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                         attention_mask=inputs.attention_mask, **cache_argument(lm.model, cache),
                         use_cache=True)
                sync()
                if i >= warmups:
                    times.append(time.perf_counter() - t0)
            rows.append({"new_tokens": k, "context": base, "median_ms": 1000 * statistics.median(times),
                         "min_ms": 1000 * min(times)})
    table = pd.DataFrame(rows)
    table["vs_one_token"] = table.median_ms / table.median_ms.iloc[0]
    table["best_case_speedup"] = table.new_tokens / table.vs_one_token
    return table


@dataclass
class LatencyCurve:
    """t(k): seconds of one target forward over k new tokens, interpolated linearly between measured k."""

    new_tokens: np.ndarray  # increasing, starting at 1
    seconds: np.ndarray
    source: str = ""  # where it came from: "calibrated <file>" or "replayed <file>"
    online: bool = True  # correct it from observed forward times (not for a curve replayed from elsewhere)
    speed: float = 1.0  # how much slower the whole machine runs now than when the curve was measured (online)

    def __post_init__(self):
        self.new_tokens = np.asarray(self.new_tokens, dtype=float)
        self.seconds = np.asarray(self.seconds, dtype=float)  # as measured: a width can cost less than a narrower one
        self._log_k = np.log2(self.new_tokens)

    def __call__(self, k) -> np.ndarray:
        """Forward seconds for k new tokens (k may be an array); beyond the last point the last slope goes on."""
        k = np.asarray(k, dtype=float)
        t = np.interp(k, self.new_tokens, self.seconds)
        if len(self.new_tokens) > 1:
            slope = (self.seconds[-1] - self.seconds[-2]) / (self.new_tokens[-1] - self.new_tokens[-2])
            t = np.where(k > self.new_tokens[-1], self.seconds[-1] + slope * (k - self.new_tokens[-1]), t)
        return t * self.speed

    def observe(self, k: int, seconds: float, weight: float = 0.05) -> None:
        """Move the curve toward what this forward of k new tokens took: first the whole curve (a machine that
        slows down, a shared VM, a CPU that heats up, slows every width alike, and a method verifies only some
        widths, so the rest, k = 1 included, would otherwise keep the speed of the calibration), then the measured
        point nearest to k (in log k) by what is left, the curve's own error at this width."""
        if not self.online or seconds <= 0:
            return
        def step_toward() -> float:  # one outlier moves the curve little
            return (1 - weight) + weight * min(max(seconds / float(self(k)), 0.25), 4.0)

        self.speed *= step_toward()
        self.seconds[int(np.argmin(np.abs(self._log_k - np.log2(k))))] *= step_toward()  # measured after the speed

    @classmethod
    def from_table(cls, table: pd.DataFrame, source: str, online: bool) -> "LatencyCurve":
        table = table.sort_values("new_tokens")
        return cls(table.new_tokens.to_numpy(), table.median_ms.to_numpy() / 1000, source, online)

    @classmethod
    def read(cls, path: str | Path, online: bool = False, model: str | None = None) -> "LatencyCurve":
        """A curve file: CSV with columns new_tokens and median_ms (what bench_engine writes), k = 1 included."""
        path = Path(path)
        try:
            table = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            raise HarnessError(f"latency curve {path}: cannot be read ({str(exc).splitlines()[0]})") from None
        problem = check_curve_table(table)
        if problem:
            raise HarnessError(f"latency curve {path}: {problem}")
        if model is not None and "model" in table and str(table.model.iloc[0]) != model:
            raise HarnessError(f"latency curve {path} was measured on model {table.model.iloc[0]!r}, not {model!r}")
        return cls.from_table(table, f"replayed {path}", online)


def check_curve_table(table: pd.DataFrame) -> str:
    """What is wrong with a latency-curve table, or "" when it can be used."""
    missing = {"new_tokens", "median_ms"} - set(table.columns)
    if missing:
        return f"missing columns {sorted(missing)} (needs new_tokens and median_ms)"
    k = pd.to_numeric(table.new_tokens, errors="coerce")
    t = pd.to_numeric(table.median_ms, errors="coerce")
    if k.isna().any() or t.isna().any():
        return "new_tokens and median_ms must be numbers"
    if 1 not in set(k) or (k < 1).any() or not k.is_unique or (t <= 0).any():
        return "needs k = 1, distinct k >= 1 and positive times"
    return ""


def calibration_key(lm) -> str:
    """What the forward time depends on: model, device, dtype, threads and library versions."""
    from evaluation.runner import environment  # the same device and library description the manifests carry

    env = environment(lm)
    key = {"model": lm.source, "dtype": str(lm.dtype), "device": lm.device.type,
           "device_name": env.get("gpu") or env.get("cpu"), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "widths": CALIBRATION_WIDTHS}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def calibrate(lm, cache_dir: Path, repeats: int = 3, context_tokens: int = 256) -> LatencyCurve:
    """The cached curve for this model and machine, or a fresh measurement (a few seconds) written to the cache."""
    path = Path(cache_dir) / "latency" / f"{calibration_key(lm)}.csv"
    if path.is_file():
        table = pd.read_csv(path)
        if not check_curve_table(table):
            return LatencyCurve.from_table(table, f"calibrated {path} (cached)", online=True)
    context = [int(t) % lm.model.config.vocab_size for t in range(1000, 1000 + context_tokens)]
    table = forward_latency(lm, context, CALIBRATION_WIDTHS, repeats)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    table.to_csv(partial, index=False)
    partial.replace(path)
    return LatencyCurve.from_table(table, f"calibrated {path}", online=True)


# ---------------------------------------------------------------- acceptance


@dataclass
class AcceptanceModel:
    """P(node accepted | parent accepted) per (depth, sibling rank, score, source) bucket, as Beta(accepted,
    rejected) counts; the prior says a first child at depth 1 is accepted half the time, less for later siblings
    and deeper nodes, whatever its score and source, and weighs as `prior_strength` observations."""

    max_depth: int = 8
    max_rank: int = 4
    score_buckets: int = 5  # bucket 0: no score; 1..4: score quartiles in [0, 1]
    max_sources: int = 12  # sources 0..max_sources-1 (larger ones share the last); 0 when the method names none
    prior_strength: float = 2.0
    memory: float = 0.98  # per observation of a bucket: its counts weigh about the last 1 / (1 - memory) = 50 steps
    accepted: np.ndarray = field(init=False)
    tested: np.ndarray = field(init=False)

    def __post_init__(self):
        depth = np.arange(1, self.max_depth + 1)[:, None, None, None]
        rank = np.arange(self.max_rank)[None, :, None, None]
        prior = 0.5 * 0.8 ** (depth - 1) / (1 + rank) * np.ones((1, 1, self.score_buckets, self.max_sources))
        self.accepted = prior * self.prior_strength
        self.tested = np.full_like(self.accepted, self.prior_strength)

    def buckets(self, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray | None,
                sources: np.ndarray | None = None) -> tuple:
        """Bucket indices of draft nodes 1..T-1 (node 0, the pending token, has none); a score that is NaN (a node
        the method gives no score) falls in bucket 0 as when there are no scores."""
        n = len(parents)
        ranks = np.zeros(n, dtype=np.int64)
        children = np.zeros(n, dtype=np.int64)
        for i in range(1, n):  # layout order among the children of one parent
            ranks[i] = children[parents[i]]
            children[parents[i]] += 1
        d = np.minimum(depths[1:], self.max_depth) - 1
        r = np.minimum(ranks[1:], self.max_rank - 1)
        if scores is None:
            s = np.zeros(n - 1, dtype=np.int64)
        else:
            scored = ~np.isnan(scores)
            s = np.where(scored, 1 + np.minimum((np.clip(np.nan_to_num(scores), 0.0, 1.0) * (self.score_buckets - 1))
                                                .astype(np.int64), self.score_buckets - 2), 0)
        c = np.zeros(n - 1, dtype=np.int64) if sources is None else np.clip(sources, 0, self.max_sources - 1)
        return d, r, s, c

    def path_probabilities(self, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray | None,
                           sources: np.ndarray | None = None) -> np.ndarray:
        """P(the path to node i is accepted) for draft nodes 1..T-1: products of the conditional estimates."""
        bucket = self.buckets(parents, depths, scores, sources)
        conditional = self.accepted[bucket] / self.tested[bucket]
        p = np.ones(len(parents))
        for i in range(1, len(parents)):  # parents precede children
            p[i] = p[parents[i]] * conditional[i - 1]
        return p[1:]

    def observe(self, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray | None, tokens: np.ndarray,
                committed: list[int], sources: np.ndarray | None = None) -> None:
        """Count, for every proposed node whose outcome `committed` reveals, whether its path was right.

        `committed` is what the turn went on with after the proposal's pending token. Greedy output does not
        depend on the draft, so it says it for every proposed node, verified or cut by the budget: the node at
        depth d is right when its parent is and its token is committed[d-1] (with sampling, the committed tokens
        follow the target's distribution, so the count still estimates the acceptance probability). Learning from
        cut nodes too means that a tree cut to nothing still teaches the model, so an estimate that has fallen
        too low can recover. Nodes below depth len(committed) stay unknown and are not counted.
        """
        n = len(parents)
        if n < 2:
            return
        right = np.zeros(n, dtype=bool)
        tested = np.zeros(n, dtype=bool)
        right[0] = True
        for i in range(1, n):  # parents precede children
            d = depths[i]
            if right[parents[i]] and d <= len(committed):
                tested[i] = True
                right[i] = tokens[i] == committed[d - 1]
        bucket = self.buckets(parents, depths, scores, sources)
        t = tested[1:]
        # Forget slowly: each bucket a proposal speaks for first fades by `memory`, so a question or subtask where
        # drafts are right less often (Token Recycling's template after a repetitive answer) is believed within a
        # few dozen steps, not after as many steps as came before it.
        touched = tuple(np.unique(np.stack([index[t] for index in bucket]), axis=1))
        self.tested[touched] *= self.memory
        self.accepted[touched] *= self.memory
        np.add.at(self.tested, tuple(index[t] for index in bucket), 1.0)
        hit = t & right[1:]
        np.add.at(self.accepted, tuple(index[hit] for index in bucket), 1.0)


# ---------------------------------------------------------------- selection


def best_subtree(probabilities: np.ndarray, parents: np.ndarray, latency, side_nodes: int = 0,
                 fixed_seconds: float = 0.0, run_rate: float | None = None) -> np.ndarray:
    """Draft nodes (1-based tree indices, increasing) of the subtree that maximises expected committed tokens per
    second, (1 + sum p) / (fixed_seconds + t(1 + n + side_nodes)); empty when keeping nothing is best.

    With `run_rate` (tokens per second the run commits), the subtree that maximises the run's rate instead: a
    run's rate is its total tokens over its total time, not the mean of its steps' rates, and a step adds to it
    most when it maximises expected tokens minus the time it takes at the run's rate,
    (1 + sum p) - run_rate * (fixed_seconds + t(1 + n + side_nodes)) (Dinkelbach: at the best rate both agree).
    So a step whose drafts are likely keeps more than its own best rate would, and one whose drafts are not keeps
    less, instead of every step aiming at the same rate.

    `probabilities[i-1]` is the path probability of draft node i and never exceeds its parent's, so the best
    subtree of n nodes holds the n most probable nodes; ties go to the earlier node, which keeps parents first.
    """
    n = len(probabilities)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(-probabilities, kind="stable")
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(probabilities[order])])
    seconds = fixed_seconds + latency(1 + side_nodes + np.arange(n + 1))
    value = expected / seconds if run_rate is None else expected - run_rate * seconds
    best = int(np.argmax(value))  # the first maximum: the smallest tree among equals
    kept = np.sort(order[:best]) + 1
    keep = np.zeros(n + 1, dtype=bool)
    keep[kept] = True
    for i in kept[::-1]:  # a node only with its parent (holds by construction; kept for safety under ties)
        keep[parents[i]] = True
    return np.flatnonzero(keep[1:]) + 1


def prune(tree: DraftTree, kept: np.ndarray) -> DraftTree:
    """The tree restricted to the draft nodes `kept` (1-based, increasing, closed under parents), renumbered;
    side nodes stay, their references to tree nodes renumbered."""
    old_size = 1 + len(tree.tokens)
    new_index = np.full(old_size, -1, dtype=np.int64)
    new_index[0] = 0
    new_index[kept] = np.arange(1, len(kept) + 1)
    tokens = [tree.tokens[i - 1] for i in kept]
    parents = [int(new_index[tree.parents[i - 1]]) for i in kept]
    scores = [tree.scores[i - 1] for i in kept] if tree.scores is not None else None
    sources = [tree.sources[i - 1] for i in kept] if tree.sources is not None else None
    side = None
    if tree.side is not None:
        shift = old_size - (1 + len(kept))

        def renumber(j: int) -> int | None:
            return j - shift if j >= old_size else (int(new_index[j]) if new_index[j] >= 0 else None)

        sees = [[r for r in map(renumber, seen) if r is not None] for seen in tree.side.sees]
        side = SideNodes(list(tree.side.tokens), list(tree.side.offsets), sees)
    return DraftTree(tokens=tokens, parents=parents, side=side, scores=scores, sources=sources)


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
