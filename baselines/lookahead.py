"""Lookahead decoding (LADE, docs/methods/lookahead.md): Jacobi iterations on a 2-D window harvest n-grams into a pool.

Every step carries, besides the pending token u:
- the guesses: the pool's (N-1)-token tuples keyed by u, each a chain below u, verified greedily by the engine;
- the lookahead window: N-1 rows ("levels") of tokens at future positions, fed as side nodes. Column j of the
  window is a trajectory u, levels[0][..j-1], levels[1][j], ..., levels[l][j]; the model's argmax at the last level
  is one more Jacobi iterate. After each step the columns' (N)-grams go into the pool and the window shifts one
  column (ALWAYS_FWD_ONE), whatever was accepted.

Upstream feeds the random initial window with the prompt in the prefill forward. With `first_step: prompt_end`
(default) the prefill stops before the last prompt token and the first step feeds that token with the window: the
same window schedule, one forward more. `after_prefill` starts the window below the first generated token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evaluation.engine.method import FIRST_STEPS, DecodeState, Method, StepOutcome
from evaluation.engine.tree import DraftTree, SideNodes
from evaluation.engine.errors import require
from evaluation.engine.options import MAX_DRAFT_NODES, require_int_range

INIT_SEED = 10  # upstream calls random.seed(10) before drawing the initial window


class NgramPool:
    """Key token -> at most `capacity` follower tuples, least recently inserted first (upstream's list)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: dict[int, list[tuple[int, ...]]] = {}

    def insert(self, key: int, followers: tuple[int, ...]) -> None:
        if self.capacity <= 0:
            return
        entry = self.entries.setdefault(key, [])
        if followers in entry:
            entry.remove(followers)  # seen again: it becomes the newest
        elif len(entry) >= self.capacity:
            entry.pop(0)
        entry.append(followers)

    def get(self, key: int) -> list[tuple[int, ...]]:
        return self.entries.get(key, [])


def window_layout(levels: list[list[int]], first_node: int) -> SideNodes:
    """Side nodes for the filled levels (docs/methods/lookahead.md, Side nodes), numbered from `first_node`; node 0 is the pending token.

    levels[0][i] sits at offset 1+i and sees u and levels[0][..i]; levels[l][j] (l >= 1) sits at offset l+j and sees
    u, levels[0][..j-1] and levels[1..l][j].
    """
    tokens: list[int] = []
    offsets: list[int] = []
    sees: list[list[int]] = []
    starts: list[int] = []  # node number of each level's first token
    for l, level in enumerate(levels):
        starts.append(first_node + len(tokens))
        for j, token in enumerate(level):
            tokens.append(token)
            if l == 0:
                offsets.append(1 + j)
                sees.append([0] + [starts[0] + i for i in range(j + 1)])
            else:
                offsets.append(l + j)
                sees.append([0] + [starts[0] + i for i in range(j)] + [starts[m] + j for m in range(1, l + 1)])
    return SideNodes(tokens, offsets, sees)


def advance_window(levels: list[list[int]], win: list[int], levels_total: int) -> list[list[int]]:
    """The window after one step (docs/methods/lookahead.md, Window warm-up and shift).

    `win` is the argmax at every token of the last filled level. While warming up, each level drops its first
    token and a new level is added from `win`; in steady state the rows move up one level and `win` is the last.
    """
    if len(levels) < levels_total:
        new = win if len(levels) == 1 else win[1:]
        return [level[1:] for level in levels] + [new]
    return [levels[1][1:]] + levels[2:] + [win]


def harvest(pool: NgramPool, pending: int, levels: list[list[int]], win: list[int]) -> None:
    """Insert every column's n-gram (docs/methods/lookahead.md, Pool insertion): key at position p+j, then levels[1..][j] and win[j]."""
    for j in range(len(win)):
        key = pending if j == 0 else levels[0][j - 1]
        pool.insert(key, tuple(level[j] for level in levels[1:]) + (win[j],))


def guess_length(level: int, full_match_bonus: bool) -> int:
    return level - 1 if full_match_bonus else level - 2


def step_nodes(level: int, window: int, guess: int, full_match_bonus: bool) -> int:
    """Draft plus side nodes of one step at most: the guesses and the fullest window."""
    n, w = level, window
    # Window size with c filled levels: level 0 has W+N-2-c tokens, the c-1 others one more each.
    window_nodes = max((w + n - 2 - c) + (c - 1) * (w + n - 1 - c) for c in range(1, n))
    return guess * guess_length(level, full_match_bonus) + window_nodes


class Lookahead(Method):
    """Lookahead decoding with N = level, W = window, G = guess (Spec-Bench runs 5/7/7)."""


    @dataclass
    class Config:
        level: int = 5
        window: int = 7
        guess: int = 7
        # Upstream commits only N-1 tokens for a fully matched guess (its bonus is lost); the bonus is exact, keep it.
        full_match_bonus: bool = True
        # Upstream never puts prompt n-grams in the pool (the paper's "prompt as reference" option is absent).
        seed_pool_from_prompt: bool = False
        # prompt_end (upstream): the window is first fed below the last prompt token, as upstream's prefill feeds it
        # with the prompt; after_prefill: below the first generated token, one window step later.
        first_step: str = "prompt_end"

        def check(self) -> None:
            require(self.first_step in FIRST_STEPS, "first_step", self.first_step, f"one of {FIRST_STEPS}")
            require_int_range("level", self.level, 3, 16)
            require_int_range("window", self.window, 1, 256)
            require_int_range("guess", self.guess, 0, 256)
            nodes = step_nodes(self.level, self.window, self.guess, self.full_match_bonus)
            require(nodes <= MAX_DRAFT_NODES, "guess", self.guess,
                    f"at most {MAX_DRAFT_NODES} nodes per step; guess * (level - 1) + window size is {nodes}")

    def __init__(self, config: Config, model):
        super().__init__(config, model)
        config.check()
        self.prefill_stops_short = config.first_step == "prompt_end"
        self.pool = NgramPool(config.guess)
        self.levels: list[list[int]] = []
        self._step: tuple[int, int, int] | None = None  # (pending token, tree nodes, side nodes) of the last draft

    @property
    def guess_length(self) -> int:
        """Tokens per drafted guess chain: N-1, or N-2 when the full-match bonus is cut (see `draft`)."""
        return guess_length(self.config.level, self.config.full_match_bonus)

    @property
    def max_nodes(self) -> int:
        cfg = self.config
        return step_nodes(cfg.level, cfg.window, cfg.guess, cfg.full_match_bonus)

    def reset(self, prompt_ids: list[int], hidden_states=None) -> None:
        cfg = self.config
        # Upstream seeds Python's global random with 10 and draws W+N-3 prompt tokens; a private Random(10) draws
        # the same tokens without touching the global state.
        rng = random.Random(INIT_SEED)
        self.levels = [[rng.choice(prompt_ids) for _ in range(cfg.window + cfg.level - 3)]]
        self.pool = NgramPool(cfg.guess)
        if cfg.seed_pool_from_prompt:
            span = cfg.level - 1
            for i in range(len(prompt_ids) - span):
                self.pool.insert(prompt_ids[i], tuple(prompt_ids[i + 1: i + 1 + span]))
        self._step = None

    def draft(self, state: DecodeState) -> DraftTree:
        pending = state.tokens[-1]
        # A fully matched N-1 chain would commit N tokens; upstream commits N-1. Drafting only the first N-2 tokens
        # of each guess commits exactly upstream's tokens (the N-1th is then the engine's bonus) at less cost; cut
        # tuples that became equal are fed once (the first one wins ties anyway).
        guesses = dict.fromkeys(g[: self.guess_length] for g in self.pool.get(pending))
        tree = DraftTree.star_of_chains([list(g) for g in guesses])
        tree.side = window_layout(self.levels, 1 + len(tree))
        self._step = (pending, 1 + len(tree), len(tree.side.tokens))
        return tree

    def update(self, state: DecodeState, outcome: StepOutcome) -> None:
        if not outcome.drafted:  # the draft budget skipped this step: no window was fed, nothing to harvest
            return
        pending, _, num_side = self._step
        predictions = outcome.side_logits.argmax(dim=-1).tolist()
        assert len(predictions) == num_side
        win = predictions[num_side - len(self.levels[-1]):]  # the argmax at the last filled level
        if len(self.levels) == self.config.level - 1:
            harvest(self.pool, pending, self.levels, win)
        self.levels = advance_window(self.levels, win, self.config.level - 1)
