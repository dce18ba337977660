"""N-gram drafts by prompt lookup: the proposer of vLLM's ``ngram`` method, on the host.

For a request whose token history (prompt + output) ends in an n-gram that occurred before, the
tokens that followed that earlier occurrence are proposed as the next ``k`` tokens. The longest
``n`` in ``[min_n, max_n]`` with a match wins; among the occurrences of that n-gram the most
recent one with at least one following token is taken (recent context repeats best). A request
with no match gets no drafts (its verify row is a plain decode). Proposals can be shorter than
``k`` when the match is near the end of the history. Nothing here touches the device: the
history is the request's host token list.

``propose`` searches the whole history (a numpy comparison of every window): the reference.
``NgramIndex`` gives the same answers incrementally for one request, whose history only grows:
a dict from each n-gram to its latest start with a token after it, extended by the tokens added
since the last call, so a step costs a few dict lookups per request instead of a scan of its
history (the scan took ~0.7 ms per step at batch 8 on the H200's host).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose(tokens, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` draft tokens continuing ``tokens`` (a sequence of ints)."""
    if k <= 0 or min_n < 1 or max_n < min_n:
        if k > 0 and (min_n < 1 or max_n < min_n):
            raise ValueError(f"ngram window [{min_n}, {max_n}] needs 1 <= min <= max")
        return []
    history = np.asarray(tokens, dtype=np.int64)
    size = len(history)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = history[size - n :]
        # windows starting at 0 .. size - n - 1: each has at least one token after it
        windows = sliding_window_view(history[: size - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return history[start : start + k].tolist()
    return []


def propose_batch(histories, k: int, min_n: int, max_n: int) -> list[list[int]]:
    """``propose`` for each history, in order."""
    return [propose(h, k, min_n, max_n) for h in histories]


class NgramIndex:
    """``propose`` for one request's append-only history, kept up to date incrementally."""

    def __init__(self, min_n: int, max_n: int) -> None:
        if min_n < 1 or max_n < min_n:
            raise ValueError(f"ngram window [{min_n}, {max_n}] needs 1 <= min <= max")
        self.min_n, self.max_n = min_n, max_n
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> latest start, token after it
        self._ends = 0  # n-grams ending before this position are indexed
        self._size = 0  # the history's length at the last call

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` drafts continuing ``tokens``, the history this index has seen grow."""
        size = len(tokens)
        if size < self._size:  # not the history it indexed: start again
            self._latest.clear()
            self._ends = 0
        self._size = size
        latest = self._latest
        for end in range(self._ends, size - 1):  # n-grams that now have a token after them
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                latest[tuple(tokens[end + 1 - n : end + 1])] = end + 1 - n
        self._ends = max(self._ends, size - 1)
        if k <= 0:
            return []
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            start = latest.get(tuple(tokens[size - n :]))
            if start is not None:
                return tokens[start + n : start + n + k]
        return []
