"""The roofline per op of the model, over the steps whose kernels were recorded (the kernel-trace
window, ``probes.kernel_trace``, or an ``nsys import``).

Each kernel of a recorded step is put with its op and layer (``kernel_ops.py``: our Triton
kernels by name, GEMMs by their order in the forward). Per op, over the window's steps:

* launches per step and device time per step: each kernel's *own* time, summed (``own_ns``: from
  its start or the end of the kernels before it, whichever is later, to its end). A kernel
  launched early under programmatic dependent launch starts while its predecessor runs and waits
  for it; its own time leaves that wait to the predecessor, so the ops' times add up to the
  step's busy device time, never more (the notes give the overlap a step had);
* bytes and FLOPs per step: per launch, the op's ``runs.info['step_cost']['ops']`` entry at the
  step's counts (``weight_bytes`` + ``bytes_per_token`` x tokens + ``bytes_per_row`` x logits
  rows + ``bytes_per_context`` x context tokens; FLOPs per token, row and query-key pair
  likewise), summed over the op's launches (a GEMM's split-K reduction adds time, not bytes);
* achieved TB/s and TFLOP/s: bytes and FLOPs over the op's device time;
* the fraction of the roof: max(bytes / HBM read bandwidth, FLOPs / tensor-core peak) over the
  device time (peaks of ``runs.info['machine_peaks']``), and which roof binds.

``other`` (sampling, input preparation, copies) and ``unattributed`` kernels have time only.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from mrv2_prof.analysis.kernel_ops import OTHER, UNATTRIBUTED, attribute_step
from mrv2_prof.store import Store

FAR_FROM_ROOF = 0.5  # an op under this fraction of its roof is a finding ...
MIN_TIME_SHARE = 0.10  # ... when it takes at least this share of the window's kernel time
# A launch whose work takes under this at its roof is bound by what every launch costs (its
# start, its first loads' latency, its tail): an empty kernel takes ~1 µs in a CUDA graph on an
# H100/H200, a small decode kernel's latency chain 2-5 µs (benchmarks/RESULTS.md, third round).
LAUNCH_BOUND_US = 2.0
NO_KERNELS = "no kernels recorded (probes.kernel_trace on a CUDA run, or nsys import)"
_KERNELS = """
    SELECT step, name, start_ns, end_ns FROM kernels
    WHERE run_id = ? AND step >= 0 AND end_ns >= start_ns
    ORDER BY step, start_ns, end_ns"""
_STEPS = """
    SELECT step, num_tokens, num_reqs + coalesce(num_draft_tokens, 0),
           greatest(coalesce(context_tokens, 0), 0), greatest(coalesce(attn_pairs, 0), 0)
    FROM steps WHERE run_id = ? AND step IN (SELECT DISTINCT step FROM kernels WHERE run_id = ?)"""


@dataclass(frozen=True)
class OpRow:
    """One op over the window, per step (means over its steps)."""

    op: str
    launches: float
    us: float  # device time per step
    share: float  # of all the window's kernel time
    bytes: float
    flops: float
    bytes_per_s: float | None  # None: no device time, or an op without a cost (other)
    flops_per_s: float | None
    fraction: float | None  # of the binding roof
    bound: str | None  # "HBM" or "tensor-core"


@dataclass(frozen=True)
class KernelRoofline:
    steps: int = 0  # steps with kernels recorded
    tokens_per_step: float = 0.0
    rows: list[OpRow] = field(default_factory=list)  # most device time first
    notes: list[str] = field(default_factory=list)  # unattributed steps, the peaks' limits
    why: str | None = None  # why there is no table


def own_ns(spans: list[tuple[int, int]]) -> list[int]:
    """Each kernel's own device time, of (start, end) spans in start order: from its start or
    the latest end before it, whichever is later, to its end (0 where an earlier kernel outlasts
    it). The sum is the length of the spans' union: the time the device had a kernel running."""
    own, latest = [], None
    for start, end in spans:
        begin = start if latest is None else max(start, latest)
        own.append(max(end - begin, 0))
        latest = end if latest is None else max(latest, end)
    return own


def op_bytes_flops(cost: dict[str, int], counts: tuple[int, int, int, int]) -> tuple[int, int]:
    """One launch's bytes and FLOPs at a step's (tokens, logits rows, context, pairs)."""
    tokens, rows, context, pairs = counts
    g = cost.get
    nbytes = (g("weight_bytes", 0) + g("bytes_per_token", 0) * tokens
              + g("bytes_per_row", 0) * rows + g("bytes_per_context", 0) * context)  # fmt: skip
    flops = g("flops_per_token", 0) * tokens + g("flops_per_row", 0) * rows
    return nbytes, flops + g("flops_per_pair", 0) * pairs


def kernel_roofline(store: Store, run_id: str) -> KernelRoofline:
    """The per-op table of the run's recorded kernels, or why there is none."""
    con = store.connection
    (info,) = con.execute("SELECT info FROM runs WHERE run_id = ?", [run_id]).fetchone()
    info = json.loads(info) if info else {}
    cost, peaks = info.get("step_cost") or {}, info.get("machine_peaks") or {}
    kernels = con.execute(_KERNELS, [run_id]).fetchall()
    if not kernels:
        return KernelRoofline(why=NO_KERNELS)
    if "ops" not in cost or not cost.get("layers"):
        return KernelRoofline(why="the run recorded no per-op cost (stored before it was)")
    steps = con.execute(_STEPS, [run_id, run_id]).fetchall()
    counts = {int(r[0]): tuple(int(v) for v in r[1:]) for r in steps}
    by_step: dict[int, list[tuple[str, int]]] = defaultdict(list)
    overlap = 0
    for step, group in groupby(kernels, key=lambda r: r[0]):
        group = list(group)
        own = own_ns([(int(r[2]), int(r[3])) for r in group])
        overlap += sum(int(r[3]) - int(r[2]) for r in group) - sum(own)
        by_step[int(step)] += [(r[1], ns) for r, ns in zip(group, own, strict=True)]
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0])  # launches, ns, B, FLOP
    reasons: dict[str, int] = defaultdict(int)
    for step, rows in by_step.items():
        ops, why = attribute_step([n for n, _ in rows], int(cost["layers"]))
        if why:
            reasons[why] += 1
        for (_, ns), k in zip(rows, ops, strict=True):
            t = totals[k.op]
            t[0] += 0 if k.joins else 1
            t[1] += ns
            if k.op in cost["ops"] and not k.joins and step in counts:
                nbytes, flops = op_bytes_flops(cost["ops"][k.op], counts[step])
                t[2], t[3] = t[2] + nbytes, t[3] + flops
    n = len(by_step)
    tokens = sum(counts[s][0] for s in by_step if s in counts) / n
    all_ns = sum(t[1] for t in totals.values()) or 1
    rows = [op_row(op, t, n, all_ns, peaks, op in cost["ops"]) for op, t in totals.items()]
    rows.sort(key=lambda r: -r.us)
    notes = [f"{c} of {n} steps unattributed: {why}" for why, c in reasons.items()]
    if overlap:
        notes.append(
            f"kernels overlapped the ones before them by {overlap / n / 1e3:,.1f} µs per step "
            "(programmatic dependent launch, or streams): each op counts its kernels' own time"
        )
    if not peaks.get("hbm_read_bytes_per_s"):
        notes.append("no HBM bandwidth recorded: no fraction of the roof")
    elif not peaks.get("tensor_flops_per_s"):
        notes.append(f"memory roof only ({peaks.get('tensor_source', 'no tensor-core peak')})")
    return KernelRoofline(n, tokens, rows, notes)


def op_row(op: str, t: list[float], n: int, all_ns: float, peaks: dict[str, Any], costed: bool):
    """An op's row from its totals over ``n`` steps, ``t`` = [launches, ns, bytes, FLOPs]; the
    fraction of its binding roof from ``peaks`` (``machine_peaks``' keys)."""
    launches, ns, nbytes, flops = t
    s = ns / 1e9
    bw, peak = peaks.get("hbm_read_bytes_per_s"), peaks.get("tensor_flops_per_s")
    fraction = bound = None
    if costed and s > 0 and bw:
        memory_s, compute_s = nbytes / bw, flops / peak if peak else 0.0
        fraction = max(memory_s, compute_s) / s
        bound = "tensor-core" if compute_s > memory_s else "HBM"
    return OpRow(
        op=op, launches=launches / n, us=ns / n / 1e3, share=ns / all_ns, bytes=nbytes / n,
        flops=flops / n, bytes_per_s=nbytes / s if costed and s > 0 else None,
        flops_per_s=flops / s if costed and s > 0 else None, fraction=fraction, bound=bound,
    )  # fmt: skip


def far_from_roof(table: KernelRoofline | None, most: int = 2) -> list[OpRow]:
    """The ops (at most ``most``, most time first) that take ``MIN_TIME_SHARE`` of the window's
    kernel time at under ``FAR_FROM_ROOF`` of their roof."""
    if table is None:
        return []
    far = [r for r in table.rows if r.fraction is not None and r.fraction < FAR_FROM_ROOF
           and r.share >= MIN_TIME_SHARE and r.op not in (OTHER, UNATTRIBUTED)]  # fmt: skip
    return far[:most]


def op_line(r: OpRow) -> str:
    """``qkv at 1.60 TB/s, 39 % of the HBM roof: 120 µs per step (22 % of kernel time, 16
    launches per step); 7.5 µs a launch ...`` (``to_close``)."""
    speed = (f"{r.flops_per_s / 1e12:.3g} TFLOP/s" if r.bound == "tensor-core"
             else f"{(r.bytes_per_s or 0) / 1e12:.2f} TB/s")  # fmt: skip
    line = (
        f"{r.op} at {speed}, {100 * (r.fraction or 0):.0f} % of the {r.bound} roof: "
        f"{r.us:,.1f} µs per step ({100 * r.share:.0f} % of kernel time, "
        f"{r.launches:g} launch{'' if r.launches == 1 else 'es'} per step)"
    )
    closing = to_close(r)
    return line if closing is None else f"{line}; {closing}"


def _per_launch(r: OpRow) -> tuple[float, float] | None:
    """One launch's device time and its work at the roof (that time x the op's fraction of the
    roof), in µs (None: an op with no roof, or no launches)."""
    if r.fraction is None or r.launches <= 0 or r.us <= 0:
        return None
    taken = r.us / r.launches
    return taken, r.fraction * taken


def launch_bound(r: OpRow) -> bool | None:
    """Whether one launch of the op does under ``LAUNCH_BOUND_US`` of work at its roof (None:
    an op with no roof, or no launches)."""
    per = _per_launch(r)
    return None if per is None else per[1] < LAUNCH_BOUND_US


def to_close(r: OpRow) -> str | None:
    """What would close an op's gap to its roof, from its time a launch (device time per step
    over launches per step) against that launch's work at the roof (the same times its fraction
    of the roof): under ``LAUNCH_BOUND_US`` of work a launch, each launch's fixed cost binds, so
    fewer, larger launches would (fusing it with a kernel beside it, more work each); with more
    work a launch, the kernel itself would (its tiles, and programs enough to fill the SMs)."""
    per = _per_launch(r)
    if per is None:
        return None
    taken, at_roof = per
    if at_roof < LAUNCH_BOUND_US:
        return (
            f"{taken:,.1f} µs a launch for {at_roof:.2f} µs of work at the roof: launch-bound, "
            "so fewer, larger launches would close it (fused with a kernel beside it, or more "
            "work each), not faster tiles"
        )
    return (
        f"{taken:,.1f} µs a launch for {at_roof:,.1f} µs of work at the roof: enough work a "
        "launch, so the kernel itself would close it (its tiles, and programs enough to fill "
        "the SMs)"
    )


def kernels_far_from_roof(make: Callable[..., Any], s: Any, f: Any) -> Any:
    """The findings rule (``make``: the ``Finding`` class, bound where the rule is registered):
    the top ops of the kernel-trace window far from their roof, with their figures."""
    table = getattr(f, "kernel_roofline", None)
    far = far_from_roof(table)
    if not far:
        return None
    batch = f"{table.tokens_per_step:.3g} tokens per step"
    text = f"kernels far from their roof ({batch}): " + "; ".join(op_line(r) for r in far)
    where = "report: Kernels per op; the kernels table (kernel-trace window)"
    return make("kernels_far_from_roof", 1, sum(r.share for r in far), text, where)
