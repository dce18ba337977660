"""Kernel trace: attribution of profiler kernels to steps and phases (hand-built Chrome trace
events on CPU), the CLI refusing it under Nsight Systems, and a real window on the GPU."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from mrv2_prof.probes import kernel_trace, recording
from mrv2_prof.probes.api import FORWARD, PREPARE, SAMPLE, STEP
from mrv2_prof.probes.kernel_trace import (
    ANCHOR_NAME,
    ANCHOR_TRIES,
    KernelTrace,
    attribute,
    clock_offset,
)
from mrv2_prof.probes.recording import RecordingProbe

ROOT = Path(__file__).resolve().parents[2]


def test_kernels_get_the_step_and_phase_of_their_launch_on_the_run_clock():
    # profiler clock (µs) = perf_counter_ns / 1000 - 5000 µs: the anchor at ts 100 µs was
    # recorded at perf_counter_ns 5_100_000
    events = [
        {"ph": "X", "name": ANCHOR_NAME, "ts": 100.0, "dur": 1.0, "cat": "user_annotation"},
        {"ph": "X", "name": "cudaLaunchKernel", "ts": 205.0, "dur": 2, "args": {"correlation": 1}},
        {"ph": "X", "name": "cuLaunchKernel", "ts": 310.0, "dur": 2, "args": {"correlation": 2}},
        {"ph": "X", "name": "cudaGraphLaunch", "ts": 420.0, "dur": 5, "args": {"correlation": 3}},
        {"ph": "X", "name": "cudaLaunchKernel", "ts": 495.0, "dur": 1, "args": {"correlation": 4}},
        {"ph": "X", "name": "cudaLaunchKernel", "ts": 900.0, "dur": 1, "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "copy_k", "ts": 210.0, "dur": 3.5,
         "args": {"correlation": 1, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "triton_prep", "ts": 315.0, "dur": 4.0,
         "args": {"correlation": 2, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "gemm_a", "ts": 430.0, "dur": 10.0,
         "args": {"correlation": 3, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "gemm_b", "ts": 441.0, "dur": 10.0,
         "args": {"correlation": 3, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "between", "ts": 500.0, "dur": 1.0,
         "args": {"correlation": 4, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "outside", "ts": 905.0, "dur": 1.0,
         "args": {"correlation": 5, "stream": 9}},
        {"ph": "X", "cat": "kernel", "name": "orphan", "ts": 950.0, "dur": 1.0,
         "args": {"correlation": 99, "stream": 9}},
    ]  # fmt: skip
    us = 1000
    base = 5_000_000  # perf_counter_ns of profiler ts 0
    spans = [  # host spans of step 3 on the run clock
        (base + 150 * us, base + 600 * us, 3, STEP),
        (base + 200 * us, base + 350 * us, 3, PREPARE),
        (base + 400 * us, base + 450 * us, 3, FORWARD),
        (base + 460 * us, base + 480 * us, 3, SAMPLE),
    ]
    cols = attribute(events, spans, anchor_ns=base + 100 * us)
    got = list(zip(*(cols[k].tolist() for k in cols), strict=True))
    assert list(cols) == ["step", "phase", "name", "start_ns", "end_ns", "stream"]
    assert got == [
        (3, "prepare", "copy_k", base + 210 * us, base + 213_500, 7),
        (3, "prepare", "triton_prep", base + 315 * us, base + 319 * us, 7),
        (3, "forward", "gemm_a", base + 430 * us, base + 440 * us, 7),  # graph replay: both
        (3, "forward", "gemm_b", base + 441 * us, base + 451 * us, 7),
        (3, "step", "between", base + 500 * us, base + 501 * us, 7),  # in the step, no phase
        (-1, None, "outside", base + 905 * us, base + 906 * us, 9),  # launched after the step
        (-1, None, "orphan", base + 950 * us, base + 951 * us, 9),  # no launch found
    ]


def test_a_trace_without_the_anchor_is_an_error():
    with pytest.raises(ValueError, match="no anchor"):
        attribute([{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0}], [], 0)


def test_a_window_attributes_by_the_probes_host_spans_not_its_device_spans(tmp_path, monkeypatch):
    """A one-step window on the CPU with a stand-in profiler: the spans it keeps are the host
    spans the probe recorded for the step; a device span of the same step (on the GPU's time,
    overlapping the host's) is not one of them."""
    anchor = {"ph": "X", "name": ANCHOR_NAME, "ts": 0.0, "dur": 0.0, "cat": "user_annotation"}
    events = [
        *[anchor] * ANCHOR_TRIES,  # every try of the anchor, each between stamps of 0 ns
        {"ph": "X", "name": "cudaLaunchKernel", "ts": 1.2, "dur": 0.1, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.3, "dur": 0.2,
         "args": {"correlation": 1, "stream": 7}},
    ]  # fmt: skip

    class Profile:  # torch.profiler.profile, exporting ``events``
        def __init__(self, activities) -> None:
            pass

        def __enter__(self) -> Profile:
            return self

        def __exit__(self, *exc) -> None:
            pass

        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text(json.dumps({"traceEvents": events}))

    monkeypatch.setattr(torch.profiler, "profile", Profile)
    monkeypatch.setattr(torch.profiler, "record_function", lambda name: contextlib.nullcontext())
    monkeypatch.setattr(kernel_trace, "perf_counter_ns", lambda: 0)  # the anchor: profiler ts 0
    host = iter([1000, 1100, 1500, 1600, 1700, 2000])  # step, prepare, forward, step end
    monkeypatch.setattr(recording, "perf_counter_ns", lambda: next(host))

    trace = KernelTrace(start=0, count=1, trace_dir=str(tmp_path))
    p = RecordingProbe()
    p.step_begin(0)
    for phase in (PREPARE, FORWARD):
        p.begin(phase)
        p.end(phase)
    p.gpu_span(0, 1, 1150, 1400)  # the device's forward, around the launch at 1200 ns
    p.step_end(1, 1, 1, 0, 1, 1, 0, 0, "none")
    trace.after_step(0, p)

    assert trace.error is None and trace.steps_traced == 1
    got = {k: v.tolist() for k, v in trace.columns.items()}
    assert got == {"step": [0], "phase": ["prepare"], "name": ["k"], "start_ns": [1300],
                   "end_ns": [1500], "stream": [7]}  # fmt: skip
    assert trace.launch_ns.tolist() == [1300]  # the launch call returned at 1.2 + 0.1 µs


def test_the_clock_offset_comes_from_the_tightest_anchor_midpoint():
    """Three anchors: the first range cost the profiler 60 µs (stamps 40..110 µs around it),
    the second 2 µs (stamps 200..203 µs), the third 3 µs. The second is the tightest: the
    midpoint of its profiler range (5,001 µs) is the midpoint of its stamps (201.5 µs)."""
    us = 1000
    events = [
        {"ph": "X", "name": ANCHOR_NAME, "ts": 4840.0, "dur": 60.0},
        {"ph": "X", "name": ANCHOR_NAME, "ts": 5000.0, "dur": 2.0},
        {"ph": "X", "name": ANCHOR_NAME, "ts": 5100.0, "dur": 3.0},
    ]
    stamps = [(40 * us, 110 * us), (200 * us, 203 * us), (299 * us, 303 * us)]
    assert clock_offset(events, stamps) == 201_500 - 5_001_000
    assert clock_offset(events, 7 * us) == 7 * us - 4_840_000  # one stamp: the first's start
    with pytest.raises(ValueError, match="3 anchor events in the trace for 2 stamps"):
        clock_offset(events, stamps[:2])


def test_the_cli_refuses_a_kernel_trace_under_nsight_systems(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mrv2_prof.cli import app

    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "1")
    res = CliRunner().invoke(
        app,
        ["run", str(ROOT / "scenarios/quickstart.yaml"), "--headless", "--db",
         str(tmp_path / "r.duckdb"), "--set", "probes.kernel_trace=true"],
    )  # fmt: skip
    assert res.exit_code == 2
    assert "probes.kernel_trace: cannot run under Nsight Systems" in res.output
    assert not (tmp_path / "r.duckdb").exists()  # refused before anything was written


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_kernel_trace_window_on_the_gpu_fills_the_kernels_table(run_in_process):
    import duckdb

    job, _ = run_in_process(
        "runner.device=cuda", "probes.kernel_trace=true", "probes.kernel_trace_steps=[3,4]"
    )
    con = duckdb.connect(job.db_path, read_only=True)
    rows = con.execute("SELECT step, phase, name, start_ns, end_ns FROM kernels").fetchall()
    info = con.execute("SELECT info FROM runs").fetchone()[0]
    assert rows, info
    steps = {r[0] for r in rows if r[0] is not None}
    assert steps <= {3, 4, 5, 6} and len(steps) >= 3, steps
    phases = {r[1] for r in rows}
    assert {"prepare", "forward", "sample"} <= phases, phases
    assert all(e >= s for *_, s, e in rows)
    # attributed kernels start after their step's host span began (launch precedes execution)
    bad = con.execute(
        "SELECT count(*) FROM kernels k JOIN spans s ON s.step = k.step AND s.track = 'cpu' "
        "AND s.name = 'step' WHERE k.start_ns < s.start_ns"
    ).fetchone()[0]
    assert bad == 0
