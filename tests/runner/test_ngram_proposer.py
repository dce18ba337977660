"""Prompt-lookup drafts (``core/ngram_proposer.py``) on hand-worked histories."""

from __future__ import annotations

import pytest

from mrv2_prof.runner.core.ngram_proposer import propose, propose_batch


def test_the_tokens_after_the_earlier_occurrence_are_proposed():
    #          0  1  2  3  4  5  6  7  8
    history = [5, 6, 7, 8, 9, 1, 5, 6, 7]  # ends in 5 6 7, seen at 0..2, followed by 8 9 1
    assert propose(history, k=3, min_n=2, max_n=3) == [8, 9, 1]
    assert propose(history, k=5, min_n=2, max_n=3) == [8, 9, 1, 5, 6]  # runs into the suffix
    assert propose(history, k=1, min_n=1, max_n=1) == [8]  # "7" seen at 2


def test_the_longest_n_wins_and_then_the_most_recent_occurrence():
    # suffix "1 2": at 0 (then 3) and at 4 (then 4); suffix "9 1 2" only at 3 (then 4)
    history = [1, 2, 3, 9, 1, 2, 4, 9, 1, 2]
    assert propose(history, k=1, min_n=2, max_n=2) == [4]  # most recent "1 2" is at 4
    history = [9, 1, 2, 3, 5, 1, 2, 4, 9, 1, 2]
    assert propose(history, k=2, min_n=2, max_n=3) == [3, 5]  # "9 1 2" (n=3) beats "1 2"


def test_no_match_no_drafts_and_bounds():
    assert propose([1, 2, 3, 4], k=3, min_n=2, max_n=4) == []
    assert propose([7], k=3, min_n=1, max_n=2) == []  # nothing before the suffix
    assert propose([7, 7], k=3, min_n=1, max_n=2) == [7]  # "7" at 0, followed by 7
    assert propose([1, 2, 1, 2], k=0, min_n=1, max_n=2) == []
    with pytest.raises(ValueError, match="needs 1 <= min <= max"):
        propose([1, 2], k=2, min_n=3, max_n=2)
    assert propose_batch([[1, 2, 1], [4, 5]], k=2, min_n=1, max_n=2) == [[2, 1], []]


@pytest.mark.parametrize("window", [(1, 1), (2, 4), (1, 3), (3, 5)])
def test_the_incremental_index_agrees_with_the_full_search_as_a_history_grows(window):
    """``NgramIndex`` against ``propose`` on seeded histories over a small vocabulary (many
    repeats), asked after every appended token and after several at once, for k 0 to 5."""
    import numpy as np

    from mrv2_prof.runner.core.ngram_proposer import NgramIndex

    rng = np.random.default_rng(sum(window))
    for _ in range(20):
        history = rng.integers(0, 4, size=int(rng.integers(1, 6))).tolist()
        index = NgramIndex(*window)
        while len(history) < 80:
            k = int(rng.integers(0, 6))
            assert index.propose(history, k) == propose(history, k, *window), (history, k)
            history += rng.integers(0, 4, size=int(rng.integers(1, 4))).tolist()


def test_an_index_shown_a_shorter_history_starts_again():
    from mrv2_prof.runner.core.ngram_proposer import NgramIndex

    index = NgramIndex(1, 2)
    assert index.propose([1, 2, 3, 1, 2], 2) == [3, 1]
    assert index.propose([4, 5, 4], 2) == [5, 4]  # not [3, 1] from the old history
