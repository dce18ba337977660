"""N-gram drafts by prompt lookup: the proposer of vLLM's ``ngram`` method, on the host.

For a request whose token history (prompt + output) ends in an n-gram that occurred before, the
tokens that followed that earlier occurrence are proposed as the next ``k`` tokens. The longest
``n`` in ``[min_n, max_n]`` with a match wins; among the occurrences of that n-gram the most
recent one with at least one following token is taken (recent context repeats best). A request
with no match gets no drafts (its verify row is a plain decode). Proposals can be shorter than
``k`` when the match is near the end of the history. Nothing here touches the device: the
history is the request's host token list, and the search is a numpy comparison of every window.
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
