"""The trained-draft methods' shared base (`TreeDraftMethod`: Gumiho, EAGLE-1/2, EAGLE-3 and gumiho-serial build on
it): a draft that reads the target's hidden states, grown into a tree each step.

Each step (`draft`):
  1. the draft's context is extended with the pairs (target hidden state h_j, token x_{j+1}) not yet in its own
     KV cache: the whole prompt at the first step, then the nodes accepted by the last verification;
  2. level 1 is the top-k of the draft's prediction at the last pair; then the family grows the tree (`_grow`):
     serial levels run the decoder layers on the beams, and Gumiho's MLP heads add deeper levels at once;
  3. the `total_tokens - 1` best nodes by cumulative log-probability become the `DraftTree` (drafts/tree.py);
     the engine verifies it. With `fta` the verification rows are padded as docs/methods/gumiho.md, Full Tree
     Attention, describes (not exact).
The draft's rows for the tree are written after its context in its own cache and cropped away afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from drafts.serial_draft import SerialDraft
from drafts.tree import ROOT, Pool, fta_rows, root_paths
from evaluation.checkpoints import PairedCheckpoint
from evaluation.engine.errors import HarnessError, require
from evaluation.engine.kv_cache import PositionalKVCache
from evaluation.engine.method import DecodeState, Method, StepOutcome
from evaluation.engine.options import require_int_range
from evaluation.engine.tree import DraftTree
from evaluation.hub import is_dir, is_folder_or_hub_id

# The draft part of the engine's breakdown, split: the serial decoder layers (the draft's context and the serial
# levels, their top-k included), the parallel MLP heads (Gumiho only), the vocabulary head (the projection onto the
# draft vocabulary and its log-softmax: what a reduced draft vocabulary shrinks), and choosing and laying out the tree.
DRAFT_PARTS = ("serial", "mlp", "head", "select")


def check_draft_source(draft: Optional[str], seed: int, draft_vocab: Optional[int] = None) -> None:
    """`draft` is null, `random`, an existing folder, or a hub id (owner/name); the seed fits torch's; a reduced
    vocabulary is null or a positive size."""
    ok = draft is None or draft == "random" or is_folder_or_hub_id(draft)
    require(ok, "draft", draft, "null (the committed draft), random, an existing folder or a hub id owner/name")
    require_int_range("seed", seed, 0, 2**63 - 1)
    require(draft_vocab is None or (isinstance(draft_vocab, int) and not isinstance(draft_vocab, bool)
                                    and 1 <= draft_vocab <= 10**7),
            "draft_vocab", draft_vocab, "null (the whole vocabulary) or the number of tokens the draft proposes from")


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
    (`random_draft`, `load_draft`), whose committed drafts it runs (`trained_family`) and how it grows a tree
    (`_grow` or `draft`)."""

    needs_hidden_states = True
    draft_parts = ("serial", "head", "select")  # the split of its draft time (DRAFT_PARTS)
    trained_family = "gumiho"  # whose committed drafts it runs (conf/family/<name>.yaml)
    checkpoint_kind = "gumiho"  # the released checkpoints it reads (conf/checkpoints.yaml)
    checkpoint_option = "draft"
    fallback = " (or method.draft=random)"

    @classmethod
    def input_files(cls, config, model_name: str) -> dict[str, Path]:
        """The draft's folder (the committed one when `draft` is null); a seeded random draft or a hub id has none
        here (a hub id is named in the options)."""
        if config.draft is None:
            folder = cls.committed_dir(model_name)
        elif config.draft != "random" and is_dir(config.draft):
            folder = Path(config.draft).expanduser()
        else:
            return {}
        return {"draft": folder} if folder.is_dir() else {}

    # A family's draft: a seeded random one for the loaded target, or one read from a folder or hub id.
    @classmethod
    def random_draft(cls, lm):
        return SerialDraft.for_target(lm.model)

    @classmethod
    def load_draft(cls, source: str, lm):
        from drafts.checkpoint import load_draft

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
        from drafts.checkpoint import TOKEN_COUNTS, read_token_counts, resolve
        from drafts.data import most_frequent

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
