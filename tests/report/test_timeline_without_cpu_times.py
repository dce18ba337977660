"""The step timeline on steps without CPU times (rows written by hand, or NULLs where a writer
left them): a figure from the steps that have them, or "not measured" with the reason, never a
crash on NaN."""

from __future__ import annotations

import numpy as np

from mrv2_prof.analysis.run_data import RunData
from mrv2_prof.report.figure_meta import NotMeasured
from mrv2_prof.report.timeline import timeline

NAN = float("nan")
EMPTY_SPANS = {"step": np.array([], np.int64), "name": np.array([], object),
               "start_ns": np.array([], np.int64), "end_ns": np.array([], np.int64)}  # fmt: skip


def run_data(starts: list[float], ends: list[float]) -> RunData:
    n = len(starts)
    steps = {
        "step": np.arange(n),
        "cpu_start_ns": np.array(starts, np.float64),
        "cpu_end_ns": np.array(ends, np.float64),
        "gpu_start_ns": np.full(n, NAN),
        "gpu_end_ns": np.full(n, NAN),
    }
    return RunData(
        run_id="r1", label="hand-made", scenario_name="s", scenario_yaml="", status="completed",
        device="cpu", started_ns=0, info={}, scenario={}, steps=steps, cpu_spans=EMPTY_SPANS,
        gpu_spans=EMPTY_SPANS, detail_window=(0, n - 1), syncs={}, dispatch_reasons={},
        captures={}, staged_by_tensor={}, staged_by_step={},
    )  # fmt: skip


def test_no_cpu_time_on_any_step_is_not_measured_with_the_column_named():
    fig = timeline(run_data([NAN, NAN], [NAN, NAN]))
    assert isinstance(fig, NotMeasured)
    assert fig.why == "no step has a CPU start time (steps.cpu_start_ns)"


def test_the_steps_with_cpu_times_are_drawn_from_the_first_of_them():
    # step 0 has no times; steps 1 and 2 ran 2-3 ms and 5-9 ms after perf_counter 1e9 ns
    starts, ends = [NAN, 1_002_000_000, 1_005_000_000], [NAN, 1_003_000_000, 1_009_000_000]
    fig = timeline(run_data(starts, ends))
    assert not isinstance(fig, NotMeasured)
    (cpu,) = [t for t in fig.data if t.name == "CPU step"]
    xs = [x for x in cpu.x if x is not None and not np.isnan(x)]
    assert min(xs) == 0.0 and max(xs) == 7.0  # ms from the first timed step's start (1.002e9)
    assert tuple(fig.layout.xaxis.range) == (0.0, 7.0)  # the window, NaN left out
