"""An online suffix automaton over a growing token sequence, with each state's earliest end position.

The standard construction (Blumer et al.): appending a token adds one state and at most one clone, and the
transitions rewritten along the suffix-link path amortise to constant time per token, so a sequence of n tokens
costs O(n) in all (dict transitions). Each state also keeps `first_end`, the end (exclusive, 0-based) of the
earliest occurrence of its strings; a clone copies it from the state it was cloned from.

`cur` follows the sequence: the state and length of the longest suffix of the sequence that also ends at an
earlier position. It moves with every appended token, against the automaton as it was before that token.
"""

from __future__ import annotations


class SuffixAutomaton:
    """States are parallel lists; state 0 is the root (the empty string)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [0]
        self.last = 0  # the state of the whole sequence
        self.cur_state = 0
        self.cur_length = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """The longest suffix of (the match `state`, `length`) + token that occurs in the sequence, with the usual
        suffix-link fallback; (0, 0) when even the token alone does not occur."""
        nxt, link = self.next, self.link
        while state != 0 and token not in nxt[state]:
            state = link[state]
            length = self.length[state]
        if token in nxt[state]:
            return nxt[state][token], length + 1
        return 0, 0

    def lookup(self, token: int) -> tuple[int, int]:
        """The longest suffix of sequence + [token] that occurs in the sequence: (state, length)."""
        return self.step(self.cur_state, self.cur_length, token)

    def extend(self, tokens) -> None:
        for token in tokens:
            self.cur_state, self.cur_length = self.step(self.cur_state, self.cur_length, token)
            self._append(token)

    def _append(self, token: int) -> None:
        nxt, link, length, first_end = self.next, self.link, self.length, self.first_end
        self.tokens.append(token)
        end = len(self.tokens)
        cur = len(nxt)
        nxt.append({})
        link.append(0)
        length.append(end)
        first_end.append(end)
        p = self.last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(nxt)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                first_end.append(first_end[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur

    def with_room(self, state: int, room: int) -> int:
        """Walk up suffix links (never to the root) while fewer than `room` tokens follow the earliest occurrence:
        a shorter match whose first occurrence has a longer continuation (upstream `to_anc`)."""
        if state == 0:
            return 0
        end = len(self.tokens)
        while self.link[state] != 0 and room > end - self.first_end[state]:
            state = self.link[state]
        return state

    def continuation(self, state: int, count: int) -> list[int]:
        """Up to `count` tokens after the earliest occurrence of `state`'s strings."""
        start = self.first_end[state]
        return self.tokens[start: start + count]
