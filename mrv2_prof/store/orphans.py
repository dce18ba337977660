"""Runs left ``running`` by a process that no longer exists.

Every run row names the process that writes it (``runs.writer_pid``, ``runs.writer_host``). A
reader shows a ``running`` run whose writer is gone as such (``writer_gone``); the next writable
open marks it ``failed`` with the reason, since nothing will ever finish it. A writer on another
host, or a row without a writer (older files), cannot be told apart from a live one and is left
as it is.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from pathlib import Path

import duckdb

_START_SLACK_S = 2.0  # /proc start times are in clock ticks after a boot time in whole seconds


def this_writer() -> tuple[int, str]:
    """The pid and host name a run row records for the process writing it."""
    return os.getpid(), socket.gethostname()


def writer_alive(pid: int | None, host: str | None, started_at: dt.datetime | None) -> bool | None:
    """Whether the process that wrote a run still exists; None when that cannot be told here.

    A pid now used by a process that started after the run did (pid reuse), or by a zombie,
    counts as gone."""
    if pid is None or host is None or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    except OSError:
        return None
    state, start_s = _proc_state(pid)
    if state == "Z":
        return False
    known = start_s is not None and started_at is not None
    return not (known and start_s > started_at.timestamp() + _START_SLACK_S)  # else: reused


def _proc_state(pid: int) -> tuple[str | None, float | None]:
    """The process's state letter and its start time (seconds since the epoch), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        with open("/proc/stat") as fp:
            btime = next(int(line.split()[1]) for line in fp if line.startswith("btime "))
        return fields[0], btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None, None


def gone_reason(pid: int, host: str) -> str:
    return (
        f"its writer (PID {pid} on {host}) ended without finishing the run; "
        "marked failed when the database was next opened for writing"
    )


def fail_orphaned_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Mark every ``running`` run whose writer is gone ``failed`` with the reason; returns
    their ids. Called by a writable open (a read-only one only shows them)."""
    marked = []
    for run_id, pid, host, started_at in con.execute(
        "SELECT run_id, writer_pid, writer_host, started_at FROM runs WHERE status = 'running'"
    ).fetchall():
        if writer_alive(pid, host, started_at) is False:
            con.execute(
                "UPDATE runs SET status = 'failed', error = ? "
                "WHERE run_id = ? AND status = 'running'",
                [gone_reason(pid, host), run_id],
            )
            marked.append(run_id)
    return marked
