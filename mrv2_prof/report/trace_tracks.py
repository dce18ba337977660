"""What goes on each track of the exported trace: one query per track, rows in time order.

Each generator streams ``Slice``s (or counter events) straight from a DuckDB cursor in the
order ``chrome_trace.laminar`` needs: by start, the enclosing slice first. The track layout and
the flow form are described in ``trace_export``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import duckdb

from mrv2_prof.probes.api import PHASES
from mrv2_prof.probes.nvtx_ranges import DOMAIN, NVTX_NAMES, batch_shape
from mrv2_prof.report.chrome_trace import Event, Slice, us

CPU_PID, GPU_PID = 1, 2
RANK_PID = 10  # + rank: each tensor-parallel rank's own process track (rank_steps)
PHASE_TID = STREAM_TID = 1
FIRST_KERNEL_TID = 2
COUNTER_TID = 100
RUNNER_COUNTERS = ("kv_used_blocks", "num_running", "num_waiting")
GPU_COUNTERS = ("gpu_util", "mem_used_bytes", "power_w", "sm_clock_mhz")
KERNEL_CATEGORY = "cuda_kernel"
_PHASE_RANK = "list_position([" + ", ".join(f"'{p}'" for p in PHASES) + "], name)"
_FETCH_ROWS = 10_000


@dataclass
class TrackQuery:
    """The run, its step window and the trace origin, shared by every track's query."""

    con: duckdb.DuckDBPyConnection
    run_id: str
    origin_ns: int
    window: tuple[int, int] | None

    def step_filter(self, column: str = "step") -> str:
        return f"{column} BETWEEN $lo AND $hi" if self.window else "TRUE"

    def params(self, sql: str, **extra: Any) -> dict[str, Any]:
        params = {"run": self.run_id, **extra}
        if self.window:
            params.update(lo=self.window[0], hi=self.window[1])
        return {k: v for k, v in params.items() if f"${k}" in sql}

    def rows(self, sql: str, **extra: Any) -> Iterator[tuple[Any, ...]]:
        cursor = self.con.cursor()
        cursor.execute(sql, self.params(sql, **extra))
        while batch := cursor.fetchmany(_FETCH_ROWS):
            yield from batch
        cursor.close()

    def value(self, sql: str, **extra: Any) -> Any:
        return self.con.execute(sql, self.params(sql, **extra)).fetchall()[0][0]

    def time_filter(self) -> str:
        """``t_ns`` inside the window: from the first to the last stored time of its steps."""
        if not self.window:
            return "TRUE"
        first, last = self.time_bounds()
        return f"t_ns BETWEEN {first} AND {last}"

    def time_bounds(self) -> tuple[str, str]:
        """SQL of the window's first and last stored time (its steps' and their spans')."""
        w = "run_id = $run AND step BETWEEN $lo AND $hi"
        bounds = (
            f"SELECT start_ns AS lo, end_ns AS hi FROM spans WHERE {w} UNION ALL SELECT "
            f"least(cpu_start_ns, gpu_start_ns), greatest(cpu_end_ns, gpu_end_ns) "
            f"FROM steps WHERE {w}"
        )
        return f"(SELECT min(lo) FROM ({bounds}))", f"(SELECT max(hi) FROM ({bounds}))"


def _flow_steps(q: TrackQuery) -> str:
    """Steps with both a CPU ``execute`` span and a GPU span: each gets one flow arrow."""
    return (
        "flow_steps AS (SELECT step FROM spans WHERE run_id = $run AND track = 'cpu' AND "
        f"name = 'execute' AND {q.step_filter()} INTERSECT SELECT step FROM spans WHERE "
        f"run_id = $run AND track = 'gpu' AND start_ns IS NOT NULL AND end_ns IS NOT NULL AND "
        f"{q.step_filter()})"
    )


def _args(step: int | None, payload: bool = True, **extra: Any) -> dict[str, Any]:
    """Slice args without NULLs; an NVTX range's ``payload`` is its step, as in nsys."""
    args: dict[str, Any] = {} if step is None else {"step": step}
    if payload and step is not None:
        args["payload"] = step
    for key, value in extra.items():
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            args[key] = value
    return args


def cpu_slices(q: TrackQuery) -> Iterator[Slice]:
    """The CPU phase spans; ``step`` slices carry the batch shape, ``execute`` the flow start."""
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
    for step, name, start, end, flow_out, reqs, tokens, prefill, decode, mode in q.rows(sql):
        batch = None
        if None not in (reqs, tokens, prefill, mode):
            batch = batch_shape(reqs, tokens, prefill, mode)
        event: Event = {
            "name": NVTX_NAMES.get(name, name),
            "cat": DOMAIN,
            "pid": CPU_PID,
            "tid": PHASE_TID,
            "args": _args(
                step,
                num_reqs=reqs,
                num_tokens=tokens,
                num_prefill_tokens=prefill,
                num_decode_tokens=decode,
                graph_mode=mode,
                batch=batch,
            ),
        }
        if flow_out:
            event.update(bind_id=step + 1, flow_out=True)
        yield Slice(start - q.origin_ns, end - q.origin_ns, event)


def rank_slices(q: TrackQuery, rank: int) -> Iterator[Slice]:
    """One tensor-parallel rank's step spans (``rank_steps``), with their collective time."""
    sql = f"""
        SELECT step, start_ns, end_ns, comm_ns FROM rank_steps
        WHERE run_id = $run AND rank = $rank AND {q.step_filter()}
        ORDER BY start_ns, end_ns DESC"""
    for step, start, end, comm in q.rows(sql, rank=rank):
        event: Event = {
            "name": f"step {step}",
            "cat": DOMAIN,
            "pid": RANK_PID + rank,
            "tid": PHASE_TID,
            "args": _args(step, comm_us=None if comm is None else us(comm)),
        }
        yield Slice(start - q.origin_ns, end - q.origin_ns, event)


def gpu_slices(q: TrackQuery) -> Iterator[Slice]:
    """Per step a GPU ``step`` slice (``gpu_start_ns``..``gpu_end_ns``, widened to hold the step's
    GPU spans, with the step's overlap, bubble, starved time and perturbed flag) around the GPU
    phase spans (each with its starved time: the device waiting for the host inside it); the
    first span of a step ends the flow from its CPU ``execute``."""
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
    for row in q.rows(sql):
        step, name, start, end, _, flow_in, overlap, bubble, kind, prep, hidden, starved, pert = row
        event: Event = {
            "name": NVTX_NAMES.get(name, name),
            "cat": DOMAIN,
            "pid": GPU_PID,
            "tid": STREAM_TID,
            "args": _args(
                step,
                overlap_frac=overlap,
                bubble_ns=bubble,
                bubble_kind=kind,
                host_prep_ns=prep,
                hidden_prep_ns=hidden,
                starved_ns=starved,
                perturbed=pert or None,
            ),
        }
        if flow_in:
            event.update(bind_id=step + 1, flow_in=True)
        yield Slice(start - q.origin_ns, end - q.origin_ns, event)


def kernel_slices(q: TrackQuery, stream: int, tid: int) -> Iterator[Slice]:
    """The kernel trace's kernels of one stream (``-1``: stream unknown), CUDA's names."""
    sql = (
        "SELECT step, phase, name, start_ns, end_ns FROM kernels WHERE run_id = $run AND "
        "coalesce(stream, -1) = $stream AND start_ns IS NOT NULL AND end_ns IS NOT NULL AND "
        f"{q.step_filter()} ORDER BY start_ns, end_ns DESC"
    )
    for step, phase, name, start, end in q.rows(sql, stream=stream):
        event: Event = {
            "name": name or "[kernel]",
            "cat": KERNEL_CATEGORY,
            "pid": GPU_PID,
            "tid": tid,
            "args": _args(step, payload=False, phase=phase),
        }
        yield Slice(start - q.origin_ns, end - q.origin_ns, event)


def counters(
    q: TrackQuery, pid: int, time_col: str, table: str, names: tuple[str, ...], where: str
) -> Iterator[Event]:
    """``C`` events, one per counter and row, in time order on the (pid, COUNTER_TID) track."""
    sql = (
        f"SELECT {time_col}, {', '.join(names)} FROM {table} WHERE run_id = $run AND "
        f"{time_col} IS NOT NULL AND {where} ORDER BY {time_col}"
    )
    for t_ns, *values in q.rows(sql):
        ts = us(t_ns - q.origin_ns)
        for name, value in zip(names, values, strict=True):
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                yield {"ph": "C", "name": name, "pid": pid, "tid": COUNTER_TID, "ts": ts,
                       "args": {"value": value}}  # fmt: skip
