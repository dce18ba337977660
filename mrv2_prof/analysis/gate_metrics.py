"""The migration-gate metrics of one run, by the names a user types (``p99_itl``, ``overlap``, …).

The set follows the deployment gate of vLLM 0.25's MRV2 migration guide (step 3, "load and
distribution"): TTFT/TPOT/ITL p50/p95/p99, request and token throughput, peak GPU memory,
start-up and CUDA graph capture time, errors, aborts and preemptions, the KV-cache usage peak
and the runner process's CPU use; plus the MRV2 mechanism
metrics the probes measure (overlap, host-bound bubble time, sync count, graph hit rate) and
the energy per output token (``analysis/energy.py``).
Latencies and throughput come from ``store.metrics.run_summary`` (vLLM ``bench serve``
definitions) so every view reports the same numbers. A value is ``None`` when the run did not
measure it (no GPU samples on a CPU run, no completed request, …). Perturbed steps (a kernel
trace window) are left out of the step figures, as in the summary; ``perturbed_steps`` says how
many, so compare and gate can say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mrv2_prof.analysis.compiles import late_compiles
from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.analysis.roofline import Roofline
from mrv2_prof.store import Store

LOWER = "lower"  # lower is better: an increase is a regression
HIGHER = "higher"  # higher is better: a decrease is a regression

_MIB = 2**20


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # ms | s | req/s | tok/s | MiB | J | fraction | count | tokens
    direction: str  # LOWER or HIGHER
    description: str
    # read off a clock (a time, a rate, a share of time, a timed memory sample): one run's value
    # carries run-to-run noise. The others count events (requests, syncs, blocks, tokens).
    timed: bool = True

    def format(self, value: float | None) -> str:
        """``value`` in this metric's unit for a table cell; ``-`` when not measured."""
        return "-" if value is None else _format(value, self.unit, signed=False)

    def format_delta(self, delta: float) -> str:
        return _format(delta, self.unit, signed=True)


def _format(value: float, unit: str, *, signed: bool) -> str:
    sign = "+" if signed else ""
    if not math.isfinite(value):
        return str(value)
    if unit == "count":
        return f"{value:{sign},.0f}"
    if unit == "fraction":
        return f"{value:{sign}.3f}"
    if unit == "J":  # three significant digits: a token's energy spans orders of magnitude
        return f"{value:{sign}.3g} J"
    decimals = 1 if unit in ("tok/s", "MiB") else 2
    return f"{value:{sign},.{decimals}f} {unit}"


def _latency_metrics() -> list[Metric]:
    what = {
        "ttft": "time to first token",
        "tpot": "time per output token after the first",
        "itl": "inter-token latency",
    }
    return [
        Metric(f"p{q}_{name}", "ms", LOWER, f"{label}, p{q} over completed requests")
        for name, label in what.items()
        for q in (50, 95, 99)
    ]


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        *_latency_metrics(),
        Metric("req_throughput", "req/s", HIGHER, "completed requests / run duration"),
        Metric("tok_throughput", "tok/s", HIGHER, "output tokens / run duration"),
        Metric("peak_gpu_mem", "MiB", LOWER, "highest NVML memory-used sample (GPU runs)"),
        Metric("overlap", "fraction", HIGHER, "hidden / total host prep time over all steps"),
        Metric("host_bound_bubble_ms", "ms", LOWER, "GPU idle time spent waiting for the host"),
        Metric("sync_count", "count", LOWER, "CPU-GPU sync points recorded (all kinds)", False),
        Metric(
            "graph_hit_rate", "fraction", HIGHER, "fraction of steps that replayed a graph", False
        ),
        Metric("capture_s", "s", LOWER, "CUDA graph capture time at start-up"),
        Metric("startup_s", "s", LOWER, "engine start-up: weights, KV cache, warm-up, capture"),
        Metric("errors", "count", LOWER, "requests left unfinished, +1 if the run failed", False),
        Metric("aborts", "count", LOWER, "requests finished by an abort", False),
        Metric("preemptions", "count", LOWER, "preemptions over all requests", False),
        Metric(
            "compiles_after_warmup",
            "count",
            LOWER,
            "kernels compiled after warm-up (Triton launcher cache misses in a step)",
            False,
        ),
        Metric(
            "mean_acceptance_length",
            "tokens",
            HIGHER,
            "speculative decoding: tokens a verify emits on average (1 + accepted / drafts)",
            False,
        ),
        Metric(
            "draft_time_share",
            "fraction",
            LOWER,
            "speculative decoding: draft time / (draft + verify time)",
        ),
        Metric(
            "spec_sat_out_steps",
            "count",
            LOWER,
            "speculative decoding: steps in which a request sat out because drafting is on the "
            "host (async scheduling; should be 0)",
            False,
        ),
        Metric(
            "spec_reclaimed_share",
            "fraction",
            LOWER,
            "speculative decoding: draft slots reclaimed (rejected or placeholder) / reserved",
            False,
        ),
        Metric("peak_kv_usage", "fraction", LOWER, "highest KV blocks in use / KV blocks", False),
        Metric("host_cpu_util", "cores", LOWER, "runner process CPU time / step-loop time"),
        Metric(
            "decode_roofline",
            "fraction",
            HIGHER,
            "median decode step's fraction of the roofline (analysis/roofline.py; GPU runs)",
        ),
        Metric(
            "joules_per_output_token",
            "J",
            LOWER,
            "NVML energy counter over the serving window / output tokens (analysis/energy.py; "
            "GPU runs)",
        ),
    ]
}


@dataclass(frozen=True)
class RunMetrics:
    """One run's gate metrics: ``values`` maps every name of ``METRICS`` to a number or None."""

    run_id: str
    label: str | None
    status: str
    error: str | None
    values: dict[str, float | None]
    perturbed_steps: int = 0  # left out of overlap, bubbles, syncs and ITL
    environment: dict[str, Any] | None = None  # runs.environment


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _capture_s(store: Store, run_id: str, info: dict[str, Any]) -> float | None:
    if _number(info.get("capture_s")) is not None:
        return _number(info["capture_s"])
    (total,) = store.connection.execute(
        "SELECT sum(capture_s) FROM graph_captures WHERE run_id = ?", [run_id]
    ).fetchone()
    return total


def _startup_s(info: dict[str, Any]) -> float | None:
    if _number(info.get("startup_s")) is not None:
        return _number(info["startup_s"])
    phases = info.get("startup")
    if isinstance(phases, dict) and phases:
        seconds = [_number(v) for v in phases.values()]
        return sum(seconds) if None not in seconds else None
    return None


def _peak_kv_usage(store: Store, run_id: str, info: dict[str, Any]) -> float | None:
    blocks = _number(info.get("num_kv_blocks"))
    (peak,) = store.connection.execute(
        "SELECT max(kv_used_blocks) FROM steps WHERE run_id = ?", [run_id]
    ).fetchone()
    return peak / blocks if peak is not None and blocks else None


def _decode_roofline(roof: Roofline | None) -> float | None:
    decode = [x for x in (roof.summaries if roof else []) if x.kind == "decode"]
    return decode[0].fraction_p50 if decode else None


def gate_metrics(store: Store, run_id: str) -> RunMetrics:
    """The gate metrics of run ``run_id`` (an exact id; resolve user input with ``resolve_run``)."""
    s = run_summary(store, run_id)
    peak_bytes = s.peak_gpu_mem_bytes
    spec = s.spec_decode

    values: dict[str, float | None] = {}
    for name, pct in (("ttft", s.ttft_ms), ("tpot", s.tpot_ms), ("itl", s.itl_ms)):
        values.update({f"p50_{name}": pct.p50, f"p95_{name}": pct.p95, f"p99_{name}": pct.p99})
    measured_duration = s.duration_s > 0
    values.update(
        req_throughput=s.requests_per_s if measured_duration else None,
        tok_throughput=s.output_tokens_per_s if measured_duration else None,
        peak_gpu_mem=peak_bytes / _MIB if peak_bytes is not None else None,
        overlap=s.overlap,
        host_bound_bubble_ms=s.host_bound_bubble_ms,
        sync_count=s.num_syncs,
        graph_hit_rate=s.graph_hit_rate,
        capture_s=_capture_s(store, run_id, s.info),
        startup_s=_startup_s(s.info),
        errors=s.num_unfinished + (s.status == "failed"),
        aborts=s.num_aborted,
        preemptions=s.num_preemptions,
        compiles_after_warmup=late_compiles(store, run_id).count,
        mean_acceptance_length=spec.mean_acceptance_length if spec else None,
        draft_time_share=spec.draft_time_share if spec else None,
        spec_sat_out_steps=spec.sat_out_steps if spec else None,
        spec_reclaimed_share=spec.reclaimed_share if spec else None,
        peak_kv_usage=_peak_kv_usage(store, run_id, s.info),
        host_cpu_util=_number(s.info.get("runner_cpu_util")),
        decode_roofline=_decode_roofline(s.roofline),
        joules_per_output_token=s.energy.joules_per_output_token if s.energy else None,
    )
    values = {name: None if v is None else float(v) for name, v in values.items()}
    assert list(values) == list(METRICS)
    return RunMetrics(run_id, s.label, s.status, s.error, values, s.perturbed_steps, s.environment)
