"""LogitSpec's n-gram pool: for every l-gram (l = 1..N) of the sequence, one continuation of at most K tokens.

Rule (upstream `Pool`): positions are inserted in increasing order and an entry is replaced when the new
continuation is at least as long as the stored one. So each key keeps the latest occurrence among those with the
longest available continuation (capped at K); in practice the most recent occurrence that still has K tokens after it.
"""

from __future__ import annotations


class Pool:
    def __init__(self, max_ngram_size: int = 3, num_pred_tokens: int = 20, upstream_update_window: bool = False):
        if max_ngram_size < 1 or num_pred_tokens < 1:
            raise ValueError("max_ngram_size and num_pred_tokens must be >= 1")
        self.n = max_ngram_size
        self.k = num_pred_tokens
        # True: rescan only the last 2K start positions after an update, as upstream does (misses refreshes after
        # long accepts). False: rescan exactly the positions whose continuation can have changed.
        self.upstream_update_window = upstream_update_window
        self.seq: list[int] = []
        self.tables: list[dict[tuple, list[int]]] = [{} for _ in range(self.n + 1)]  # tables[l], l = 1..N

    def build(self, tokens: list[int]) -> None:
        self.seq = list(tokens)
        self.tables = [{} for _ in range(self.n + 1)]
        self._insert(0)

    def extend(self, new_tokens: list[int]) -> None:
        """Append tokens and refresh the entries they affect; cost O((K + N + len(new_tokens)) * N)."""
        if not new_tokens:
            return
        old = len(self.seq)
        self.seq.extend(new_tokens)
        if self.upstream_update_window:
            # Upstream: insert(seq, len(seq)-2K .. len(seq)-1), clamped at 0 (negative starts never happen there).
            start = len(self.seq) - 2 * self.k
        else:
            # The (i, l) entry's continuation seq[i+l : i+l+K] changes only when it was cut by the old end, i.e.
            # i + l > old - K. The loosest bound is l = N. Positions before it keep their full-K continuation, and
            # re-inserting every changed position in increasing order gives the same tables as a rebuild.
            start = old - self.k - self.n + 1
        self._insert(max(0, start))

    def _insert(self, start: int) -> None:
        seq, n, k, tables = self.seq, self.n, self.k, self.tables
        length = len(seq)
        for i in range(start, length - 1):  # an n-gram needs at least one following token
            for l in range(1, min(n, length - 1 - i) + 1):
                e = i + l
                key = tuple(seq[i:e])
                cont = seq[e:e + k]
                table = tables[l]
                stored = table.get(key)
                if stored is None or len(cont) >= len(stored):
                    table[key] = cont

    def lookup(self, context: list[int], extra: int | None = None) -> list[int]:
        """The continuation of the longest n-gram (N..1) that ends `context` (+ `extra` when given); [] if none.

        `extra` appends one token without copying the context (the next-next candidate t in `ctx + [t]`).
        """
        return self.match(context, extra)[0]

    def match(self, context: list[int], extra: int | None = None) -> tuple[list[int], int]:
        """`lookup`'s continuation and the length of the n-gram it was found under (0 when none)."""
        if extra is None:
            tail = list(context[-self.n:])
        else:
            tail = (list(context[-(self.n - 1):]) if self.n > 1 else []) + [extra]
        for l in range(min(self.n, len(tail)), 0, -1):
            cont = self.tables[l].get(tuple(tail[-l:]))
            if cont is not None:
                return cont, l
        return [], 0
