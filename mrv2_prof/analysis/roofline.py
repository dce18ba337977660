"""How far each step is from the roofline: the bytes it must move and the FLOPs it must do,
against its GPU time and the machine's peaks.

Per step (``steps`` row, the run's ``runs.info['step_cost']`` constants, runner/model/step_cost.py):

* bytes = weight_bytes + embed_row_bytes x num_tokens + kv_bytes_per_token x context_tokens
  + logits_bytes_per_row x rows, where rows = num_reqs + num_draft_tokens (the logits rows:
  one per request, one more per draft verified);
* FLOPs = matmul_flops_per_token x num_tokens + lm_head_flops_per_row x rows
  + attn_flops_per_pair x attn_pairs;
* GPU time = gpu_end_ns - gpu_start_ns (the step's first to last device mark);
* achieved bytes/s and FLOP/s = bytes and FLOPs over the GPU time;
* the roofline time = max(bytes / HBM read bandwidth, FLOPs / tensor-core peak), and the step's
  fraction of the roofline = roofline time / GPU time (1.0: at the roof); ``bound`` names the
  term that binds. With no tensor-core peak (an unknown GPU, float32) only the memory roof is
  used and the figure says so.

Steps without device times (a CPU run), without an attention extent (a database written before
it was recorded: -1 or NULL) and perturbed steps (a kernel-trace window, ``latency.PERTURBED``)
are left out. Decode steps (no prompt token) and prefill steps (any prompt token) are
summarised apart: p10, median and p90 of the fraction, medians of the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from mrv2_prof.analysis.latency import PERTURBED
from mrv2_prof.store import Store

COST_KEYS = (
    "weight_bytes", "embed_row_bytes", "kv_bytes_per_token", "logits_bytes_per_row",
    "matmul_flops_per_token", "lm_head_flops_per_row", "attn_flops_per_pair",
)  # fmt: skip
_STEPS = f"""
    SELECT step, num_reqs, num_tokens, num_prefill_tokens, coalesce(num_draft_tokens, 0),
           context_tokens, attn_pairs, gpu_end_ns - gpu_start_ns
    FROM steps
    WHERE run_id = $run AND gpu_start_ns IS NOT NULL AND gpu_end_ns > gpu_start_ns
      AND context_tokens >= 0 AND attn_pairs >= 0 AND NOT {PERTURBED}
    ORDER BY step"""


@dataclass
class StepRoofline:
    """Columns, one entry per step counted."""

    step: np.ndarray
    decode: np.ndarray  # bool: no prompt token in the step
    bytes: np.ndarray
    flops: np.ndarray
    gpu_s: np.ndarray
    bytes_per_s: np.ndarray
    flops_per_s: np.ndarray
    fraction: np.ndarray  # roofline time / GPU time
    compute_bound: np.ndarray  # bool: the FLOP roof binds


@dataclass
class RooflineSummary:
    """The steps of one kind (decode or prefill) against the roof."""

    kind: str
    steps: int
    fraction_p10: float
    fraction_p50: float
    fraction_p90: float
    bytes_p50: float
    bytes_per_s_p50: float
    flops_per_s_p50: float
    compute_bound_steps: int


@dataclass
class Roofline:
    peaks: dict[str, Any]  # runs.info['machine_peaks']
    per_step: StepRoofline | None
    summaries: list[RooflineSummary]
    note: str | None  # why there is no per-step roofline, or what it lacks


def step_figures(rows: np.ndarray, cost: dict[str, int], peaks: dict[str, Any]) -> StepRoofline:
    """The per-step figures of ``rows`` (columns as ``_STEPS`` selects them)."""
    step, reqs, tokens, prefill, drafts, context, pairs, gpu_ns = (
        rows[:, i].astype(np.float64) for i in range(8)
    )
    logits_rows = reqs + drafts
    nbytes = (
        cost["weight_bytes"]
        + cost["embed_row_bytes"] * tokens
        + cost["kv_bytes_per_token"] * context
        + cost["logits_bytes_per_row"] * logits_rows
    )
    flops = (
        cost["matmul_flops_per_token"] * tokens
        + cost["lm_head_flops_per_row"] * logits_rows
        + cost["attn_flops_per_pair"] * pairs
    )
    gpu_s = gpu_ns / 1e9
    memory_s = nbytes / peaks["hbm_read_bytes_per_s"]
    peak_flops = peaks.get("tensor_flops_per_s")
    compute_s = flops / peak_flops if peak_flops else np.zeros_like(flops)
    return StepRoofline(
        step=step.astype(np.int64),
        decode=prefill == 0,
        bytes=nbytes,
        flops=flops,
        gpu_s=gpu_s,
        bytes_per_s=nbytes / gpu_s,
        flops_per_s=flops / gpu_s,
        fraction=np.maximum(memory_s, compute_s) / gpu_s,
        compute_bound=compute_s > memory_s,
    )


def summarise(per_step: StepRoofline) -> list[RooflineSummary]:
    out = []
    for kind, mask in (("decode", per_step.decode), ("prefill", ~per_step.decode)):
        if not mask.any():
            continue
        frac = per_step.fraction[mask]
        p10, p50, p90 = np.percentile(frac, [10, 50, 90])
        out.append(
            RooflineSummary(
                kind=kind,
                steps=int(mask.sum()),
                fraction_p10=float(p10),
                fraction_p50=float(p50),
                fraction_p90=float(p90),
                bytes_p50=float(np.median(per_step.bytes[mask])),
                bytes_per_s_p50=float(np.median(per_step.bytes_per_s[mask])),
                flops_per_s_p50=float(np.median(per_step.flops_per_s[mask])),
                compute_bound_steps=int(per_step.compute_bound[mask].sum()),
            )
        )
    return out


def run_roofline(store: Store, run_id: str) -> Roofline:
    """The run's per-step roofline, or the reason it has none."""
    con = store.connection
    (info,) = con.execute("SELECT info FROM runs WHERE run_id = ?", [run_id]).fetchone()
    info = json.loads(info) if info else {}
    peaks, cost = info.get("machine_peaks") or {}, info.get("step_cost") or {}
    if not peaks.get("hbm_read_bytes_per_s"):
        why = peaks.get("note") or peaks.get("hbm_source") or "no machine peaks recorded"
        return Roofline(peaks, None, [], f"no roofline: {why}")
    if any(k not in cost for k in COST_KEYS):
        return Roofline(peaks, None, [], "no roofline: the run recorded no step cost model")
    rows = np.array(con.execute(_STEPS, {"run": run_id}).fetchall(), dtype=np.float64)
    if rows.size == 0:
        return Roofline(peaks, None, [], "no roofline: no step with device times and extent")
    per_step = step_figures(rows.reshape(-1, 8), cost, peaks)
    note = None if peaks.get("tensor_flops_per_s") else (
        f"memory roof only ({peaks.get('tensor_source', 'no tensor-core peak')})"
    )  # fmt: skip
    return Roofline(peaks, per_step, summarise(per_step), note)


def _roof(s: RooflineSummary) -> str:
    if s.compute_bound_steps * 2 > s.steps:
        return "tensor-core"
    return "HBM"


def roofline_line(roof: Roofline) -> str:
    """One line per kind of step, as ``show`` prints it, or the reason there is none; e.g.
    ``decode steps at 64% of the HBM roofline (p10-p90 58-67%, 412 steps): 2.61 GB per step,
    2.55 TB/s; HBM read 4.10 TB/s (measured: ...)``."""
    if not roof.summaries:
        return roof.note or "no roofline"
    parts = []
    for s in roof.summaries:
        parts.append(
            f"{s.kind} steps at {100 * s.fraction_p50:.0f}% of the {_roof(s)} roofline "
            f"(p10-p90 {100 * s.fraction_p10:.0f}-{100 * s.fraction_p90:.0f}%, {s.steps:,} "
            f"steps): {s.bytes_p50 / 1e9:.3g} GB per step, {s.bytes_per_s_p50 / 1e12:.2f} TB/s, "
            f"{s.flops_per_s_p50 / 1e12:.3g} TFLOP/s (medians)"
        )
    peaks = roof.peaks
    bw = f"HBM read {peaks['hbm_read_bytes_per_s'] / 1e12:.2f} TB/s ({peaks.get('hbm_source')})"
    flops = peaks.get("tensor_flops_per_s")
    tensor = f"tensor cores {flops / 1e12:.0f} TFLOP/s" if flops else roof.note
    return "; ".join(parts) + f"; {bw}; {tensor}"


def measured_peaks(store: Store) -> dict[str, list[Any]]:
    """GPU UUID -> [HBM read bytes/s, run id] of the latest run that measured it (the cache a
    new run on that GPU reads instead of measuring again)."""
    rows = store.connection.execute(
        "SELECT run_id, info FROM runs WHERE info IS NOT NULL "
        "ORDER BY started_at NULLS FIRST, started_ns NULLS FIRST"
    ).fetchall()
    known: dict[str, list[Any]] = {}
    for run_id, text in rows:
        try:
            peaks = json.loads(text).get("machine_peaks") or {}
        except (ValueError, AttributeError):
            continue
        uuid, bw = peaks.get("gpu_uuid"), peaks.get("hbm_read_bytes_per_s")
        if uuid and bw and str(peaks.get("hbm_source", "")).startswith("measured"):
            known[uuid] = [bw, run_id]
    return known
