"""REST: retrieval-based speculative decoding (He et al. 2024; Spec-Bench `model/rest/`), in numpy.

Per step (docs/methods/rest.md, Retrieval): the longest suffix of the context (the pending token included), 16 tokens down to 2,
is looked up in the suffix array of a corpus (baselines/rest_datastore.py). Up to 5000 of its occurrences give
continuations of up to 10 tokens; every prefix of them is counted in a trie, and the most frequent prefixes become
the draft tree below the pending token. See docs/methods/rest.md for the quirk switches and their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from baselines.rest_datastore import Datastore, build_datastore, load_datastore
from evaluation.engine.method import DecodeState, Method
from evaluation.engine.tree import DraftTree
from evaluation.engine.errors import require
from evaluation.engine.options import (
    MAX_DRAFT_NODES, MAX_TOKEN_ID, require_choice, require_dir, require_int_range, require_token_id,
)

OCCURRENCE_CHOICES = ("first_in_suffix_array", "evenly_spaced")
PRUNE_RULES = ("distinct_tokens", "trie_nodes")
TRIE_LIMIT = 25_600_000  # token ids in a step's trie (about 200 MB): 5000 occurrences of 10 tokens hold 500,000


@dataclass
class RestConfig:
    datastore: Optional[str] = None  # datastore folder; None = ShareGPT for this tokenizer, cached, built on first use
    max_conversations: Optional[int] = None  # with datastore=None: build from the first N ShareGPT conversations only
    num_draft: int = 64  # prefixes kept per step (upstream `choices`): a bound on the draft nodes
    max_token_span: int = 16  # longest suffix tried; spans go max_token_span..2
    max_occurrences: int = 5000  # k: occurrences read per query
    continuation_length: int = 10  # `long`: tokens read after each occurrence
    # Which occurrences when a query has more than k: the first k in suffix-array order (upstream quirk (a): biased
    # to small next-token ids) or k spread evenly over the whole range.
    occurrence_choice: str = "first_in_suffix_array"
    # Budget rule after the top-k cut: "distinct_tokens" (upstream quirk (c): drop the paths with the most distinct
    # tokens while their sum exceeds num_draft) or "trie_nodes" (keep the num_draft most frequent prefixes as is).
    prune: str = "distinct_tokens"
    # Upstream quirk (d): matches and continuations may run across turn seams; false cuts them at the seam.
    allow_cross_entry_matches: bool = True
    no_match_token: Optional[int] = 100  # upstream's dummy child when nothing matches; None = an empty draft

    def check(self) -> None:
        if self.datastore is not None:  # that its tokenizer is the model's is checked once the model is loaded
            require_dir("datastore", self.datastore, containing="manifest.json")
        if self.max_conversations is not None:
            require_int_range("max_conversations", self.max_conversations, 1)
        require_int_range("num_draft", self.num_draft, 0, MAX_DRAFT_NODES)
        require_int_range("max_token_span", self.max_token_span, 2, 256)
        require_int_range("max_occurrences", self.max_occurrences, 1, 100_000)
        require_int_range("continuation_length", self.continuation_length, 1, 64)
        # The trie keeps every prefix of every continuation: up to occurrences x length^2 token ids.
        trie = self.max_occurrences * self.continuation_length**2
        require(trie <= TRIE_LIMIT, "max_occurrences", self.max_occurrences,
                f"max_occurrences * continuation_length^2 <= {TRIE_LIMIT:.3g} (here {trie:.3g})")
        require_choice("occurrence_choice", self.occurrence_choice, OCCURRENCE_CHOICES)
        require_choice("prune", self.prune, PRUNE_RULES)
        if self.no_match_token is not None:
            require_int_range("no_match_token", self.no_match_token, 0, MAX_TOKEN_ID)


@dataclass
class Trie:
    """The prefixes of the retrieved continuations. Node 0 is the root (the query); ids are in BFS order,
    lexicographic within a depth."""

    tokens: np.ndarray  # [nodes] (root: -1)
    parents: np.ndarray  # [nodes] (root: -1)
    counts: np.ndarray  # [nodes] continuations that start with the node's prefix
    sequences: np.ndarray  # [nodes, L] the prefix of each node, padded with -1


class Retriever:
    """Suffix-array lookups and draft trees over one datastore; numpy only, no model."""

    def __init__(self, store: Datastore, config: RestConfig):
        config.check()
        self.config = config
        # Plain ndarray views of the memory maps: slicing them is as cheap as slicing in-memory arrays.
        self.tokens = np.asarray(store.tokens)
        self.sa = np.asarray(store.sa)
        self.starts = np.asarray(store.starts)
        self.vocab_bound = int(store.manifest.get("max_token_id", 0)) + 2  # trie keys: parent * bound + token

    # -------------------------------------------------------------------------------------- suffix-array search
    def _bound(self, query: list[int], strict: bool) -> int:
        """First suffix-array index whose suffix (cut to len(query)) is >= query, or > query when `strict`."""
        tokens, sa, m = self.tokens, self.sa, len(query)
        lo, hi = 0, len(sa)
        while lo < hi:
            mid = (lo + hi) // 2
            start = int(sa[mid])
            head = tokens[start : start + m].tolist()  # a suffix shorter than m sorts before its extensions
            if head < query or (strict and head == query):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def match_range(self, query: list[int]) -> tuple[int, int]:
        """The suffix-array range [lo, hi) of the suffixes that start with `query` (empty: lo == hi)."""
        lo = self._bound(query, strict=False)
        if lo == len(self.sa):
            return lo, lo
        start = int(self.sa[lo])
        if self.tokens[start : start + len(query)].tolist() != query:
            return lo, lo
        return lo, self._bound(query, strict=True)

    def _occurrences(self, lo: int, hi: int, span: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to k start positions in [lo, hi) and the end of the readable stream after each (its entry's end)."""
        k, n = self.config.max_occurrences, len(self.tokens)
        cross = self.config.allow_cross_entry_matches

        def limits(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            if cross:
                return positions, np.full(len(positions), n, dtype=np.int64)
            entry = np.searchsorted(self.starts, positions, side="right") - 1
            ends = self.starts[entry + 1]
            inside = positions + span <= ends  # the match itself must not straddle a seam
            return positions[inside], ends[inside]

        if self.config.occurrence_choice == "evenly_spaced":
            count = hi - lo
            picks = np.arange(lo, hi) if count <= k else lo + (np.arange(k, dtype=np.int64) * count) // k
            return limits(self.sa[picks].astype(np.int64))
        # first_in_suffix_array: walk the range in order until k usable occurrences are found
        found_pos, found_end, have = [], [], 0
        cursor = lo
        while cursor < hi and have < k:
            block = self.sa[cursor : min(hi, cursor + k - have if cross else cursor + k)].astype(np.int64)
            cursor += len(block)
            pos, ends = limits(block)
            pos, ends = pos[: k - have], ends[: k - have]
            found_pos.append(pos)
            found_end.append(ends)
            have += len(pos)
        if not found_pos:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(found_pos), np.concatenate(found_end)

    def continuations(self, lo: int, hi: int, span: int) -> np.ndarray:
        """[occurrences, L] tokens after each chosen occurrence, padded with -1 where the stream (or entry) ends."""
        length = self.config.continuation_length
        positions, ends = self._occurrences(lo, hi, span)
        index = positions[:, None] + span + np.arange(length)[None, :]
        readable = index < ends[:, None]
        values = self.tokens[np.minimum(index, len(self.tokens) - 1)].astype(np.int64)
        return np.where(readable, values, -1)

    def retrieve(self, context: list[int]) -> tuple[int, np.ndarray]:
        """(matched span, continuations) for the longest suffix of `context` that is found; (0, empty) if none.

        A span whose occurrences all lack a continuation (upstream would panic, quirk (f)) counts as not found.
        """
        for span in range(min(self.config.max_token_span, len(context)), 1, -1):
            query = [int(t) for t in context[-span:]]
            lo, hi = self.match_range(query)
            if lo == hi:
                continue
            conts = self.continuations(lo, hi, span)
            if len(conts) and (conts[:, 0] >= 0).any():
                return span, conts
        return 0, np.zeros((0, self.config.continuation_length), np.int64)

    # -------------------------------------------------------------------------------------- trie and selection
    def trie(self, conts: np.ndarray) -> Trie:
        """Count every non-empty prefix of every continuation, depth by depth."""
        rows, length = conts.shape
        lengths = (conts >= 0).sum(axis=1)  # padding only ever trails
        tokens, parents, counts = [np.array([-1])], [np.array([-1])], [np.array([rows])]
        sequences = [np.full((1, length), -1, np.int64)]
        node_of_row = np.zeros(rows, np.int64)
        next_id = 1
        for depth in range(length):
            alive = lengths > depth
            if not alive.any():
                break
            keys = node_of_row[alive] * self.vocab_bound + conts[alive, depth]
            unique, inverse, count = np.unique(keys, return_inverse=True, return_counts=True)
            parent, token = unique // self.vocab_bound, unique % self.vocab_bound
            ids = next_id + np.arange(len(unique))
            all_sequences = np.concatenate(sequences)
            seq = all_sequences[parent].copy()
            seq[:, depth] = token
            tokens.append(token)
            parents.append(parent)
            counts.append(count)
            sequences.append(seq)
            node_of_row[alive] = ids[inverse.reshape(-1)]
            next_id += len(unique)
        return Trie(np.concatenate(tokens), np.concatenate(parents), np.concatenate(counts), np.concatenate(sequences))

    def select(self, trie: Trie) -> np.ndarray:
        """Node ids (root excluded, ascending) kept for the draft."""
        budget = self.config.num_draft
        nodes = np.arange(1, len(trie.tokens))
        if budget <= 0 or len(nodes) == 0:
            return nodes[:0]
        # Top `budget` prefixes by count; ties broken by token sequence (a prefix before its extensions), so the
        # kept set is closed under prefixes. Only the nodes at or above the cut-off count need sorting.
        counts = trie.counts[nodes]
        if len(nodes) > budget:
            cutoff = np.partition(counts, len(counts) - budget)[len(counts) - budget]
            nodes = nodes[counts >= cutoff]
        seq = trie.sequences[nodes]
        order = np.lexsort(tuple(seq[:, j] for j in range(seq.shape[1] - 1, -1, -1)) + (-trie.counts[nodes],))
        ranked = nodes[order][:budget]
        if self.config.prune == "trie_nodes":
            return np.sort(ranked)
        return self._prune_distinct_tokens(trie, ranked)

    def _prune_distinct_tokens(self, trie: Trie, ranked: np.ndarray) -> np.ndarray:
        """Upstream's budget (quirk c): while the kept paths' distinct-token counts sum past num_draft, drop the path
        with the most distinct tokens (ties: the least frequent first); the draft is the prefix closure of the rest."""
        budget = self.config.num_draft
        seq = np.sort(trie.sequences[ranked], axis=1)
        first = np.concatenate([np.ones((len(seq), 1), bool), seq[:, 1:] != seq[:, :-1]], axis=1)
        distinct = ((seq >= 0) & first).sum(axis=1)  # distinct tokens per path (padding excluded)
        removal = np.lexsort((-np.arange(len(ranked)), -distinct))  # most distinct first, then lowest ranked
        kept = np.ones(len(ranked), bool)
        total = int(distinct.sum())
        for i in removal:
            if total <= budget:
                break
            kept[i] = False
            total -= int(distinct[i])
        closure = self._closure(trie, ranked[kept])
        # With repeated tokens the closure can still exceed the budget (upstream would abort): drop more paths.
        for i in removal:
            if len(closure) <= budget:
                break
            if kept[i]:
                kept[i] = False
                closure = self._closure(trie, ranked[kept])
        return closure

    @staticmethod
    def _closure(trie: Trie, nodes: np.ndarray) -> np.ndarray:
        keep = set()
        for node in nodes.tolist():
            while node > 0 and node not in keep:
                keep.add(node)
                node = int(trie.parents[node])
        return np.array(sorted(keep), dtype=np.int64)

    def draft(self, context: list[int]) -> DraftTree:
        """The draft tree below the last token of `context` (the pending token)."""
        span, conts = self.retrieve(context)
        if span == 0:
            token = self.config.no_match_token
            return DraftTree([token], [0]) if token is not None and self.config.num_draft > 0 else DraftTree()
        trie = self.trie(conts)
        kept = self.select(trie)
        # Ascending node ids are a BFS order (parents first); renumber them 1..K below the pending token.
        index = {0: 0, **{int(node): i + 1 for i, node in enumerate(kept.tolist())}}
        tree = DraftTree([int(trie.tokens[n]) for n in kept], [index[int(trie.parents[n])] for n in kept])
        # For the draft budget: the share of the retrieved continuations through a node's parent that go on to it.
        tree.scores = (trie.counts[kept] / trie.counts[trie.parents[kept]]).tolist()
        return tree


class Rest(Method):
    """Drafts retrieved continuations of the context's longest suffix found in a corpus (a trie of them)."""


    Config = RestConfig

    @classmethod
    def input_files(cls, config: RestConfig, model_name: str) -> dict[str, Path]:
        """A datastore folder given by path is named by its manifest (the digests of its files). The cached default
        is not: it is built from the options and the model's tokenizer alone, which the run's identity has."""
        return {"datastore": Path(config.datastore).expanduser() / "manifest.json"} if config.datastore else {}

    def __init__(self, config: RestConfig, model):
        super().__init__(config, model)
        config.check()
        if config.no_match_token is not None:
            require_token_id("no_match_token", config.no_match_token, model)
        tokenizer = model.tokenizer
        folder = config.datastore
        if folder is None:
            folder = build_datastore(tokenizer, None, config.max_conversations)  # cached after the first build
        self.store = load_datastore(folder, tokenizer)
        self.retriever = Retriever(self.store, config)

    @property
    def max_nodes(self) -> int:
        return max(self.config.num_draft, 1)

    def draft(self, state: DecodeState) -> DraftTree:
        return self.retriever.draft(state.tokens)
