"""Reading an Nsight Systems SQLite export (``nsys export --type sqlite``) for the nsys import:
the tables and columns it needs, and the run's ``mrv2`` NVTX ranges in one temp table.

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

import re
import sqlite3
from pathlib import Path

from mrv2_prof.probes.nvtx_ranges import DOMAIN, NVTX_NAMES

REQUIRED = {
    "StringIds": ("id", "value"),
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "globalTid", "correlationId"),
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "streamId", "correlationId"),
}
EVENT_TYPES = {"NvtxMark": 34, "NvtxPushPopRange": 59, "NvtxDomainCreate": 75}
PAYLOAD_COLUMNS = ("int64Value", "uint64Value", "int32Value", "uint32Value")
KERNEL_NAME_COLUMNS = ("demangledName", "shortName", "mangledName")
START_MARK = re.compile(r"mrv2 run (\S+) perf_counter_ns=(-?\d+)")
HOW_TO_EXPORT = "export the capture with: nsys export --type sqlite REPORT.nsys-rep"


class NsysImportError(Exception):
    """A capture that cannot be imported; ``str()`` is one line naming the file."""


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


def _coalesce(exprs: list[str]) -> str:
    return "NULL" if not exprs else exprs[0] if len(exprs) == 1 else f"COALESCE({', '.join(exprs)})"


class NsysExport:
    """One open export: how its NVTX text and payload are read, its event type ids, and the
    ``mrv2`` push/pop ranges in the temp table ``mrv2_ranges``. Notes go to ``notes``."""

    def __init__(self, con: sqlite3.Connection, path: Path, notes: list[str]) -> None:
        self.con, self.path, self.notes = con, path, notes
        self.session_start_utc_ns: int | None = None  # wall clock at capture start
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
            self.session_start_utc_ns = None if row is None else row[0]
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
            self.notes.append(
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

    def start_marks(self) -> list[tuple[str, int, int, int]]:
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
