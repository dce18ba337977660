"""What each track of the exported trace holds: one query per track, plain rows in time order.

Each function streams row tuples from a DuckDB cursor (``TrackQuery.rows``) in the order
``report/chrome_trace.laminar`` needs: by start, the enclosing slice first; times are the stored
``perf_counter_ns`` values. ``report/trace_tracks`` and ``report/request_track`` turn the rows into
slices; the track layout and the flow form are described in ``report/trace_export``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mrv2_prof.analysis.latency import E2E_MS, TTFT_MS
from mrv2_prof.analysis.trace_window import TrackQuery
from mrv2_prof.probes.api import PHASES

RUNNER_COUNTERS = ("kv_used_blocks", "num_running", "num_waiting")
GPU_COUNTERS = ("gpu_util", "mem_used_bytes", "power_w", "sm_clock_mhz")
_PHASE_RANK = "list_position([" + ", ".join(f"'{p}'" for p in PHASES) + "], name)"

Row = tuple[Any, ...]


def track_counts(q: TrackQuery) -> dict[str, Any]:
    """What the window holds beyond the CPU spans: GPU spans and steps, steps with runner
    counters and NVML samples (counts), the kernel trace's streams (``-1``: unknown) and the
    tensor-parallel ranks (ascending)."""
    w = q.step_filter()
    return {
        "gpu_spans": q.value(
            f"SELECT count(*) FROM spans WHERE run_id = $run AND track = 'gpu' AND {w}"
        ),
        "gpu_steps": q.value(
            f"SELECT count(*) FROM steps WHERE run_id = $run AND gpu_start_ns IS NOT NULL AND {w}"
        ),
        "step_counters": q.value(
            f"SELECT count(*) FROM steps WHERE run_id = $run AND cpu_start_ns IS NOT NULL AND {w} "
            f"AND coalesce({', '.join(RUNNER_COUNTERS)}) IS NOT NULL"
        ),
        "streams": [
            r[0]
            for r in q.rows(
                f"SELECT DISTINCT coalesce(stream, -1) FROM kernels WHERE run_id = $run AND {w} "
                "ORDER BY 1"
            )
        ],
        "gpu_samples": q.value(
            f"SELECT count(*) FROM gpu_samples WHERE run_id = $run AND {q.time_filter()}"
        ),
        "ranks": [
            r[0]
            for r in q.rows(
                f"SELECT DISTINCT rank FROM rank_steps WHERE run_id = $run AND {w} ORDER BY 1"
            )
        ],
    }


def _flow_steps(q: TrackQuery) -> str:
    """Steps with both a CPU ``execute`` span and a GPU span: each gets one flow arrow."""
    return (
        "flow_steps AS (SELECT step FROM spans WHERE run_id = $run AND track = 'cpu' AND "
        f"name = 'execute' AND {q.step_filter()} INTERSECT SELECT step FROM spans WHERE "
        f"run_id = $run AND track = 'gpu' AND start_ns IS NOT NULL AND end_ns IS NOT NULL AND "
        f"{q.step_filter()})"
    )


def cpu_rows(q: TrackQuery) -> Iterator[Row]:
    """The CPU phase spans: ``(step, name, start_ns, end_ns, flow_out, num_reqs, num_tokens,
    num_prefill_tokens, num_decode_tokens, graph_mode)``; the batch shape on ``step`` spans only,
    ``flow_out`` on the step's first ``execute`` span when the step has a GPU span."""
    sql = f"""
        WITH {_flow_steps(q)},
        cpu AS (
            SELECT step, name, start_ns, end_ns, {_PHASE_RANK} AS rank,
                   row_number() OVER (PARTITION BY step, name ORDER BY start_ns) AS nth
            FROM spans WHERE run_id = $run AND track = 'cpu' AND start_ns IS NOT NULL
              AND end_ns IS NOT NULL AND {q.step_filter()})
        SELECT cpu.step, cpu.name, cpu.start_ns, cpu.end_ns,
               cpu.name = 'execute' AND cpu.nth = 1 AND f.step IS NOT NULL,
               st.num_reqs, st.num_tokens, st.num_prefill_tokens, st.num_decode_tokens,
               st.graph_mode
        FROM cpu
        LEFT JOIN flow_steps f ON f.step = cpu.step
        LEFT JOIN steps st ON st.run_id = $run AND st.step = cpu.step AND cpu.name = 'step'
        ORDER BY cpu.start_ns, cpu.end_ns DESC, cpu.rank"""
    return q.rows(sql)


def rank_rows(q: TrackQuery, rank: int) -> Iterator[Row]:
    """One tensor-parallel rank's steps (``rank_steps``): ``(step, start_ns, end_ns, comm_ns)``."""
    sql = f"""
        SELECT step, start_ns, end_ns, comm_ns FROM rank_steps
        WHERE run_id = $run AND rank = $rank AND {q.step_filter()}
        ORDER BY start_ns, end_ns DESC"""
    return q.rows(sql, rank=rank)


def gpu_rows(q: TrackQuery) -> Iterator[Row]:
    """Per step a GPU ``step`` row (``gpu_start_ns``..``gpu_end_ns``, widened to hold the step's
    GPU spans) around the GPU phase spans: ``(step, name, start_ns, end_ns, rank, flow_in,
    overlap_frac, bubble_ns, bubble_kind, host_prep_ns, hidden_prep_ns, starved_ns,
    perturbed)``; the step columns on ``step`` rows only (``starved_ns`` on both), ``flow_in``
    on the step's first span when the step has a CPU ``execute`` span."""
    valid = "start_ns IS NOT NULL AND end_ns IS NOT NULL"
    sql = f"""
        WITH {_flow_steps(q)},
        g AS (SELECT step, name, start_ns, end_ns, {_PHASE_RANK} AS rank, starved_ns FROM spans
              WHERE run_id = $run AND track = 'gpu' AND {valid} AND {q.step_filter()}),
        env AS (SELECT step, min(start_ns) AS lo, max(end_ns) AS hi FROM g GROUP BY step),
        st AS (SELECT * FROM steps WHERE run_id = $run AND gpu_start_ns IS NOT NULL
               AND gpu_end_ns IS NOT NULL AND {q.step_filter()}),
        ranges AS (
            SELECT coalesce(st.step, env.step) AS step, 'step' AS name,
                   least(st.gpu_start_ns, env.lo) AS start_ns,
                   greatest(st.gpu_end_ns, env.hi) AS end_ns, 0 AS rank, FALSE AS flow_in,
                   st.overlap_frac, st.bubble_ns, st.bubble_kind, st.host_prep_ns,
                   st.hidden_prep_ns, st.starved_ns, st.perturbed
            FROM st FULL OUTER JOIN env ON env.step = st.step),
        leaves AS (
            SELECT g.step, g.name, g.start_ns, g.end_ns, g.rank + 1 AS rank,
                   f.step IS NOT NULL AND row_number() OVER (
                       PARTITION BY g.step ORDER BY g.start_ns, g.end_ns DESC, g.rank) = 1,
                   NULL, NULL, NULL, NULL, NULL, g.starved_ns, NULL
            FROM g LEFT JOIN flow_steps f ON f.step = g.step)
        SELECT * FROM (SELECT * FROM ranges UNION ALL SELECT * FROM leaves)
        ORDER BY start_ns, end_ns DESC, rank"""
    return q.rows(sql)


def kernel_rows(q: TrackQuery, stream: int) -> Iterator[Row]:
    """The kernel trace's kernels of one stream (``-1``: stream unknown): ``(step, phase, name,
    start_ns, end_ns)``."""
    sql = (
        "SELECT step, phase, name, start_ns, end_ns FROM kernels WHERE run_id = $run AND "
        "coalesce(stream, -1) = $stream AND start_ns IS NOT NULL AND end_ns IS NOT NULL AND "
        f"{q.step_filter()} ORDER BY start_ns, end_ns DESC"
    )
    return q.rows(sql, stream=stream)


def _counter_rows(
    q: TrackQuery, time_col: str, table: str, names: tuple[str, ...], where: str
) -> Iterator[Row]:
    sql = (
        f"SELECT {time_col}, {', '.join(names)} FROM {table} WHERE run_id = $run AND "
        f"{time_col} IS NOT NULL AND {where} ORDER BY {time_col}"
    )
    return q.rows(sql)


def runner_counter_rows(q: TrackQuery) -> Iterator[Row]:
    """``(cpu_start_ns, *RUNNER_COUNTERS)`` per step of the window, in time order."""
    return _counter_rows(q, "cpu_start_ns", "steps", RUNNER_COUNTERS, q.step_filter())


def gpu_counter_rows(q: TrackQuery) -> Iterator[Row]:
    """``(t_ns, *GPU_COUNTERS)`` per NVML sample inside the window, in time order."""
    return _counter_rows(q, "t_ns", "gpu_samples", GPU_COUNTERS, q.time_filter())


def _requests_sql(q: TrackQuery, columns: str) -> str:
    alive = "TRUE"
    if q.window:
        first, last = q.time_bounds()
        alive = f"arrival_ns <= {last} AND end_ns >= {first}"
    return f"""
        WITH ends AS (SELECT req_id, max(t_ns) AS last_token_ns FROM tokens
                      WHERE run_id = $run GROUP BY req_id),
        r AS (SELECT q.*, coalesce(q.finish_ns, e.last_token_ns, q.first_token_ns,
                                   q.arrival_ns) AS end_ns
              FROM requests q LEFT JOIN ends e USING (req_id)
              WHERE q.run_id = $run AND q.arrival_ns IS NOT NULL)
        SELECT {columns} FROM r WHERE {alive} ORDER BY arrival_ns, req_id"""


def request_spans(q: TrackQuery) -> Iterator[Row]:
    """``(arrival_ns, end_ns)`` of each request alive in the window, in arrival order; a request
    never finished ends at its last token, else its first, else its arrival."""
    return q.rows(_requests_sql(q, "arrival_ns, end_ns"))


def request_rows(q: TrackQuery) -> Iterator[Row]:
    """The same requests in the same order: ``(req_id, arrival_ns, end_ns, prompt_tokens,
    output_tokens, finish_reason, ttft_ms, e2e_ms, prompt_text, output_text)``."""
    columns = (
        "req_id, arrival_ns, end_ns, prompt_tokens, output_tokens, finish_reason, "
        f"{TTFT_MS}, {E2E_MS}, "
        "prompt_text, output_text"
    )
    return q.rows(_requests_sql(q, columns))
