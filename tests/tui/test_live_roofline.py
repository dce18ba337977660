"""The dashboard's live roofline (pipeline/live_roofline.py): the recent decode steps paired by
step with their device times, each figure as analysis/roofline.py computes it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mrv2_prof.pipeline.live_roofline import WINDOW, LiveRoofline
from tests.analysis.test_roofline import COST, PEAKS


def _buffer(rows: list[tuple[int, ...]]) -> SimpleNamespace:
    names = ("step", "num_reqs", "num_tokens", "num_prefill_tokens", "num_draft_tokens",
             "context_tokens", "attn_pairs")  # fmt: skip
    return SimpleNamespace(**{n: np.array([r[i] for r in rows]) for i, n in enumerate(names)})


def test_the_median_of_the_paired_decode_steps():
    roof = LiveRoofline.of(COST, PEAKS)
    rows = [
        (0, 1, 1000, 1000, 0, 1000, 500_500),  # prefill: left out
        (1, 2, 2, 0, 0, 500, 500),  # 1,504,200 bytes (test_roofline): 1.5042 us at 1 TB/s
        (2, 2, 2, 0, 0, 500, 500),
        (3, 2, 2, 0, 0, 500, 500),  # no device time yet: left out
    ]
    roof.add_steps(_buffer(rows), 0, 4)
    # step 1 in 3 us (50.14 %), step 2 in 6 us (25.07 %): the median of the two
    frac = roof.decode_fraction([(0, 30_000), (1, 3_000), (2, 6_000)])
    assert frac == pytest.approx((1.5042 / 3 + 1.5042 / 6) / 2)


def test_no_roofline_without_peaks_or_cost_and_old_steps_are_dropped():
    assert LiveRoofline.of(COST, {"note": "the CPU has no device timeline"}) is None
    assert LiveRoofline.of({}, PEAKS) is None
    roof = LiveRoofline.of(COST, PEAKS)
    n = WINDOW + 10
    roof.add_steps(_buffer([(i, 1, 1, 0, 0, 1, 1) for i in range(n)]), 0, n)
    assert roof.decode_fraction([(0, 1000)]) is None  # step 0 left the window
    assert roof.decode_fraction([(n - 1, 1000)]) is not None
