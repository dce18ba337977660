"""Cross-checks on the GPU (``-m gpu``): what the always-on probes measure against CUPTI's kernel
intervals in the same steps of one run, and every planted host wait found at its line.

Each test prints the differences it measured (``-s`` shows them), so they can be quoted:
the phase busy time from the CUDA events (span − starved, ``probes.starvation``) against the
busy time from the kernel trace (its operations, and the gaps whose next operation was already
queued: ``store.device_busy``; the plain union of the kernel intervals is printed beside it),
within 5 % with CUDA graphs, and never above it eager (where the events rule is an upper bound
of the starvation); the run
overlap from the events against the overlap recomputed from the kernel trace alone (each step's
device busy intervals against the next step's host prep span); the sync sites of every planted
kind.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from mrv2_prof.probes.host_waits import HostWaits
from mrv2_prof.probes.overlap import step_columns
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.probes.session import ProbeSession
from mrv2_prof.probes.sync_finder import SyncFinder
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.store.device_busy import NO_LAUNCH, busy_intervals, union_ns

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
WINDOW = (12, 8)  # kernel-trace steps: first, count
PHASES = ("prepare", "forward", "sample")
PICKUP_NS = 40_000  # the device reaching a phase's end mark after its record, when it keeps up


def _engine(probe, preset: str, cudagraph_mode: str) -> Engine:
    config = RunnerConfig(
        device="cuda", kernels="triton", max_model_len=512, async_scheduling=True,
        cudagraph_mode=cudagraph_mode, cudagraph_capture_sizes=(64,), num_kv_blocks=2048,
    )  # fmt: skip
    return Engine(config, ModelSpec(preset=preset), probe)


@pytest.fixture(scope="module", params=[("llama-1b", "full_and_piecewise"), ("llama-1b", "none")])
def traced(request, tmp_path_factory):
    """One 64-request decode run with the GPU timeline and a kernel-trace window."""
    preset, mode = request.param
    probe = RecordingProbe()
    engine = _engine(probe, preset, mode)
    session = ProbeSession(
        {"cuda_events": True, "kernel_trace": True, "kernel_trace_steps": WINDOW},
        probe, "cuda", [], trace_dir=str(tmp_path_factory.mktemp("kt")),
    )  # fmt: skip
    for i in range(64):
        prompt = list(range(1 + i, 33 + i))
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=40, ignore_eos=True))
    with session.running():
        while engine.has_unfinished_requests():
            engine.step()
            session.after_step(engine.step_index - 1)
    facts: dict = {}
    session.finish(facts)
    out = probe.drain()
    kt = session.kernel_trace
    assert kt.error is None and kt.columns is not None, facts
    kernels = dict(kt.columns, launch_ns=np.where(kt.launch_ns < 0, NO_LAUNCH, kt.launch_ns))
    return f"{preset}/{mode}", out, kernels, kt.traced_steps


def _rows(cols, names):
    return list(zip(*(cols[n].tolist() for n in names), strict=True))


def test_phase_busy_time_from_the_events_matches_the_kernel_union(traced):
    label, out, kernels, steps = traced
    ks, ke, kl = kernels["start_ns"], kernels["end_ns"], kernels["launch_ns"]
    busy_ev = dict.fromkeys(PHASES, 0)
    busy_k = dict.fromkeys(PHASES, 0)
    union_k = dict.fromkeys(PHASES, 0)
    span_total = dict.fromkeys(PHASES, 0)
    spans = dict.fromkeys(PHASES, 0)
    for step, track, name, start, end, starved in _rows(
        out["spans"], ["step", "track", "name", "start_ns", "end_ns", "starved_ns"]
    ):
        if track != "gpu" or step not in steps[1:]:  # the window's first step: profiler warm-up
            continue
        span_total[name] += end - start
        spans[name] += 1
        busy_ev[name] += end - start - starved
        busy_k[name] += sum(b - a for a, b in busy_intervals(ks, ke, kl, start, end))
        union_k[name] += union_ns(ks, ke, start, end)
    for name in PHASES:
        diff = (busy_ev[name] - busy_k[name]) / max(busy_k[name], 1)
        print(f"{label} {name}: span {span_total[name] / 1e3:.1f} µs, busy from events "
              f"{busy_ev[name] / 1e3:.1f} µs, from the kernel trace {busy_k[name] / 1e3:.1f} µs "
              f"({diff:+.1%}; kernel union {union_k[name] / 1e3:.1f} µs)")  # fmt: skip
    total_ev, total_k = sum(busy_ev.values()), sum(busy_k.values())
    print(f"{label} all phases: busy from events {total_ev / 1e3:.1f} µs, from the kernel trace "
          f"{total_k / 1e3:.1f} µs ({(total_ev - total_k) / total_k:+.1%}; kernel union "
          f"{sum(union_k.values()) / 1e3:.1f} µs)")  # fmt: skip
    if label.endswith("/none"):
        # eager, host-paced: the events rule is an upper bound of starvation (probes.starvation),
        # up to the device's pick-up of the phase's last launch and end mark (PICKUP_NS a span)
        for name in PHASES:
            assert busy_ev[name] <= 1.05 * busy_k[name] + spans[name] * PICKUP_NS, name
    else:
        assert abs(busy_ev["forward"] - busy_k["forward"]) <= 0.05 * busy_k["forward"]
        assert abs(total_ev - total_k) <= 0.05 * total_k


def test_run_overlap_from_the_events_matches_the_kernel_trace(traced):
    label, out, kernels, steps = traced
    window = set(steps[1:])
    spans = _rows(out["spans"], ["step", "track", "name", "start_ns", "end_ns", "starved_ns"])
    prep_start: dict[int, int] = {}
    enqueue_end: dict[int, int] = {}
    gpu: dict[int, list[int]] = {}
    starved: dict[int, list[tuple[int, int]]] = {}
    for step, track, name, start, end, s in spans:
        if track == "cpu" and name == "schedule":
            prep_start[step] = min(prep_start.get(step, start), start)
        elif track == "cpu" and name == "execute":
            enqueue_end[step] = max(enqueue_end.get(step, end), end)
        elif track == "gpu":
            g = gpu.setdefault(step, [start, end])
            g[0], g[1] = min(g[0], start), max(g[1], end)
            if s > 0:
                starved.setdefault(step, []).append((start, start + s))
    order = sorted(s for s in gpu if s in prep_start and s in enqueue_end)
    cols = step_columns(
        np.array([prep_start[s] for s in order]), np.array([enqueue_end[s] for s in order]),
        np.array([gpu[s][0] for s in order]), np.array([gpu[s][1] for s in order]),
        [starved.get(s, []) for s in order],
    )  # fmt: skip
    ev_prep = ev_hidden = 0
    for s, prep, hidden in zip(order, cols["host_prep_ns"], cols["hidden_prep_ns"], strict=True):
        if s in window and s - 1 in window and prep is not None:
            ev_prep, ev_hidden = ev_prep + prep, ev_hidden + hidden
    # from the kernel trace alone: host prep of step N against the busy intervals of the
    # operations of step N-1 (from its first to its last)
    k_step = kernels["step"]
    k_prep = k_hidden = 0
    for s in sorted(window):
        if s - 1 not in window or s not in prep_start or s not in enqueue_end:
            continue
        mine = k_step == s - 1
        if not mine.any():
            continue
        starts, ends = kernels["start_ns"][mine], kernels["end_ns"][mine]
        busy = busy_intervals(starts, ends, kernels["launch_ns"][mine], starts.min(), ends.max())
        k_prep += enqueue_end[s] - prep_start[s]
        k_hidden += sum(max(0, min(b, enqueue_end[s]) - max(a, prep_start[s])) for a, b in busy)
    ov_ev, ov_k = ev_hidden / ev_prep, k_hidden / k_prep
    print(f"{label} overlap over the window: events {ov_ev:.3f}, kernel trace {ov_k:.3f} "
          f"({(ov_ev - ov_k) * 100:+.1f} points)")  # fmt: skip
    assert abs(ov_ev - ov_k) <= 0.05


PLANTED = """
def planted_waits(x, event):
    torch.cuda.synchronize()
    torch.cuda.current_stream().synchronize()
    event.synchronize()
    x.max().item()
    x[:4].tolist()
    x[:4].cpu()
    torch.ones(8, dtype=torch.int32).to(x.device, non_blocking=True)
    torch.empty(4, dtype=x.dtype).copy_(x[:4], non_blocking=True)
    torch._C._cuda_synchronize()
"""
PLANTED_KINDS = ["device_sync", "stream_sync", "event_sync", "implicit", "implicit", "d2h_copy",
                 "copy", "copy"]  # fmt: skip
PLANTED_FILE = os.path.join(
    os.path.dirname(__import__("mrv2_prof").__file__), "runner", "worker", "planted_waits.py"
)


def test_every_planted_wait_kind_is_found_at_its_line(monkeypatch, tmp_path):
    """Planted waits compiled as code of mrv2_prof/runner (the site is their own line), run
    inside the step loop at step 14; a kernel-trace window over steps 13..15 finds the wait made
    below torch's Python (``torch._C._cuda_synchronize``), which the wrappers cannot see."""
    from mrv2_prof.runner.worker import model_runner

    namespace: dict = {"torch": torch}
    exec(compile(PLANTED, PLANTED_FILE, "exec"), namespace)
    planted = namespace["planted_waits"]
    probe = RecordingProbe()
    engine = _engine(probe, "llama-tiny", "none")
    event = torch.cuda.Event()
    original = model_runner.ModelRunner._prepare_inputs

    def prepare_inputs(self, so):
        batch = original(self, so)
        if engine.step_index == 14:
            event.record()
            planted(batch.seq_lens, event)
        return batch

    monkeypatch.setattr(model_runner.ModelRunner, "_prepare_inputs", prepare_inputs)
    session = ProbeSession(
        {"kernel_trace": True, "kernel_trace_steps": (13, 3)}, probe, "cuda", [],
        trace_dir=str(tmp_path),
    )  # fmt: skip
    for i in range(8):
        engine.add_request(f"r{i}", list(range(1 + i, 20 + i)), SamplingParams(max_tokens=24))
    with SyncFinder(probe), HostWaits(probe), session.running():
        while engine.has_unfinished_requests():
            engine.step()
            session.after_step(engine.step_index - 1)
    session.finish({})
    s = probe.drain()["syncs"]
    found = [
        (int(step), str(kind), str(site), int(b))
        for step, kind, site, b in zip(
            s["step"], s["kind"], s["site"], s["blocked_ns"], strict=True
        )
        if kind != "output_wait"
    ]
    for row in found:
        print("found", row)
    first = 3  # the planted function's first body line in PLANTED
    want = [
        (14, kind, f"mrv2_prof/runner/worker/planted_waits.py:{first + i}")
        for i, kind in enumerate(PLANTED_KINDS)
    ]
    assert [(st, k, site) for st, k, site, _ in found if not site.startswith("<")] == want
    assert all(b >= 0 for *_, b in found[: len(want)])
    below = [(st, k) for st, k, site, _ in found if site.startswith("<kernel trace")]
    assert below == [(14, "device_sync")], found
