"""Import an Nsight Systems capture of a run: its kernels, on the run's clock, by step and phase.

``nsys export --type sqlite`` turns a capture into SQLite. Nsight time stamps are ns on the
capture session's own clock, so one offset maps them onto ``perf_counter_ns``: the run-start mark
(``mrv2 run <run_id> perf_counter_ns=<t>``, domain ``mrv2``) gives ``offset = t - mark.start``;
the ``step`` ranges, matched to the run's cpu ``step`` spans by payload (by order when the export
has no payloads), check it (residual) or, without the mark, give it (their median difference).
A kernel is attributed through its launch: kernel ``correlationId`` → the API call with that id in
the run's process → the innermost ``mrv2`` push/pop range on the call's thread around the call's
start → phase (the range's name mapped back through ``NVTX_NAMES``) and step (the range's payload,
else the enclosing ``step`` range's). Every kernel of a CUDA graph replay carries the correlation
id of its ``cudaGraphLaunch``, so all of them get that call's step and phase. A kernel whose
innermost range is ``step`` itself gets phase ``step`` (launched between phase ranges). Kernels
without an API call, or launched outside every ``mrv2`` range, keep step and phase NULL.

Importing replaces every ``kernels`` row of the run (a capture holds all of the process'
kernels; keeping an earlier import beside it would count each kernel twice), so importing the
same file again gives the same table. ``runs.info['nsys_import']`` records file and alignment.
The export is read through ``analysis.nsys_export``.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import median

from mrv2_prof.analysis.nsys_export import (
    KERNEL_NAME_COLUMNS,
    NsysExport,
    NsysImportError,
    columns,
    open_export,
)
from mrv2_prof.inputs.finite_numbers import shown_number
from mrv2_prof.probes.nvtx_ranges import NVTX_NAMES
from mrv2_prof.store import Store

RESIDUAL_WARN_NS = 1_000_000
INT64_MAX = 2**63 - 1  # the store's times are BIGINT ns


@dataclass
class NsysImport:
    """What one import stored and how the capture's clock was aligned with the run's."""

    run_id: str
    report: str
    num_kernels: int = 0
    num_with_step: int = 0
    num_in_phase: int = 0  # in a phase range (phase other than 'step')
    num_no_api_call: int = 0  # no runtime/driver call with the kernel's correlation id
    num_outside_ranges: int = 0  # launched outside every mrv2 range
    num_replaced: int = 0
    offset_ns: int = 0  # perf_counter_ns = nsys time + offset_ns
    alignment: str = "start mark"  # start mark | step ranges
    num_steps_matched: int = 0
    residual_median_ns: int | None = None
    residual_max_ns: int | None = None
    session_start_utc_ns: int | None = None
    notes: list[str] = field(default_factory=list)


def import_nsys(store: Store, run_ref: str, report: str | Path) -> NsysImport:
    """Store the kernels of ``report`` (an nsys SQLite export) as run ``run_ref``'s kernels."""
    if store.read_only:
        raise ValueError("import_nsys needs a store opened writable")
    run_id = store.resolve_run(run_ref)
    result = NsysImport(run_id=run_id, report=str(report))
    with closing(open_export(report)) as con:
        try:
            export = NsysExport(con, Path(report), result.notes)
            result.session_start_utc_ns = export.session_start_utc_ns
            pid = _align(export, run_id, _run_steps(store, run_id), result)
            kernels = _kernels(export, pid, result)
        except sqlite3.DatabaseError as exc:
            raise NsysImportError(f"{report}: cannot read the export ({exc})") from exc
    _store_kernels(store, kernels, result)
    return result


def _run_steps(store: Store, run_id: str) -> list[tuple[int, int]]:
    """(step, start_ns) of the run's cpu ``step`` spans, in time order."""
    return store.connection.execute(
        "SELECT step, start_ns FROM spans WHERE run_id = ? AND track = 'cpu' AND name = 'step' "
        "AND step IS NOT NULL AND start_ns IS NOT NULL ORDER BY start_ns",
        [run_id],
    ).fetchall()


def _align(
    export: NsysExport, run_id: str, run_steps: list[tuple[int, int]], result: NsysImport
) -> int:
    """Set the result's offset and residual; return the run's process (``globalTid >> 24``)."""
    path = export.path
    marks = export.start_marks()
    mine = [m for m in marks if m[0] == run_id]
    offset = None
    if mine:
        _, anchor_ns, start, pid = mine[0]
        offset = _offset(path, run_id, anchor_ns, start)
    elif marks:
        others = ", ".join(sorted({m[0] for m in marks}))
        raise NsysImportError(
            f"{path}: a capture of run {others}, not of run {run_id}; import it into that run"
        )
    else:
        pids = [
            r[0]
            for r in export.con.execute("SELECT DISTINCT pid FROM mrv2_ranges WHERE name = 'step'")
        ]
        if len(pids) != 1:
            found = "no mrv2 step ranges" if not pids else f"step ranges of {len(pids)} processes"
            raise NsysImportError(
                f"{path}: cannot align the capture with run {run_id}: no 'mrv2 run {run_id}' "
                f"start mark and {found} (capture with nsys profile --trace=cuda,nvtx)"
            )
        pid = pids[0]
        result.alignment = "step ranges"
        result.notes.append(f"no start mark of run {run_id}: aligned on the step ranges")
    pairs = _match_steps(export, pid, run_steps, result)
    if offset is None:
        if not pairs:
            raise NsysImportError(
                f"{path}: cannot align the capture with run {run_id}: no start mark and "
                "no step range matches a step of the run"
            )
        offset = round(median(run_ns - nsys_ns for nsys_ns, run_ns in pairs))
    result.offset_ns = offset
    result.num_steps_matched = len(pairs)
    if not pairs:
        result.notes.append("no step range matches a step of the run: alignment unchecked")
        return pid
    residuals = [abs(nsys_ns + offset - run_ns) for nsys_ns, run_ns in pairs]
    result.residual_median_ns = round(median(residuals))
    result.residual_max_ns = max(residuals)
    if result.residual_median_ns > RESIDUAL_WARN_NS:
        result.notes.append(
            f"step ranges are {result.residual_median_ns / 1e6:.1f} ms (median) away from "
            "the run's steps: is this a capture of this run?"
        )
    return pid


def _offset(path: Path, run_id: str, anchor_ns: int, start: object) -> int:
    """``anchor_ns - start`` of the run's start mark, both signed 64-bit ns as the store's
    times; anything else is an ``NsysImportError`` before anything is stored."""
    where = f"{path}: start mark 'mrv2 run {run_id}'"
    if not 0 <= anchor_ns <= INT64_MAX:
        raise NsysImportError(
            f"{where}: perf_counter_ns must be between 0 and {INT64_MAX:,} (a signed 64-bit "
            f"count of ns), got {shown_number(anchor_ns)}"
        )
    if type(start) is not int or not -INT64_MAX <= anchor_ns - start <= INT64_MAX:
        raise NsysImportError(f"{where}: start {shown_number(start)} is not a 64-bit ns time")
    return anchor_ns - start


def _match_steps(
    export: NsysExport, pid: int, run_steps: list[tuple[int, int]], result: NsysImport
) -> list[tuple[int, int]]:
    """(nsys start, run start) per step; without payloads the step ranges get them by order."""
    rows = export.con.execute(
        "SELECT id, payload, start FROM mrv2_ranges WHERE pid = ? AND name = 'step' ORDER BY start",
        [pid],
    ).fetchall()
    if all(payload is not None for _, payload, _ in rows):
        run_start = dict(run_steps)
        return [(start, run_start[p]) for _, p, start in rows if p in run_start]
    result.notes.append(
        f"step ranges without payload: numbered by order ({len(rows)} in the capture, "
        f"{len(run_steps)} in the run)"
    )
    pairs = []
    for (range_id, _, start), (step, run_start_ns) in zip(rows, run_steps, strict=False):
        export.con.execute("UPDATE mrv2_ranges SET payload = ? WHERE id = ?", [step, range_id])
        pairs.append((start, run_start_ns))
    return pairs


def _kernels(export: NsysExport, pid: int, result: NsysImport) -> dict[str, list]:
    """The process' kernels as ``kernels`` columns, mapped to perf_counter_ns, attributed."""
    con = export.con
    kernel_cols = columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
    name_col = next(c for c in KERNEL_NAME_COLUMNS if c in kernel_cols)
    in_process = "k.globalPid >> 24 = :pid" if "globalPid" in kernel_cols else "1"
    if "globalPid" not in kernel_cols:
        result.notes.append("kernels carry no process id in this export: all are imported")
    con.execute(
        "CREATE TEMP TABLE launches (corr INTEGER PRIMARY KEY, tid INTEGER, start INTEGER, "
        "inner_id INTEGER, step_payload INTEGER)"
    )
    # One API call per correlation id (the earliest row: backtrace rows repeat a call).
    con.execute(
        "INSERT INTO launches (corr, tid, start) "
        "SELECT r.correlationId, r.globalTid, min(r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "WHERE r.globalTid >> 24 = :pid AND r.correlationId IN "
        f"(SELECT k.correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE {in_process}) "
        "GROUP BY r.correlationId",
        {"pid": pid},
    )
    enclosing = 'r.tid = launches.tid AND r.start <= launches.start AND r."end" >= launches.start'
    con.execute(
        f"UPDATE launches SET "
        f"inner_id = (SELECT r.id FROM mrv2_ranges r WHERE {enclosing} "
        f'ORDER BY r.start DESC, r."end" ASC LIMIT 1), '
        f"step_payload = (SELECT r.payload FROM mrv2_ranges r WHERE {enclosing} "
        f"AND r.name = 'step' ORDER BY r.start DESC LIMIT 1)"
    )
    con.execute("CREATE TEMP TABLE phase_names (name TEXT PRIMARY KEY, phase TEXT)")
    con.executemany(
        "INSERT INTO phase_names VALUES (?, ?)", [(v, k) for k, v in NVTX_NAMES.items()]
    )
    rows = con.execute(
        f'SELECT k.start + :off, k."end" + :off, k.streamId, kn.value, '
        f"coalesce(r.payload, l.step_payload), p.phase, l.corr IS NOT NULL, r.id IS NOT NULL "
        f"FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        f"LEFT JOIN StringIds kn ON kn.id = k.{name_col} "
        f"LEFT JOIN launches l ON l.corr = k.correlationId "
        f"LEFT JOIN mrv2_ranges r ON r.id = l.inner_id "
        f"LEFT JOIN phase_names p ON p.name = r.name "
        f"WHERE {in_process} ORDER BY k.start",
        {"pid": pid, "off": result.offset_ns},
    ).fetchall()
    start_ns, end_ns, stream, name, step, phase, has_call, in_range = (
        list(col) for col in (zip(*rows, strict=True) if rows else [()] * 8)
    )
    result.num_kernels = len(rows)
    result.num_with_step = sum(s is not None for s in step)
    result.num_in_phase = sum(p not in (None, "step") for p in phase)
    result.num_no_api_call = sum(not c for c in has_call)
    result.num_outside_ranges = sum(
        bool(c) and not r for c, r in zip(has_call, in_range, strict=True)
    )
    if not rows:
        result.notes.append("the capture holds no kernel of the run's process")
    return {
        "step": step,
        "phase": phase,
        "name": name,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "stream": stream,
    }


def _store_kernels(store: Store, kernels: dict[str, list], result: NsysImport) -> None:
    """Replace the run's ``kernels`` rows and record the import in ``runs.info``, atomically."""
    con, run_id = store.connection, result.run_id
    row = con.execute("SELECT info FROM runs WHERE run_id = ?", [run_id]).fetchall()
    info = json.loads(row[0][0]) if row and row[0][0] else {}
    info["nsys_import"] = {
        "report": str(Path(result.report).resolve()),
        "kernels": result.num_kernels,
        "offset_ns": result.offset_ns,
        "alignment": result.alignment,
        "residual_median_ns": result.residual_median_ns,
        "residual_max_ns": result.residual_max_ns,
    }
    con.execute("BEGIN TRANSACTION")
    try:
        result.num_replaced = con.execute(
            "DELETE FROM kernels WHERE run_id = ?", [run_id]
        ).fetchall()[0][0]
        store.append(run_id, "kernels", kernels)
        store.update_run(run_id, info=info)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def summary_lines(result: NsysImport) -> list[str]:
    """What the import did, for the CLI: counts, offset, residual, notes."""
    unattributed = result.num_no_api_call + result.num_outside_ranges
    lines = [
        f"imported {result.num_kernels} kernels into run {result.run_id} from {result.report}"
        f" (replaced {result.num_replaced} earlier rows)",
        f"  attributed to a step: {result.num_with_step}, to a phase: {result.num_in_phase}",
        f"  unattributed: {unattributed} ({result.num_no_api_call} without an API call in the "
        f"run's process, {result.num_outside_ranges} launched outside every mrv2 range)",
        f"  clock offset: perf_counter_ns = nsys time + {result.offset_ns} ns "
        f"(from the {result.alignment})",
    ]
    if result.residual_median_ns is not None:
        lines.append(
            f"  alignment residual over {result.num_steps_matched} steps: median "
            f"{result.residual_median_ns / 1e3:.1f} µs, max {result.residual_max_ns / 1e3:.1f} µs"
        )
    if result.session_start_utc_ns:
        started = datetime.fromtimestamp(result.session_start_utc_ns / 1e9, tz=timezone.utc)
        lines.append(f"  capture started {started.isoformat(timespec='seconds')}")
    lines += [f"  note: {note}" for note in result.notes]
    return lines
