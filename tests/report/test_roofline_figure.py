"""The report's roofline chart (report/roofline_figure.py): each counted step a point at its
FLOPs per byte and achieved TFLOP/s, the roof at bandwidth x intensity capped by the peak."""

from __future__ import annotations

import pytest

from mrv2_prof.analysis.roofline import run_roofline
from mrv2_prof.report.figure_meta import NotMeasured
from mrv2_prof.report.roofline_figure import roofline_figure
from tests.analysis.test_roofline import _run


def test_each_step_is_a_point_under_the_roof(tmp_path):
    steps = [
        (0, 1, 1000, 1000, 0, 1000, 500_500, 0, 30_000, False),  # prefill, worked in test_roofline
        (1, 2, 2, 0, 0, 500, 500, 30_000, 33_000, False),  # decode
    ]
    with _run(tmp_path, steps) as store:
        fig = roofline_figure(run_roofline(store, "r"))
    decode, prefill, roof = fig.data
    assert (decode.name, prefill.name, roof.name) == ("decode", "prefill", "roof")
    # decode: 1,504,200 bytes, 2.6e6 FLOPs in 3 us -> 1.7285 FLOP/byte, 0.8667 TFLOP/s
    assert decode.x[0] == pytest.approx(2.6e6 / 1_504_200)
    assert decode.y[0] == pytest.approx(2.6e6 / 3e-6 / 1e12)
    assert prefill.y[0] == pytest.approx(1.50055e9 / 30e-6 / 1e12)
    # the roof: 1 TB/s x intensity, capped at 100 TFLOP/s
    assert max(roof.y) == pytest.approx(100.0)
    assert all(y <= min(x, 100.0) * (1 + 1e-9) for x, y in zip(roof.x, roof.y, strict=True))
    assert fig.layout.meta["steps"] == 2


def test_a_run_without_a_roofline_says_why(tmp_path):
    info = {"machine_peaks": {"note": "the CPU has no device timeline"}}
    with _run(tmp_path, [(0, 1, 1, 0, 0, 5, 5, None, None, False)], info) as store:
        fig = roofline_figure(run_roofline(store, "r"))
    assert isinstance(fig, NotMeasured) and fig.why == "the CPU has no device timeline"
