"""The run summary, computed in SQL from the stored tables.

Latency metrics (TTFT, TPOT, ITL, E2E: which requests and gaps count, how each is computed) are
those of ``store.latency``, the tool's one definition; percentiles use DuckDB's
``quantile_cont``, the same linear interpolation as numpy's default percentile and vLLM's
``bench serve``.
Run overlap = hidden host prep / all host prep and bubbles summed, over the per-step values the
step timeline stored (``probes.overlap``). Bubbles count the device's idle time between steps
and its starved time inside them (``steps.starved_ns``); both are host-bound when the device
waited for the host.

A partial run (``aborted`` or ``failed``: stopped before every request finished) is summarised
over what it produced: its serving time runs from the first arrival to the last token or finish
before the stop, TTFT and ITL cover the requests completed or still in flight at the stop (those
that got a first token; their tokens so far), TPOT and E2E the completed ones; ``partial`` says so.

Perturbed steps (``steps.perturbed``: a kernel-trace window) are left out by default of every
step-derived figure (overlap, bubbles, starved time, syncs) and of the ITL gaps that end while
they ran; ``perturbed_steps`` says how many were left out. TTFT, TPOT and E2E are per request
and keep every request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mrv2_prof.analysis.energy import Energy, run_energy
from mrv2_prof.analysis.latency import (
    COMPLETED,
    IN_FLIGHT,
    METRICS,
    PERTURBED,
    perturbed_steps,
    values_sql,
)
from mrv2_prof.analysis.rank_steps import RankSummary, rank_summary
from mrv2_prof.analysis.roofline import Roofline, run_roofline
from mrv2_prof.analysis.spec_metrics import SpecDecodeSummary, spec_decode_summary
from mrv2_prof.store.db import Store, no_run_error

PERCENTILES = (0.5, 0.9, 0.95, 0.99)

_NS_PER_MS = 1e6
_PARTIAL_STATUSES = ("aborted", "failed")


@dataclass(frozen=True)
class Percentiles:
    """Percentiles and mean of one latency metric; values are ``None`` when ``count`` is 0."""

    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    count: int


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    label: str | None
    scenario_name: str | None
    status: str
    error: str | None
    device: str | None
    duration_s: float  # last finish (partial: last token or finish) − first arrival; 0: none
    num_requests: int
    num_completed: int  # finish reason stop or length
    num_aborted: int
    num_unfinished: int
    steps: int
    prompt_tokens: int
    output_tokens: int
    requests_per_s: float  # completed requests / duration_s; 0 when duration_s is 0
    output_tokens_per_s: float  # all output tokens / duration_s; 0 when duration_s is 0
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    num_preemptions: int
    prefix_cache_hit_rate: float | None  # cached / prompt tokens; None without prompt tokens
    staged_bytes: int
    dense_bytes: int
    num_syncs: int
    sync_blocked_ms: float
    graph_hit_rate: float | None  # fraction of graph dispatches that hit; None without dispatches
    graph_fallback_reason: str | None  # the most frequent reason of the dispatches that missed
    graph_modes: dict[str, int]  # steps per chosen mode (full, piecewise, none)
    info: dict[str, Any]
    # GPU timeline (None without one): hidden / all host prep, and the GPU idle time between steps
    overlap: float | None = None
    bubble_ms: float | None = None  # idle between steps and starved inside them
    host_bound_bubble_ms: float | None = None  # the part of it the device waited for the host
    peak_gpu_mem_bytes: int | None = None  # highest NVML memory-used sample; None without NVML
    starved_ms: float | None = None  # device waiting for the host inside steps (in the above)
    perturbed_steps: int = 0  # steps left out of the step figures (kernel-trace window)
    includes_perturbed: bool = False
    environment: dict[str, Any] | None = None  # runs.environment (None: not recorded)
    tensor_parallel: RankSummary | None = None  # rank_steps (None: one rank)
    roofline: Roofline | None = None  # analysis/roofline.py: each step against the machine's peaks
    spec_decode: SpecDecodeSummary | None = None  # speculative decoding (None: no drafts)
    energy: Energy | None = None  # analysis/energy.py: NVML's energy counter over the window
    partial: bool = False  # aborted or failed: the figures cover what it produced until the stop


def _row(store: Store, sql: str, run_id: str) -> tuple[Any, ...]:
    """The one row of an aggregate query with one ``?`` for the run id."""
    row = store.connection.execute(sql, [run_id]).fetchone()
    assert row is not None  # an aggregate without GROUP BY always returns a row
    return row


def _percentiles(store: Store, sql: str, run_id: str) -> Percentiles:
    """Percentiles over column ``v`` of ``sql`` (a query with parameter ``$run``)."""
    quantiles = ", ".join(str(q) for q in PERCENTILES)
    row = store.connection.execute(
        f"SELECT quantile_cont(v, [{quantiles}]), avg(v), count(v) "
        f"FROM ({sql}) WHERE v IS NOT NULL",
        {"run": run_id},
    ).fetchone()
    assert row is not None  # an aggregate without GROUP BY always returns a row
    qs, mean, count = row
    p50, p90, p95, p99 = qs if qs is not None else (None,) * len(PERCENTILES)
    return Percentiles(p50=p50, p90=p90, p95=p95, p99=p99, mean=mean, count=int(count))


def _latencies(
    store: Store, run_id: str, include_perturbed: bool, partial: bool
) -> dict[str, Percentiles]:
    """TTFT, TPOT, ITL and E2E by the definitions of ``store.latency``."""
    return {
        f"{metric}_ms": _percentiles(
            store,
            values_sql(metric, partial=partial, include_perturbed=include_perturbed),
            run_id,
        )
        for metric in METRICS
    }


def serving_window(store: Store, run_id: str, partial: bool) -> tuple[int, int] | None:
    """The serving window, host ns: first arrival to last finish; for a ``partial`` run, to the
    last token or finish before the stop (its requests in flight have no finish). None without
    an arrival or an end after it."""
    end = "max(finish_ns)"
    if partial:
        end = (
            "greatest(coalesce(max(finish_ns), 0), "
            "coalesce((SELECT max(t_ns) FROM tokens WHERE run_id = ?), 0))"
        )
    row = store.connection.execute(
        f"SELECT min(arrival_ns), {end} FROM requests WHERE run_id = ?",
        [run_id, run_id] if partial else [run_id],
    ).fetchone()
    if row is None or row[0] is None or row[1] is None or row[1] < row[0]:
        return None
    return int(row[0]), int(row[1])


def run_summary(store: Store, run_id: str, include_perturbed: bool = False) -> RunSummary:
    """Summarise run ``run_id`` (an exact id; resolve user input with ``Store.resolve_run``);
    perturbed steps left out of the step figures unless ``include_perturbed``."""
    run = store.connection.execute(
        "SELECT label, scenario_name, status, error, device, info, environment FROM runs "
        "WHERE run_id = ?",
        [run_id],
    ).fetchone()
    if run is None:
        raise no_run_error(store.path, run_id)
    label, scenario_name, status, error, device, info_json, env_json = run

    (
        num_requests,
        num_completed,
        num_aborted,
        num_unfinished,
        prompt_tokens,
        output_tokens,
        num_preemptions,
        cached_tokens,
    ) = _row(
        store,
        f"""
        SELECT count(*),
               count(*) FILTER (WHERE {COMPLETED}),
               count(*) FILTER (WHERE finish_reason = 'abort'),
               count(*) FILTER (WHERE {IN_FLIGHT}),
               coalesce(sum(prompt_tokens), 0)::BIGINT,
               coalesce(sum(output_tokens), 0)::BIGINT,
               coalesce(sum(num_preemptions), 0)::BIGINT,
               coalesce(sum(cached_tokens), 0)::BIGINT
        FROM requests WHERE run_id = ?
        """,
        run_id,
    )
    partial = status in _PARTIAL_STATUSES
    window = serving_window(store, run_id, partial)
    duration_s = 0.0 if window is None else (window[1] - window[0]) / 1e9

    staged_bytes, dense_bytes = _row(
        store,
        "SELECT coalesce(sum(staged_bytes), 0)::BIGINT, coalesce(sum(dense_bytes), 0)::BIGINT "
        "FROM staged_writes WHERE run_id = ?",
        run_id,
    )
    num_perturbed = perturbed_steps(store.connection, run_id)
    keep = "true" if include_perturbed else f"NOT {PERTURBED}"
    num_syncs, sync_blocked_ns = _row(
        store,
        "SELECT count(*), coalesce(sum(blocked_ns), 0)::BIGINT FROM syncs WHERE run_id = ? "
        f"AND (step IS NULL OR step NOT IN (SELECT step FROM steps WHERE run_id = syncs.run_id "
        f"AND NOT ({keep})))",
        run_id,
    )
    (num_steps,) = _row(store, "SELECT count(*) FROM steps WHERE run_id = ?", run_id)
    overlap, bubble_ns, host_bound_ns, starved_ns = _row(
        store,
        "SELECT sum(hidden_prep_ns) / nullif(sum(host_prep_ns), 0), "
        "sum(bubble_ns) + coalesce(sum(starved_ns), 0), "
        "coalesce(sum(bubble_ns) FILTER (WHERE bubble_kind = 'host_bound'), 0) "
        "+ coalesce(sum(starved_ns), 0), sum(starved_ns) "
        f"FROM steps WHERE run_id = ? AND {keep}",
        run_id,
    )
    if bubble_ns is None:  # no GPU timeline: not measured
        host_bound_ns = None
    (peak_gpu_mem_bytes,) = _row(
        store, "SELECT max(mem_used_bytes) FROM gpu_samples WHERE run_id = ?", run_id
    )
    (graph_hit_rate,) = _row(
        store, "SELECT avg(hit::DOUBLE) FROM graph_dispatch WHERE run_id = ?", run_id
    )
    (graph_fallback_reason,) = _row(
        store,
        "SELECT mode(reason) FROM graph_dispatch WHERE run_id = ? AND NOT hit",
        run_id,
    )
    graph_modes = dict(
        store.connection.execute(
            "SELECT mode, count(*) FROM graph_dispatch WHERE run_id = ? GROUP BY mode "
            "ORDER BY count(*) DESC, mode",
            [run_id],
        ).fetchall()
    )

    return RunSummary(
        run_id=run_id,
        label=label,
        scenario_name=scenario_name,
        status=status,
        error=error,
        device=device,
        duration_s=duration_s,
        num_requests=num_requests,
        num_completed=num_completed,
        num_aborted=num_aborted,
        num_unfinished=num_unfinished,
        steps=num_steps,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        requests_per_s=num_completed / duration_s if duration_s > 0 else 0.0,
        output_tokens_per_s=output_tokens / duration_s if duration_s > 0 else 0.0,
        **_latencies(store, run_id, include_perturbed, partial),
        num_preemptions=num_preemptions,
        prefix_cache_hit_rate=cached_tokens / prompt_tokens if prompt_tokens > 0 else None,
        staged_bytes=staged_bytes,
        dense_bytes=dense_bytes,
        num_syncs=num_syncs,
        sync_blocked_ms=sync_blocked_ns / _NS_PER_MS,
        graph_hit_rate=graph_hit_rate,
        graph_fallback_reason=graph_fallback_reason,
        graph_modes=graph_modes,
        info=json.loads(info_json) if info_json else {},
        overlap=None if overlap is None else float(overlap),
        bubble_ms=None if bubble_ns is None else bubble_ns / _NS_PER_MS,
        host_bound_bubble_ms=None if host_bound_ns is None else host_bound_ns / _NS_PER_MS,
        peak_gpu_mem_bytes=peak_gpu_mem_bytes,
        starved_ms=None if starved_ns is None else starved_ns / _NS_PER_MS,
        perturbed_steps=num_perturbed,
        includes_perturbed=include_perturbed,
        environment=json.loads(env_json) if env_json else None,
        tensor_parallel=rank_summary(store, run_id),
        roofline=run_roofline(store, run_id),
        spec_decode=spec_decode_summary(store, run_id),
        energy=run_energy(store, run_id, window),
        partial=partial,
    )
