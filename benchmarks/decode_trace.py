"""What a profiler window of decode steps says about its kernels (``decode_roofline.py``'s trace):
how many ran per step and from which launch, the gaps inside a FULL graph's replay, and per op of
the model the device time and how far it is from its roof.

``count_kernels`` reads a Chrome trace (torch.profiler's) of ``steps`` steps. Each kernel is put
with the launch that made it (its correlation id): a ``cudaGraphLaunch`` (inside a graph) or an
eager launch. Per step: kernels by launch, copies and fills, device time, the kernels taking the
most time (a replay's kernels by their own time, ``kernel_roofline.own_ns``: under programmatic
dependent launch a kernel starts before the one ahead of it ends and waits), and the in-graph gaps
(device time inside a replay with no kernel running). Given the model's layer count, each replay's
kernels in start order are put with the model's ops (``analysis/kernel_ops.attribute_step``: GEMMs
by order, our Triton kernels by name); a replay that is not the forward (the sampling graph) is
left out. ``op_roofs`` then gives each op's bytes and FLOPs per step from the engine's per-op cost
(``analysis/kernel_roofline``'s ``op_bytes_flops`` at the step's tokens, rows, context and pairs),
its share of the binding roof and the time closing it would save: the kernels a missed target
points at.
"""

from __future__ import annotations

import collections
import json

from mrv2_prof.analysis.kernel_ops import OTHER, UNATTRIBUTED, attribute_step
from mrv2_prof.analysis.kernel_roofline import launch_bound, op_bytes_flops, op_row, own_ns

GRAPH_LAUNCHES = ("cudaGraphLaunch", "cudaGraphLaunch_v10000")


def count_kernels(trace_path: str, steps: int, layers: int | None = None) -> dict:
    """Kernels per step in a Chrome trace of ``steps`` steps, split by the launch that made
    them, the kernels that take the most device time per step, the in-graph gaps and (given
    ``layers``) each op's launches and device time per step inside the forward's replays."""
    with open(trace_path) as f:
        events = json.load(f).get("traceEvents", [])
    launches = {  # correlation id -> API call, of the calls made inside the window
        (e.get("args") or {}).get("correlation"): e.get("name")
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
    }
    counts: collections.Counter[str] = collections.Counter()
    time_us: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    in_graph: dict[object, list[tuple[float, float, str]]] = collections.defaultdict(list)
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X" or cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        launch = launches.get((e.get("args") or {}).get("correlation"))
        if launch is None:  # launched before the window opened (async: the step before)
            counts["before_window"] += 1
        elif cat != "kernel":
            counts[cat] += 1
        else:
            counts["graph" if launch in GRAPH_LAUNCHES else "eager"] += 1
            name = str(e.get("name"))
            if launch in GRAPH_LAUNCHES:  # the kernels of one replay: (start, end, name)
                start = float(e.get("ts", 0.0))
                dur = float(e.get("dur", 0.0))
                in_graph[e["args"]["correlation"]].append((start, start + dur, name))
            else:
                time_us[name] += float(e.get("dur", 0.0))
            calls[name] += 1
    replays = []  # each replay's kernels in start order, with their own times (PDL overlaps them)
    for kernels in in_graph.values():
        kernels.sort()
        replays.append((kernels, own_ns([k[:2] for k in kernels])))
        for us, (_, _, name) in zip(replays[-1][1], kernels, strict=True):
            time_us[name] += us
    top = [
        {"kernel": name[:120], "us_per_step": us / steps, "calls_per_step": calls[name] / steps}
        for name, us in time_us.most_common(8)
    ]
    out = {
        "graph_kernels_per_step": counts["graph"] / steps,
        "eager_kernels_per_step": counts["eager"] / steps,
        "memcpy_per_step": counts["gpu_memcpy"] / steps,
        "memset_per_step": counts["gpu_memset"] / steps,
        "launched_before_window": counts["before_window"],
        "kernel_us_per_step": sum(time_us.values()) / steps,
        "graph_gap_us_per_step": sum(_idle(k) for k in in_graph.values()) / steps,
        "top_kernels": top,
    }
    if layers is not None:
        out["ops_per_step"] = _ops(replays, layers, steps)
    return out


def _idle(kernels: list[tuple[float, float, str]]) -> float:
    """Device time inside one graph replay with no kernel running: the sum of the gaps between
    a kernel's end (the latest so far) and the next one's start. It is what launching a kernel
    costs between two others (programmatic dependent launch and fewer kernels shrink it)."""
    idle, end = 0.0, None
    for start, stop, _ in sorted(kernels):
        if end is not None and start > end:
            idle += start - end
        end = stop if end is None else max(end, stop)
    return idle


def _ops(replays, layers: int, steps: int) -> dict[str, dict[str, float]]:
    """Per op of the forward's replays (each its kernels in start order and their own times,
    ``kernel_roofline.own_ns``: a kernel launched early under programmatic dependent launch does
    not count its wait for the one before it): launches and device µs per step; a replay whose
    kernels do not follow the forward's pattern, such as the sampling graph, is left out."""
    ops: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"launches": 0, "us": 0})
    for kernels, own in replays:
        attributed, why = attribute_step([name for _, _, name in kernels], layers)
        if why is not None:
            continue
        for us, k in zip(own, attributed, strict=True):
            if k.op in (OTHER, UNATTRIBUTED):
                continue
            ops[k.op]["launches"] += 0 if k.joins else 1
            ops[k.op]["us"] += us
    return {op: {key: v / steps for key, v in t.items()} for op, t in ops.items()}


def op_roofs(
    ops: dict[str, dict[str, float]],
    cost_ops: dict[str, dict[str, int]],
    counts: tuple[float, float, float, float],  # a step's tokens, logits rows, context, pairs
    bandwidth: float,
    peak: float | None,
) -> list[dict]:
    """Each op's bytes and FLOPs per step, its share of the binding roof (the tool's per-op
    roofline, ``kernel_roofline.op_row``), and the µs per step that reaching the roof would
    save; the most to save first."""
    peaks = {"hbm_read_bytes_per_s": bandwidth, "tensor_flops_per_s": peak}
    all_ns = sum(t["us"] for t in ops.values()) * 1e3
    rows = []
    for op, t in ops.items():
        if op not in cost_ops or t["us"] <= 0:
            continue
        nbytes, flops = op_bytes_flops(cost_ops[op], tuple(round(c) for c in counts))
        nbytes, flops = nbytes * t["launches"], flops * t["launches"]
        r = op_row(op, [t["launches"], t["us"] * 1e3, nbytes, flops], 1, all_ns, peaks, True)
        roof_us = r.fraction * t["us"]
        rows.append({
            "op": op, "launches": t["launches"], "us": t["us"], "bytes": nbytes, "flops": flops,
            "roof_us": roof_us, "of_roof": r.fraction, "to_gain_us": t["us"] - roof_us,
            "launch_bound": launch_bound(r),  # under 2 µs of work a launch at the roof
        })  # fmt: skip
    return sorted(rows, key=lambda r: -r["to_gain_us"])
