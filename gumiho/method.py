"""Gumiho and EAGLE-2 on the shared engine (docs/methods/gumiho.md): a trained draft reads the target's hidden states.

Each step (`draft`):
  1. the draft's context is extended with the pairs (target hidden state h_j, token x_{j+1}) not yet in its own
     KV cache: the whole prompt at the first step, then the nodes accepted by the last verification;
  2. level 1 is the top-k of the draft's prediction at the last pair; then serial levels run the two decoder
     layers on the beams (Gumiho: depth - mlp_num of them, EAGLE-2: depth);
  3. Gumiho only: the MLP heads read the last two serial (feature, token) pairs of every beam and give depths
     3..7 at once, expanded by beam search with pruning;
  4. the `total_tokens - 1` best nodes by cumulative log-probability become the `DraftTree` (gumiho/tree.py);
     the engine verifies it greedily. With `fta` the verification rows are padded as docs/methods/gumiho.md, Full Tree Attention, describes (not exact).
The draft's rows for the tree are written after its context in its own cache and cropped away afterwards.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from evaluation.engine.kv_cache import PositionalKVCache
from evaluation.engine.method import DecodeState, Method, StepOutcome
from evaluation.engine.tree import DraftTree
from evaluation.engine.errors import HarnessError, require
from evaluation.engine.options import MAX_DRAFT_NODES, require_int_range
from gumiho.draft_model import SERIAL_LAYERS, GumihoDraft
from gumiho.tree import ROOT, Pool, expand, fta_rows, layout, root_paths, select_nodes

# The draft part of the engine's breakdown, split: the serial decoder layers (the draft's context and the serial
# levels), the parallel MLP heads (Gumiho only), and choosing and laying out the tree.
DRAFT_PARTS = ("serial", "mlp", "select")
DRAFTS_DIR = Path(__file__).resolve().parent / "drafts"
SIBLING_MASKS = ("causal", "tree")
MLP_FIRST_SLOTS = ("index", "parent")


def committed_draft_dir(model_name: str) -> Path:
    return DRAFTS_DIR / model_name


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def check_draft_source(draft: Optional[str], seed: int) -> None:
    """`draft` is null, `random`, an existing folder, or a hub id (owner/name); the seed fits torch's."""
    ok = draft is None or draft == "random" or (
        isinstance(draft, str) and 0 < len(draft) <= 4096
        and (_is_dir(draft) or (HUB_ID.fullmatch(draft) is not None and not draft.startswith((".", "/")))))
    require(ok, "draft", draft, "null (the committed draft), random, an existing folder or a hub id owner/name")
    require_int_range("seed", seed, 0, 2**63 - 1)


def _is_dir(path: str) -> bool:
    try:
        return Path(path).expanduser().is_dir()
    except OSError:  # e.g. a name too long for the file system
        return False


def build_draft(source: Optional[str], lm, seed: int) -> GumihoDraft:
    """`None`: the committed draft for this model; `random`: a seeded random draft; else a folder or hub id."""
    from gumiho.checkpoint import load_draft

    if source == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            draft = GumihoDraft.for_target(lm.model)
        return draft.to(device=lm.device, dtype=lm.dtype).eval()
    if source is None:
        folder = committed_draft_dir(lm.name)
        if not folder.is_dir():
            raise HarnessError(f"no committed draft for model {lm.name!r} ({folder} is missing): train one with "
                               f"`make train-gumiho MODEL={lm.name}`, or set method.draft=random or a checkpoint")
        source = str(folder)
    return load_draft(source, lm.model)


@dataclass
class _Beams:
    """The open beams of the level being expanded: what each feeds the draft next and where it sits."""

    features: torch.Tensor  # [B, H] feature of the pair each beam feeds
    tokens: torch.Tensor  # [B] token of that pair (the beam's own token)
    scores: torch.Tensor  # [B] cumulative log-probability
    pool_index: list[int]  # the beam's node in the pool
    rows: list[list[int]]  # draft-cache rows (relative to the context) of the beam's ancestors


class _TreeDraftMethod(Method):
    """The machinery Gumiho and EAGLE-2 share: the draft's context cache, the serial levels, the selection."""

    needs_hidden_states = True

    @classmethod
    def input_files(cls, config, model_name: str) -> dict[str, Path]:
        """The draft's folder (the committed one when `draft` is null); a seeded random draft or a hub id has none
        here (a hub id is named in the options)."""
        if config.draft is None:
            folder = committed_draft_dir(model_name)
        elif config.draft != "random" and _is_dir(config.draft):
            folder = Path(config.draft).expanduser()
        else:
            return {}
        return {"draft": folder} if folder.is_dir() else {}

    def __init__(self, config, model):
        super().__init__(config, model)
        self.lm = model
        self.draft_model = build_draft(config.draft, model, config.seed)
        self.serial_steps = self._serial_steps()
        capacity = int(model.max_context) + 1 + config.top_k * self.serial_steps
        self.cache = PositionalKVCache(SERIAL_LAYERS, capacity)
        self.pending: torch.Tensor | None = None  # target hidden states not yet in the draft's context
        self.detail = dict.fromkeys(DRAFT_PARTS, 0.0)
        self._last_lap = 0.0

    def _serial_steps(self) -> int:
        raise NotImplementedError

    @property
    def max_nodes(self) -> int:
        return self.config.total_tokens - 1

    # ------------------------------------------------------------------------------------------ state
    def reset(self, prompt_ids: list[int], hidden_states: torch.Tensor | None = None) -> None:
        if hidden_states is None:
            raise RuntimeError(f"{self.name} needs the prompt's hidden states from the engine")
        self.cache.crop(0)
        self.pending = hidden_states
        self.detail = dict.fromkeys(DRAFT_PARTS, 0.0)

    def draft_detail(self) -> dict[str, float]:
        return dict(self.detail)

    def _lap(self, part: str | None) -> None:
        """Charge the time since the last lap to `part` of the draft (None: just start timing)."""
        if self.lm.device.type == "cuda":  # kernels are asynchronous: charge them to the part that launched them
            torch.cuda.synchronize(self.lm.device)
        now = time.perf_counter()
        if part is not None:
            self.detail[part] += now - self._last_lap
        self._last_lap = now

    def update(self, state: DecodeState, outcome: StepOutcome) -> None:
        accepted = outcome.hidden_states[outcome.verdict.path]
        # After a step the draft budget did not draft, the previous step's pairs are still waiting: keep both.
        self.pending = accepted if self.pending is None else torch.cat([self.pending, accepted])

    # ------------------------------------------------------------------------------------------ draft
    def _mask(self, visible_rows: list[list[int]], context: int, dtype) -> torch.Tensor:
        """Additive mask [1, 1, Q, context + cache rows]: every query sees the context and its listed rows."""
        width = self.cache.length + len(visible_rows)
        allowed = torch.zeros(len(visible_rows), width, dtype=torch.bool)
        allowed[:, :context] = True
        for q, rows in enumerate(visible_rows):
            allowed[q, [context + r for r in rows]] = True
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask.to(self.lm.device)[None, None]

    def _log_probs(self, features: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.draft_model.head(features).float(), dim=-1)

    def _extend_context(self, tokens: list[int]) -> torch.Tensor:
        """Feed the pending (h_j, x_{j+1}) pairs; return the draft's output at the last one."""
        draft, device = self.draft_model, self.lm.device
        start, hidden = self.cache.length, self.pending.to(self.lm.dtype)
        n = hidden.shape[0]
        if start + n != len(tokens) - 1:
            raise RuntimeError(f"draft context out of step: {start} + {n} pairs for {len(tokens)} tokens")
        next_tokens = torch.tensor([tokens[start + 1: start + n + 1]], device=device)
        x = draft.pair_input(next_tokens, hidden[None])
        causal = torch.full((n, start + n), torch.finfo(x.dtype).min, dtype=x.dtype).triu_(start + 1)
        positions = torch.arange(start, start + n, device=device)[None]
        out = draft.serial(x, positions, causal.to(device)[None, None], self.cache)
        self.pending = None
        return out[0, -1]

    def _serial_level(self, beams: _Beams, context: int, level: int, sibling_causal: bool) -> torch.Tensor:
        """Run the decoder layers on every beam at position context + level; return their outputs [B, H]."""
        first_row = self.cache.length - context
        count = len(beams.pool_index)
        visible = []
        for b in range(count):
            own = first_row + b
            if sibling_causal:  # upstream Gumiho: no tree mask, so every earlier draft row is visible
                visible.append(list(range(own + 1)))
            else:  # EAGLE-2: the beam's ancestors and itself
                visible.append(beams.rows[b] + [own])
        x = self.draft_model.pair_input(beams.tokens[None], beams.features[None])
        positions = torch.full((1, count), context + level, device=self.lm.device)
        out = self.draft_model.serial(x, positions, self._mask(visible, context, x.dtype), self.cache)
        return out[0]

    def draft(self, state: DecodeState) -> DraftTree:
        cfg = self.config
        context = len(state.tokens) - 1
        self._lap(None)
        last = self._extend_context(state.tokens)
        pool = Pool()
        log_probs = self._log_probs(last)
        width = min(cfg.top_k, log_probs.shape[-1])  # a vocabulary smaller than top_k (tiny test models)
        top = torch.topk(log_probs, width)
        index = pool.add(top.indices.tolist(), top.values.tolist(), [ROOT] * width)
        beams = _Beams(last.expand(width, -1), top.indices, top.values, index, [[] for _ in index])
        try:
            tree_tokens, parents = self._grow(pool, beams, context)
        finally:
            self.cache.crop(context)
        rows = fta_rows(root_paths(parents)) if getattr(cfg, "fta", False) and tree_tokens else None
        self._lap("select")
        return DraftTree(tree_tokens, parents, rows=rows)

    def _grow(self, pool: Pool, beams: _Beams, context: int) -> tuple[list[int], list[int]]:
        raise NotImplementedError


@dataclass
class GumihoConfig:
    # null: the committed draft for the model (gumiho/drafts/<model>/); "random": a seeded random draft (lossless,
    # accepts almost nothing); otherwise a draft folder or a hub id (e.g. amd/Gumiho-llama3-8b).
    draft: Optional[str] = None
    seed: int = 0  # initialisation seed of a random draft
    top_k: int = 14  # branching of levels 1-2 and the number of serial beams
    total_tokens: int = 64  # tree nodes, the pending token included
    depth: int = 6  # depth - mlp_num = serial steps after level 1
    mlp_num: int = 5  # parallel heads used (depths 3..)
    mlptopk: int = 35  # tokens expanded per beam at each MLP level
    pruning: int = 35  # beams kept per MLP level
    fta: bool = False  # Full Tree Attention rows (upstream 1): not exact, see docs/methods/gumiho.md
    sibling_mask: str = "causal"  # upstream: level-2 siblings see earlier siblings; "tree": only their ancestors
    mlp_first_slot: str = "index"  # upstream: the c-th level-1 pair; "parent": the candidate's own parent's pair

    def check(self) -> None:
        require_int_range("top_k", self.top_k, 1, 1024)
        require_int_range("total_tokens", self.total_tokens, 1, MAX_DRAFT_NODES)
        require(0 <= self.mlp_num <= 5, "mlp_num", self.mlp_num, "0..5 (the draft's heads)")
        require_int_range("depth", self.depth, self.mlp_num + 1, 64)
        require_int_range("mlptopk", self.mlptopk, 1, 1024)
        require_int_range("pruning", self.pruning, 1, 1024)
        require(self.sibling_mask in SIBLING_MASKS, "sibling_mask", self.sibling_mask, " or ".join(SIBLING_MASKS))
        require(self.mlp_first_slot in MLP_FIRST_SLOTS, "mlp_first_slot", self.mlp_first_slot,
                " or ".join(MLP_FIRST_SLOTS))
        check_draft_source(self.draft, self.seed)


class Gumiho(_TreeDraftMethod):
    """Serial draft layers for depths 1-2, parallel MLP heads for depths 3-7, a dynamic top-k tree."""

    Config = GumihoConfig

    def __init__(self, config: GumihoConfig, model):
        config.check()
        super().__init__(config, model)
        if config.mlp_num > self.draft_model.mlp_num:
            raise HarnessError(f"method.mlp_num={config.mlp_num} but the draft has {self.draft_model.mlp_num} heads")

    def _serial_steps(self) -> int:
        return self.config.depth - self.config.mlp_num

    def _grow(self, pool: Pool, beams: _Beams, context: int) -> tuple[list[int], list[int]]:
        cfg = self.config
        # The pairs each serial level fed, for the MLP input: (features, tokens, parent beam in the level before).
        pairs = [(beams.features, beams.tokens, None)]
        for level in range(self.serial_steps):
            out = self._serial_level(beams, context, level, cfg.sibling_mask == "causal")
            first_row = self.cache.length - context - len(beams.pool_index)
            _, kept = expand(beams.scores, self._log_probs(out), cfg.top_k, cfg.top_k)
            beam = kept.beam.tolist()
            index = pool.add(kept.tokens.tolist(), kept.scores.tolist(), [beams.pool_index[b] for b in beam])
            beams = _Beams(out[kept.beam], kept.tokens, kept.scores, index,
                           [beams.rows[b] + [first_row + b] for b in beam])
            pairs.append((beams.features, beams.tokens, kept.beam))
        self._lap("serial")
        if cfg.mlp_num:
            self._mlp_levels(pool, beams, pairs)
            self._lap("mlp")
        return layout(pool, select_nodes(pool, cfg.total_tokens - 1))

    def _mlp_levels(self, pool: Pool, beams: _Beams, pairs) -> None:
        cfg, draft = self.config, self.draft_model
        (features1, tokens1, _), (features2, tokens2, parent) = pairs[-2], pairs[-1]
        if cfg.mlp_first_slot == "parent":
            features1, tokens1 = features1[parent], tokens1[parent]
        else:  # upstream: the c-th pair of the level before, whatever c's parent is
            count = tokens2.shape[0]
            features1, tokens1 = features1[:count], tokens1[:count]
        v = torch.cat((draft.pair_input(tokens1, features1), draft.pair_input(tokens2, features2)), dim=-1)
        # One pass through the vocabulary head for all heads: on a CPU its weights' memory traffic is the cost.
        head_lp = self._log_probs(torch.stack(draft.heads(v)[: cfg.mlp_num], dim=1))  # [B, mlp, V]
        anchor = torch.arange(head_lp.shape[0], device=head_lp.device)
        scores, pool_index = beams.scores, beams.pool_index
        for i in range(cfg.mlp_num):
            _, kept = expand(scores, head_lp[anchor, i], cfg.mlptopk, cfg.pruning)
            beam = kept.beam.tolist()
            pool_index = pool.add(kept.tokens.tolist(), kept.scores.tolist(), [pool_index[b] for b in beam])
            scores, anchor = kept.scores, anchor[kept.beam]


@dataclass
class Eagle2Config:
    # null: the committed Gumiho draft for the model (its serial part is an EAGLE draft); "random"; a folder or a
    # hub id of an EAGLE or Gumiho checkpoint.
    draft: Optional[str] = None
    seed: int = 0
    top_k: int = 10  # EAGLE-2's defaults: top-k 10, 60 tree tokens, depth 5
    total_tokens: int = 60
    depth: int = 5  # serial steps after level 1

    def check(self) -> None:
        require_int_range("top_k", self.top_k, 1, 1024)
        require_int_range("total_tokens", self.total_tokens, 1, MAX_DRAFT_NODES)
        require_int_range("depth", self.depth, 0, 64)
        check_draft_source(self.draft, self.seed)


class Eagle2(_TreeDraftMethod):
    """EAGLE-2's dynamic tree: `depth` serial steps on `top_k` beams; every expansion is a candidate."""

    Config = Eagle2Config

    def __init__(self, config: Eagle2Config, model):
        config.check()
        super().__init__(config, model)

    def _serial_steps(self) -> int:
        return self.config.depth

    def _grow(self, pool: Pool, beams: _Beams, context: int) -> tuple[list[int], list[int]]:
        cfg = self.config
        for level in range(self.serial_steps):
            out = self._serial_level(beams, context, level, sibling_causal=False)
            first_row = self.cache.length - context - len(beams.pool_index)
            everything, _ = expand(beams.scores, self._log_probs(out), cfg.top_k, None)
            index = pool.add(everything.tokens.tolist(), everything.scores.tolist(),
                             [beams.pool_index[b] for b in everything.beam.tolist()])
            order = torch.sort(-everything.scores, stable=True).indices[: cfg.top_k]
            beam = everything.beam[order].tolist()
            beams = _Beams(out[everything.beam[order]], everything.tokens[order], everything.scores[order],
                           [index[i] for i in order.tolist()], [beams.rows[b] + [first_row + b] for b in beam])
        self._lap("serial")
        return layout(pool, select_nodes(pool, cfg.total_tokens - 1))
