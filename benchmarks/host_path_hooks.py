"""Parts (c) hooks and (e) flush of ``host_path.py``: the recording probe's own cost, its hooks
replayed without the engine.

(c) the hooks one decode step calls, as the engine, the runner and the output wait call them,
replayed (the flush timed apart); on CUDA also with the GPU timeline, its event records and
resolution, the device idle and busy. (e) the step loop's part of one hand-off to the store
writer (the probe's buffer swap after ``--flush-steps`` decode steps), with the arrays given back
between hand-offs as the writer gives them back.
"""

from __future__ import annotations

import statistics
from typing import Any

from host_path_runs import number


def part_hooks(args) -> list[dict]:
    """The probes' own cost per decode step: the hooks one step of ``batch`` decodes calls (as
    the engine, the runner and the output wait call them, with what they pass: the output
    indices a numpy column from the columnar decode step, no first token), replayed, median of
    many steps. The probe is a default run's: NVTX ranges on, no tool attached. On CUDA also
    with the GPU timeline of a default run attached (``cuda_events``): the step's four marks
    (an event record each; the last one is the output's ready event, which a run without the
    timeline records anyway: ``output_event_us`` times that bare record, to be taken off) and
    the resolution of the finished steps, where the output wait (``before_wait``) and the
    harness (``backstop``) call it; the device idle (every wait finds
    the output ready: a host-bound run) and busy (a 1 ms device step; the time spent while it
    still ran is not the loop's)."""
    import time

    import numpy as np
    import torch

    from mrv2_prof.probes import api as probes
    from mrv2_prof.probes.recording import RecordingProbe
    from mrv2_prof.runner.core.steady_decode import COLUMNS_FROM

    try:
        from mrv2_prof.probes.nvtx_ranges import NvtxRecordingProbe as DefaultProbe
    except ImportError:  # no nvtx package: a default run records without it
        DefaultProbe = RecordingProbe
    cuda = torch.cuda.is_available() and not args.quick
    sides = ["hooks"] + (["timeline_idle", "timeline_busy"] if cuda else [])
    results = []
    # The first batch once more, first and not reported: the first side timed in a process
    # was slower whichever batch it was (the device-busy timeline: 61.0 µs at batch 256 first,
    # 36.5 µs at batch 256 last, on the H200).
    for warm_up, batch in ((True, args.batches[0]), *((False, b) for b in args.batches)):
        row: dict[str, Any] = {"part": "hooks", "batch": batch}
        for side in sides:
            probe = DefaultProbe()
            timeline = ready = None
            if side != "hooks":
                from mrv2_prof.probes.gpu_timeline import GpuTimeline

                timeline = GpuTimeline(probe.gpu_span, with_starved=True)
                timeline.anchor()
                probe.timeline = timeline
                ready = torch.cuda.Event()
            ids = [f"req-{i}" for i in range(batch)]
            tokens = list(range(batch))
            per_step = []
            for step in range(2000):
                idx = np.full(batch, step + 1) if batch >= COLUMNS_FROM else [step + 1] * batch
                t0 = time.perf_counter_ns()
                skip = 0  # ns of this step that are not the probes' (device work, the wait)
                p = probe
                p.step_begin(step)  # engine
                p.begin(probes.SCHEDULE)
                p.switch(probes.SCHEDULE, probes.EXECUTE)
                p.begin(probes.PREPARE)  # runner
                p.gpu_mark(probes.G_PREPARE)
                p.staged_write("block_table", 3, 3, 12, 4096)
                p.switch(probes.PREPARE, probes.FORWARD)
                p.graph_dispatch(batch, batch, "full", "full", True, "captured")
                p.gpu_mark(probes.G_FORWARD)
                if side == "timeline_busy":  # a device step of about 1 ms (not timed)
                    t1 = time.perf_counter_ns()
                    torch.cuda._sleep(2_000_000)
                    skip += time.perf_counter_ns() - t1
                p.switch(probes.FORWARD, probes.SAMPLE)
                p.gpu_mark(probes.G_SAMPLE)
                p.end(probes.SAMPLE)
                end = p.gpu_mark(probes.G_END)  # the output's queue marks it after its copies
                if end is not None:  # the output waits on the timeline's end event
                    ready = end
                elif ready is not None:  # the output's own event (not timed)
                    t1 = time.perf_counter_ns()
                    ready.record()
                    skip += time.perf_counter_ns() - t1
                p.end(probes.EXECUTE)
                if ready is not None:  # the output wait: the probe's turn first, then the wait
                    t1 = time.perf_counter_ns()
                    p.before_wait(ready)
                    t2 = time.perf_counter_ns()
                    # its work while the device still ran cost the loop nothing (the query is
                    # the benchmark's own); a device done meanwhile: all of it counted
                    skip += time.perf_counter_ns() - (t2 if ready.query() else t1)
                    t1 = time.perf_counter_ns()
                    ready.synchronize()
                    skip += time.perf_counter_ns() - t1
                p.begin(probes.OUTPUT_WAIT)
                p.end(probes.OUTPUT_WAIT)
                p.sync("output_wait", "async_output", 1000)
                p.begin(probes.UPDATE)  # engine
                p.end(probes.UPDATE)
                p.step_tokens(ids, idx, t0, tokens, False)
                p.step_end(batch, batch, 0, 0, batch, 100, 0, 1000, "full")
                if timeline is not None:  # the harness, after the step
                    timeline.backstop()
                per_step.append(time.perf_counter_ns() - t0 - skip)
                if probe.fill > 0.5:
                    t1 = time.perf_counter_ns()
                    probe.swap()
                    per_step[-1] -= time.perf_counter_ns() - t1  # the flush is timed apart
            row[f"{side}_us" if side != "hooks" else "step_us"] = (
                statistics.median(per_step[100:]) / 1e3
            )
            if timeline is not None:
                timeline.finish()
        if cuda:  # what a run without the probes records a step anyway: its output event
            own, times = torch.cuda.Event(), []
            for _ in range(2000):
                t1 = time.perf_counter_ns()
                own.record()
                times.append(time.perf_counter_ns() - t1)
            torch.cuda.synchronize()
            row["output_event_us"] = statistics.median(times[100:]) / 1e3
        if not warm_up:
            results.append(row)
    return results


def part_flush(args) -> list[dict]:
    """The hand-off on the step loop (``probe.swap()``, what the harness's ``flush`` does
    before the writer thread takes over), after ``--flush-steps`` decode steps per batch."""
    import time

    from mrv2_prof.probes import api as probes
    from mrv2_prof.probes.recording import RecordingProbe

    results = []
    for batch in args.batches:
        probe = RecordingProbe()
        ids = [f"req-{i}" for i in range(batch)]
        for rid in ids:
            probe.request_arrival(rid, 1, 16)
        tokens, per_flush, handed, step = list(range(batch)), [], None, 0
        for _ in range(12):
            for _ in range(args.flush_steps):
                probe.step_begin(step)
                for phase in (probes.SCHEDULE, probes.EXECUTE, probes.UPDATE):
                    probe.begin(phase)
                    probe.end(phase)
                probe.sync("output_wait", "async_output", 1000)
                probe.step_tokens(ids, [step] * batch, step, tokens)
                probe.step_end(batch, batch, 0, 0, batch, 100, 0, 1000, "full")
                step += 1
            t0 = time.perf_counter_ns()
            handoff = probe.swap()
            per_flush.append(time.perf_counter_ns() - t0)
            if handed is not None:  # the writer thread's part, done by now in a run
                probe.give_back(handed)
            handed = handoff
        results.append(
            {"part": "flush", "batch": batch, "steps": args.flush_steps,
             "flush_us": statistics.median(per_flush[2:]) / 1e3}
        )  # fmt: skip
    return results


def markdown_hooks(results: list[dict]) -> list[str]:
    """Part (c)'s lines: the hooks' cost per batch, with the GPU timeline where it ran."""
    lines = []
    hooks = [r for r in results if r["part"] == "hooks"]
    if hooks:
        lines += [
            "Recording probe, hooks of one decode step (median µs): "
            + ", ".join(f"batch {r['batch']}: {r['step_us']:.1f}" for r in hooks),
            "",
        ]
        if any("timeline_idle_us" in r for r in hooks):
            lines += [
                "The same with the GPU timeline (four event records, the steps resolved), on the "
                "step loop, the device idle (each wait finds the output ready: the backstop "
                "resolves) / busy (a 1 ms device step: the output wait resolves): "
                + ", ".join(
                    f"batch {r['batch']}: {number(r.get('timeline_idle_us'))} / "
                    f"{number(r.get('timeline_busy_us'))}"
                    for r in hooks
                ),
                "",
                "The last of the four records is the output's ready event, which a run without "
                "probes records too (a bare `record()`, median µs): "
                + ", ".join(
                    f"batch {r['batch']}: {number(r.get('output_event_us'))}" for r in hooks
                )
                + ". The probes' cost is the figures above less that.",
                "",
            ]
    return lines


def markdown_flush(results: list[dict]) -> list[str]:
    """Part (e)'s line: the hand-off's cost per batch."""
    lines = []
    flush = [r for r in results if r["part"] == "flush"]
    if flush:
        lines += [
            "Flush on the step loop, the hand-off alone (median µs): "
            + ", ".join(
                f"batch {r['batch']} x {r['steps']} steps: {r['flush_us']:.1f}" for r in flush
            ),
            "",
        ]
    return lines
