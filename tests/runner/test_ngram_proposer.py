"""Prompt-lookup drafts (``spec_decode/ngram_proposer.py``) on hand-worked histories."""

from __future__ import annotations

import pytest

from mrv2_prof.runner.spec_decode.ngram_proposer import propose, propose_batch


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
