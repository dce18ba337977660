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

Schema relied on (the Nsight Systems "SQLite schema reference", as quoted by public readers of
the export such as nsys2json, and NVIDIA's own stats scripts):
* ``StringIds(id, value)``: interned strings.
* ``NVTX_EVENTS(start, end, eventType, text, textId → StringIds, globalTid, domainId, int64Value,
  uint64Value, int32Value, uint32Value, …)``; eventType 34 NvtxMark, 59 NvtxPushPopRange,
  60 NvtxStartEndRange, 75 NvtxDomainCreate (``text`` = domain name), by name from
  ``ENUM_NSYS_EVENT_TYPE`` when present. Registered messages (the ``nvtx`` package registers
  them) are in ``textId``, others in ``text``. A Python int payload is INT64 → ``int64Value``.
* ``CUPTI_ACTIVITY_KIND_RUNTIME(start, end, eventClass, globalTid, correlationId, nameId)``:
  runtime and driver API calls (eventClass 0/1); backtrace rows repeat a call's correlation id,
  so one row per id is taken (the earliest).
* ``CUPTI_ACTIVITY_KIND_KERNEL(start, end, deviceId, streamId, correlationId, globalPid,
  demangledName, shortName → StringIds)``; the demangled name is stored.
* ``TARGET_INFO_SESSION_START_TIME(utcEpochNs, …)``: wall clock at capture start, reported only.
* ``globalTid`` = hardware/VM id << 48 | pid << 24 | tid, ``globalPid`` the same with tid 0, so
  ``x >> 24`` names the process (correlation ids are unique per process only).
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import median

from mrv2_prof.probes.nvtx_ranges import DOMAIN, NVTX_NAMES
from mrv2_prof.store import Store

REQUIRED = {
    "StringIds": ("id", "value"),
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "globalTid", "correlationId"),
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "streamId", "correlationId"),
}
EVENT_TYPES = {"NvtxMark": 34, "NvtxPushPopRange": 59, "NvtxDomainCreate": 75}
PAYLOAD_COLUMNS = ("int64Value", "uint64Value", "int32Value", "uint32Value")
KERNEL_NAME_COLUMNS = ("demangledName", "shortName", "mangledName")
RESIDUAL_WARN_NS = 1_000_000
START_MARK = re.compile(r"mrv2 run (\S+) perf_counter_ns=(-?\d+)")
HOW_TO_EXPORT = "export the capture with: nsys export --type sqlite REPORT.nsys-rep"


class NsysImportError(Exception):
    """A capture that cannot be imported; ``str()`` is one line naming the file."""


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


def open_export(path: str | Path) -> sqlite3.Connection:
    """Open an nsys SQLite export read-only, checking the tables and columns the import reads."""
    path = Path(path)
    if not path.is_file():
        raise NsysImportError(f"{path}: no such file; {HOW_TO_EXPORT}")
    con = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = [t for t in REQUIRED if t not in tables]
        if missing:
            raise NsysImportError(
                f"{path}: not an Nsight Systems export with CUDA and NVTX data: no table "
                f"{', '.join(missing)} (profile with nsys profile --trace=cuda,nvtx; "
                f"{HOW_TO_EXPORT})"
            )
        for table, needed in REQUIRED.items():
            lacking = [c for c in needed if c not in columns(con, table)]
            if lacking:
                raise NsysImportError(f"{path}: table {table} has no column {', '.join(lacking)}")
        if not columns(con, "NVTX_EVENTS") & {"text", "textId"}:
            raise NsysImportError(f"{path}: table NVTX_EVENTS has no column text or textId")
        if not columns(con, "CUPTI_ACTIVITY_KIND_KERNEL") & set(KERNEL_NAME_COLUMNS):
            raise NsysImportError(f"{path}: table CUPTI_ACTIVITY_KIND_KERNEL has no name column")
    except sqlite3.DatabaseError as exc:
        con.close()
        raise NsysImportError(f"{path}: not an SQLite file ({exc}); {HOW_TO_EXPORT}") from exc
    except BaseException:
        con.close()
        raise
    return con


def columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f'PRAGMA table_info("{table}")')}


def import_nsys(store: Store, run_ref: str, report: str | Path) -> NsysImport:
    """Store the kernels of ``report`` (an nsys SQLite export) as run ``run_ref``'s kernels."""
    if store.read_only:
        raise ValueError("import_nsys needs a store opened writable")
    run_id = store.resolve_run(run_ref)
    result = NsysImport(run_id=run_id, report=str(report))
    with closing(open_export(report)) as con:
        try:
            capture = _Capture(con, Path(report), result)
            pid = capture.align(run_id, _run_steps(store, run_id))
            kernels = capture.kernels(pid)
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


def _coalesce(exprs: list[str]) -> str:
    return "NULL" if not exprs else exprs[0] if len(exprs) == 1 else f"COALESCE({', '.join(exprs)})"


class _Capture:
    """One open export: the run's ``mrv2`` ranges in a temp table, alignment, attribution."""

    def __init__(self, con: sqlite3.Connection, path: Path, result: NsysImport) -> None:
        self.con, self.path, self.result = con, path, result
        nvtx = columns(con, "NVTX_EVENTS")
        self.text = _coalesce(
            [e for c, e in (("text", "n.text"), ("textId", "s.value")) if c in nvtx]
        )
        self.strings = "LEFT JOIN StringIds s ON s.id = n.textId" if "textId" in nvtx else ""
        self.payload = _coalesce([f"n.{c}" for c in PAYLOAD_COLUMNS if c in nvtx])
        self.types = dict(EVENT_TYPES)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "ENUM_NSYS_EVENT_TYPE" in tables:
            for type_id, name in con.execute("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE"):
                if name in self.types:
                    self.types[name] = type_id
        if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in columns(
            con, "TARGET_INFO_SESSION_START_TIME"
        ):
            row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
            result.session_start_utc_ns = None if row is None else row[0]
        self._load_ranges("domainId" in nvtx)

    def _load_ranges(self, has_domain: bool) -> None:
        """Temp table ``mrv2_ranges``: push/pop ranges of domain mrv2 named as in NVTX_NAMES."""
        con, text = self.con, self.text
        con.execute("CREATE TEMP TABLE mrv2_domains (pid INTEGER, domainId INTEGER)")
        if has_domain:
            con.execute(
                f"INSERT INTO mrv2_domains SELECT DISTINCT n.globalTid >> 24, n.domainId "
                f"FROM NVTX_EVENTS n {self.strings} WHERE n.eventType = ? AND {text} = ?",
                [self.types["NvtxDomainCreate"], DOMAIN],
            )
        in_domain = "1"
        if con.execute("SELECT count(*) FROM mrv2_domains").fetchone()[0]:
            in_domain = (
                "EXISTS (SELECT 1 FROM mrv2_domains d "
                "WHERE d.pid = n.globalTid >> 24 AND d.domainId = n.domainId)"
            )
        else:
            self.result.notes.append(
                f"no NVTX domain {DOMAIN!r} in the export; ranges of any domain named as "
                "mrv2's are used"
            )
        con.execute(
            "CREATE TEMP TABLE mrv2_ranges (id INTEGER PRIMARY KEY, tid INTEGER, pid INTEGER, "
            'start INTEGER, "end" INTEGER, name TEXT, payload INTEGER)'
        )
        names = list(NVTX_NAMES.values())
        con.execute(
            f'INSERT INTO mrv2_ranges (tid, pid, start, "end", name, payload) '
            f'SELECT n.globalTid, n.globalTid >> 24, n.start, n."end", {text}, {self.payload} '
            f"FROM NVTX_EVENTS n {self.strings} "
            f'WHERE n.eventType = ? AND n."end" IS NOT NULL AND {in_domain} '
            f"AND {text} IN ({', '.join('?' * len(names))})",
            [self.types["NvtxPushPopRange"], *names],
        )
        con.execute("CREATE INDEX mrv2_ranges_by_thread ON mrv2_ranges (tid, start)")

    def align(self, run_id: str, run_steps: list[tuple[int, int]]) -> int:
        """Set the result's offset and residual; return the run's process (``globalTid >> 24``)."""
        result, path = self.result, self.path
        marks = self._start_marks()
        mine = [m for m in marks if m[0] == run_id]
        offset = None
        if mine:
            _, anchor_ns, start, pid = mine[0]
            offset = anchor_ns - start
        elif marks:
            others = ", ".join(sorted({m[0] for m in marks}))
            raise NsysImportError(
                f"{path}: a capture of run {others}, not of run {run_id}; import it into that run"
            )
        else:
            pids = [
                r[0]
                for r in self.con.execute(
                    "SELECT DISTINCT pid FROM mrv2_ranges WHERE name = 'step'"
                )
            ]
            if len(pids) != 1:
                found = (
                    "no mrv2 step ranges" if not pids else f"step ranges of {len(pids)} processes"
                )
                raise NsysImportError(
                    f"{path}: cannot align the capture with run {run_id}: no 'mrv2 run {run_id}' "
                    f"start mark and {found} (capture with nsys profile --trace=cuda,nvtx)"
                )
            pid = pids[0]
            result.alignment = "step ranges"
            result.notes.append(f"no start mark of run {run_id}: aligned on the step ranges")
        pairs = self._match_steps(pid, run_steps)
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

    def _start_marks(self) -> list[tuple[str, int, int, int]]:
        """(run_id, perf_counter_ns, nsys start, pid) of every run-start mark, in time order."""
        rows = self.con.execute(
            f"SELECT {self.text}, n.start, n.globalTid >> 24 FROM NVTX_EVENTS n {self.strings} "
            f"WHERE n.eventType = ? AND {self.text} LIKE 'mrv2 run %' ORDER BY n.start",
            [self.types["NvtxMark"]],
        ).fetchall()
        marks = []
        for message, start, pid in rows:
            m = START_MARK.fullmatch(message.strip())
            if m:
                marks.append((m[1], int(m[2]), start, pid))
        return marks

    def _match_steps(self, pid: int, run_steps: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """(nsys start, run start) per step; without payloads the step ranges get them by order."""
        rows = self.con.execute(
            "SELECT id, payload, start FROM mrv2_ranges WHERE pid = ? AND name = 'step' "
            "ORDER BY start",
            [pid],
        ).fetchall()
        if all(payload is not None for _, payload, _ in rows):
            run_start = dict(run_steps)
            return [(start, run_start[p]) for _, p, start in rows if p in run_start]
        self.result.notes.append(
            f"step ranges without payload: numbered by order ({len(rows)} in the capture, "
            f"{len(run_steps)} in the run)"
        )
        pairs = []
        for (range_id, _, start), (step, run_start_ns) in zip(rows, run_steps, strict=False):
            self.con.execute("UPDATE mrv2_ranges SET payload = ? WHERE id = ?", [step, range_id])
            pairs.append((start, run_start_ns))
        return pairs

    def kernels(self, pid: int) -> dict[str, list]:
        """The process' kernels as ``kernels`` columns, mapped to perf_counter_ns, attributed."""
        con, result = self.con, self.result
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
        enclosing = (
            'r.tid = launches.tid AND r.start <= launches.start AND r."end" >= launches.start'
        )
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
