"""Gumiho on the shared engine (docs/methods/gumiho.md), and the trained-draft machinery every family shares
(`TreeDraftMethod`; the EAGLE family in eagle/method.py): a trained draft reads the target's hidden states.

Each step (`draft`):
  1. the draft's context is extended with the pairs (target hidden state h_j, token x_{j+1}) not yet in its own
     KV cache: the whole prompt at the first step, then the nodes accepted by the last verification;
  2. level 1 is the top-k of the draft's prediction at the last pair; then serial levels run the decoder
     layers on the beams (Gumiho: depth - mlp_num of them);
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

from evaluation.checkpoints import PairedCheckpoint
from evaluation.engine.kv_cache import PositionalKVCache
from evaluation.engine.method import DecodeState, Method, StepOutcome
from evaluation.engine.tree import DraftTree
from evaluation.engine.errors import HarnessError, require
from evaluation.engine.options import MAX_DRAFT_NODES, require_int_range
from gumiho.draft_model import GumihoDraft
from gumiho.tree import ROOT, Pool, expand, fta_rows, layout, root_paths, select_nodes

# The draft part of the engine's breakdown, split: the serial decoder layers (the draft's context and the serial
# levels, their top-k included), the parallel MLP heads (Gumiho only), the vocabulary head (the projection onto the
# draft vocabulary and its log-softmax: what a reduced draft vocabulary shrinks), and choosing and laying out the tree.
DRAFT_PARTS = ("serial", "mlp", "head", "select")
DRAFTS_DIR = Path(__file__).resolve().parent / "drafts"
SIBLING_MASKS = ("causal", "tree")
MLP_FIRST_SLOTS = ("index", "parent")


def committed_draft_dir(model_name: str) -> Path:
    """The committed Gumiho draft for a target model."""
    return DRAFTS_DIR / model_name


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def check_draft_source(draft: Optional[str], seed: int, draft_vocab: Optional[int] = None) -> None:
    """`draft` is null, `random`, an existing folder, or a hub id (owner/name); the seed fits torch's; a reduced
    vocabulary is null or a positive size."""
    ok = draft is None or draft == "random" or is_folder_or_hub_id(draft)
    require(ok, "draft", draft, "null (the committed draft), random, an existing folder or a hub id owner/name")
    require_int_range("seed", seed, 0, 2**63 - 1)
    require(draft_vocab is None or (isinstance(draft_vocab, int) and not isinstance(draft_vocab, bool)
                                    and 1 <= draft_vocab <= 10**7),
            "draft_vocab", draft_vocab, "null (the whole vocabulary) or the number of tokens the draft proposes from")


def is_folder_or_hub_id(name) -> bool:
    """An existing folder, or a name shaped like a hub id (owner/name), of a plausible length."""
    return isinstance(name, str) and 0 < len(name) <= 4096 and (
        _is_dir(name) or (HUB_ID.fullmatch(name) is not None and not name.startswith((".", "/"))))


def _is_dir(path: str) -> bool:
    try:
        return Path(path).expanduser().is_dir()
    except OSError:  # e.g. a name too long for the file system
        return False


@dataclass
class Beams:
    """The open beams of the level being expanded: what each feeds the draft next and where it sits."""

    features: torch.Tensor  # [B, H] feature of the pair each beam feeds
    tokens: torch.Tensor  # [B] token of that pair (the beam's own token)
    scores: torch.Tensor  # [B] cumulative log-probability
    pool_index: list[int]  # the beam's node in the pool
    rows: list[list[int]]  # draft-cache rows (relative to the context) of the beam's ancestors


class TreeDraftMethod(PairedCheckpoint, Method):
    """The machinery every trained-draft family shares (Gumiho, EAGLE, EAGLE-2, EAGLE-3): the draft's context cache,
    the serial levels, the reduced draft vocabulary, the selection. A family says which draft it builds
    (`random_draft`, `load_draft`), where its committed drafts live (`drafts_dir`) and how it grows a tree (`_grow`
    or `draft`)."""

    needs_hidden_states = True
    draft_parts = ("serial", "head", "select")  # the split of its draft time (DRAFT_PARTS)
    drafts_dir: Path = DRAFTS_DIR  # committed drafts, one folder per target model name
    checkpoint_kind = "gumiho"  # the released checkpoints it reads (conf/checkpoints.yaml)
    checkpoint_option = "draft"
    train_command = "make train-gumiho"  # how to train the committed draft (for the error when it is missing)
    fallback = " (or method.draft=random)"

    @classmethod
    def input_files(cls, config, model_name: str) -> dict[str, Path]:
        """The draft's folder (the committed one when `draft` is null); a seeded random draft or a hub id has none
        here (a hub id is named in the options)."""
        if config.draft is None:
            folder = cls.committed_dir(model_name)
        elif config.draft != "random" and _is_dir(config.draft):
            folder = Path(config.draft).expanduser()
        else:
            return {}
        return {"draft": folder} if folder.is_dir() else {}

    # A family's draft: a seeded random one for the loaded target, or one read from a folder or hub id.
    @classmethod
    def random_draft(cls, lm):
        return GumihoDraft.for_target(lm.model)

    @classmethod
    def load_draft(cls, source: str, lm):
        from gumiho.checkpoint import load_draft

        return load_draft(source, lm.model)

    def _build_draft(self, config, lm):
        """`None`: the committed draft for this model; `random`: a seeded random draft; else a folder or hub id.
        With `draft_vocab`, the draft proposes from N tokens only (`draft_vocabulary`)."""
        if config.draft == "random":
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                draft = self.random_draft(lm)
            draft = draft.to(device=lm.device, dtype=lm.dtype).eval()
        else:
            draft = self.load_draft(self.draft_source(config, lm), lm)
        ids = self.draft_vocabulary(config, lm)
        if ids is not None:
            draft.use_vocabulary(ids)
        return draft

    def draft_source(self, config, lm) -> str:
        """The folder or hub id the draft is read from (`trained_source`); one line when there is none."""
        return self.checkpoint_source(config, lm.name)

    def draft_vocabulary(self, config, lm) -> torch.Tensor | None:
        """The sorted target ids of a reduced draft vocabulary, or None for the whole one. A trained draft's are
        the N tokens most frequent in its training text (its token_counts.csv, ties to the lower id); a random
        draft's are a seeded random choice of N."""
        from gumiho.checkpoint import TOKEN_COUNTS, most_frequent, read_token_counts, resolve

        size, vocab = getattr(config, "draft_vocab", None), lm.model.config.vocab_size
        if size is None or size == vocab:
            return None
        if size > vocab:
            raise HarnessError(f"method.draft_vocab={size} is larger than the target's vocabulary ({vocab})")
        if config.draft == "random":
            generator = torch.Generator().manual_seed(config.seed)
            return torch.sort(torch.randperm(vocab, generator=generator)[:size]).values
        source = self.draft_source(config, lm)
        counts = read_token_counts(resolve(source))  # a local folder as is, a hub id from the hub's cache
        if counts is None:
            raise HarnessError(f"method.draft_vocab={size} needs the token counts of the draft's training text "
                               f"({TOKEN_COUNTS} in its folder); draft {source} has none")
        distinct = int((counts > 0).sum())
        if size > distinct:
            raise HarnessError(f"method.draft_vocab={size}, but only {distinct} distinct tokens occur in the "
                               f"draft's training text")
        return torch.sort(most_frequent(counts, size)).values

    def __init__(self, config, model):
        super().__init__(config, model)
        self.lm = model
        self.draft_model = self._build_draft(config, model)
        self.hidden_state_layers = self.draft_model.hidden_state_layers  # what the engine hands the draft
        self.vocab_ids = self.draft_model.vocab_ids  # draft index -> target id, None for the whole vocabulary
        self.serial_steps = self._serial_steps()
        capacity = int(model.max_context) + 1 + self._tree_rows()
        self.cache = PositionalKVCache(self.draft_model.num_layers, capacity)
        self.pending: torch.Tensor | None = None  # target hidden states not yet in the draft's context
        self.detail = dict.fromkeys(self.draft_parts, 0.0)
        self._last_lap = 0.0

    def _serial_steps(self) -> int:
        raise NotImplementedError

    def _tree_rows(self) -> int:
        """The most draft-cache rows one step's tree levels write after the context."""
        return self.config.top_k * self.serial_steps

    @property
    def max_nodes(self) -> int:
        return self.config.total_tokens - 1

    # ------------------------------------------------------------------------------------------ state
    def reset(self, prompt_ids: list[int], hidden_states: torch.Tensor | None = None) -> None:
        if hidden_states is None:
            raise RuntimeError(f"{self.name} needs the prompt's hidden states from the engine")
        self.cache.crop(0)
        self.pending = hidden_states
        self.detail = dict.fromkeys(self.draft_parts, 0.0)

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

    def _log_probs(self, features: torch.Tensor, part: str) -> torch.Tensor:
        """Log-probabilities over the draft vocabulary (its indices map to target ids through `vocab_ids`); the time
        so far goes to `part`, the head's own to "head"."""
        self._lap(part)
        log_probs = torch.log_softmax(self.draft_model.vocab_logits(features).float(), dim=-1)
        self._lap("head")
        return log_probs

    def _top(self, log_probs: torch.Tensor, k: int):
        """The top-k (values, target ids) of a row of draft log-probabilities."""
        top = torch.topk(log_probs, min(k, log_probs.shape[-1]))  # a vocabulary smaller than k (tiny test models)
        ids = top.indices if self.vocab_ids is None else self.vocab_ids[top.indices]
        return top.values, ids

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

    def _serial_level(self, beams: Beams, context: int, level: int, sibling_causal: bool) -> torch.Tensor:
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
        values, ids = self._top(self._log_probs(last, "serial"), cfg.top_k)
        width = ids.numel()
        index = pool.add(ids.tolist(), values.tolist(), [ROOT] * width)
        beams = Beams(last.expand(width, -1), ids, values, index, [[] for _ in index])
        try:
            tree_tokens, parents = self._grow(pool, beams, context)
        finally:
            self.cache.crop(context)
        rows = fta_rows(root_paths(parents)) if getattr(cfg, "fta", False) and tree_tokens else None
        self._lap("select")
        return DraftTree(tree_tokens, parents, rows=rows)

    def _grow(self, pool: Pool, beams: Beams, context: int) -> tuple[list[int], list[int]]:
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
    draft_vocab: Optional[int] = None  # null: the whole vocabulary; N: the N tokens most frequent in training

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
        check_draft_source(self.draft, self.seed, self.draft_vocab)


class Gumiho(TreeDraftMethod):
    """Serial draft layers for depths 1-2, parallel MLP heads for depths 3-7, a dynamic top-k tree."""

    Config = GumihoConfig
    draft_parts = DRAFT_PARTS

    def __init__(self, config: GumihoConfig, model):
        config.check()
        super().__init__(config, model)
        if config.mlp_num > self.draft_model.mlp_num:
            raise HarnessError(f"method.mlp_num={config.mlp_num} but the draft has {self.draft_model.mlp_num} heads")

    def _serial_steps(self) -> int:
        return self.config.depth - self.config.mlp_num

    def _grow(self, pool: Pool, beams: Beams, context: int) -> tuple[list[int], list[int]]:
        cfg = self.config
        # The pairs each serial level fed, for the MLP input: (features, tokens, parent beam in the level before).
        pairs = [(beams.features, beams.tokens, None)]
        for level in range(self.serial_steps):
            out = self._serial_level(beams, context, level, cfg.sibling_mask == "causal")
            first_row = self.cache.length - context - len(beams.pool_index)
            _, kept = expand(beams.scores, self._log_probs(out, "serial"), cfg.top_k, cfg.top_k, self.vocab_ids)
            beam = kept.beam.tolist()
            index = pool.add(kept.tokens.tolist(), kept.scores.tolist(), [beams.pool_index[b] for b in beam])
            beams = Beams(out[kept.beam], kept.tokens, kept.scores, index,
                           [beams.rows[b] + [first_row + b] for b in beam])
            pairs.append((beams.features, beams.tokens, kept.beam))
        self._lap("serial")
        if cfg.mlp_num:
            self._mlp_levels(pool, beams, pairs)
            self._lap("mlp")
        return layout(pool, select_nodes(pool, cfg.total_tokens - 1))

    def _mlp_levels(self, pool: Pool, beams: Beams, pairs) -> None:
        cfg, draft = self.config, self.draft_model
        (features1, tokens1, _), (features2, tokens2, parent) = pairs[-2], pairs[-1]
        if cfg.mlp_first_slot == "parent":
            features1, tokens1 = features1[parent], tokens1[parent]
        else:  # upstream: the c-th pair of the level before, whatever c's parent is
            count = tokens2.shape[0]
            features1, tokens1 = features1[:count], tokens1[:count]
        v = torch.cat((draft.pair_input(tokens1, features1), draft.pair_input(tokens2, features2)), dim=-1)
        # One pass through the vocabulary head for all heads: on a CPU its weights' memory traffic is the cost.
        head_lp = self._log_probs(torch.stack(draft.heads(v)[: cfg.mlp_num], dim=1), "mlp")  # [B, mlp, V]
        anchor = torch.arange(head_lp.shape[0], device=head_lp.device)
        scores, pool_index = beams.scores, beams.pool_index
        for i in range(cfg.mlp_num):
            _, kept = expand(scores, head_lp[anchor, i], cfg.mlptopk, cfg.pruning, self.vocab_ids)
            beam = kept.beam.tolist()
            pool_index = pool.add(kept.tokens.tolist(), kept.scores.tolist(), [pool_index[b] for b in beam])
            scores, anchor = kept.scores, anchor[kept.beam]
