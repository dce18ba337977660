"""Files the command line writes (``report -o``, ``export -o``): checked before anything is
rendered, written beside the target and renamed over it.

A target is refused when it is the run database (or its write-ahead log) under any spelling:
the check compares the file's device and inode, so ``./runs.duckdb``, an absolute path, a
symlink or a hard link to the database are all the same file. Any other DuckDB database is
refused too, whatever ``--db`` names: an existing file with DuckDB's magic bytes (``DUCK`` at
offset 8 of its header), the write-ahead log beside one, and anything in a live-run directory
(``<db>.live/``, where a run killed before its merge keeps its rows). No option writes over a
database: whoever means to replace one deletes it first. Directories, devices, FIFOs and
sockets are refused too. The text goes to a temporary file in the target's directory (the
directory of a symlink's target, so the link stays a link) and replaces the target only once it
is fully written and flushed: a failed write leaves the old file as it was.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from mrv2_prof.store.live_runs import LIVE_SUFFIX
from mrv2_prof.views.safe_text import plain

# DuckDB's file header: a checksum (8 bytes), then the magic bytes
_MAGIC, _MAGIC_AT = b"DUCK", 8


class OutputError(Exception):
    """An output file that cannot be written; ``str()`` is one line naming it."""


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _is_database(target: Path, st: os.stat_result | None, db: Path) -> bool:
    """Whether ``target`` is ``db`` or the write-ahead log DuckDB keeps beside it (by name, since
    the log need not exist yet, and by inode, for hard links)."""
    for p in (db, db.with_name(db.name + ".wal")):
        if Path(os.path.realpath(p)) == target:
            return True
        if st is not None and _identity(p) == (st.st_dev, st.st_ino):
            return True
    return False


def _has_magic(path: Path) -> bool:
    """Whether the regular file ``path`` starts as a DuckDB database does (``OSError`` when it
    cannot be read: then nobody can tell, and it is not written over)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        head = os.pread(fd, _MAGIC_AT + len(_MAGIC), 0)
    finally:
        os.close(fd)
    return head[_MAGIC_AT:] == _MAGIC


def _another_database(path: Path, target: Path, st: os.stat_result | None) -> str | None:
    """What ``target`` (``path`` resolved) is when it belongs to a DuckDB database, else None."""
    for directory in (Path(os.path.abspath(path)).parent, target.parent):
        if directory.name.endswith(LIVE_SUFFIX):
            where = plain(str(directory), limit=200)
            return f"is in {where}, a live-run directory (its side files hold runs not yet merged)"
    if st is not None and _has_magic(target):
        return "is a DuckDB database"
    if target.name.endswith(".wal"):
        main = target.with_name(target.name[: -len(".wal")])
        if main.is_file() and _has_magic(main):
            return f"is the write-ahead log of the DuckDB database {plain(str(main), limit=200)}"
    return None


def check_output(path: Path, databases: list[Path], what: str) -> Path:
    """The file to replace (``path`` with symlinks resolved); ``OutputError`` if ``path`` is a
    database of the run or any other DuckDB database (its log, a live run's side file), a
    directory or not a regular file, or its directory does not exist."""
    shown = plain(str(path), limit=200)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"{shown}: cannot write the {what} ({exc.strerror or exc})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{shown}: is a directory; give a file name for the {what}")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(
                f"{shown}: is not a regular file (a device, FIFO or socket); "
                f"the {what} is written only to a regular file"
            )
    target = Path(os.path.realpath(path))
    for db in databases:
        if _is_database(target, st, db):
            raise OutputError(
                f"{shown}: is the run database {plain(str(db), limit=200)} (or its log); "
                f"writing the {what} there would destroy its runs (choose another -o)"
            )
    try:
        problem = _another_database(path, target, st)
    except OSError as exc:
        reason = exc.strerror or exc
        raise OutputError(
            f"{shown}: cannot read it to make sure it is not a database ({reason}); "
            f"the {what} is not written over it (choose another -o)"
        ) from None
    if problem is not None:
        raise OutputError(
            f"{shown}: {problem}; the {what} is never written over a database (choose another "
            "-o; to replace a database you no longer need, delete it yourself first)"
        )
    if not target.parent.is_dir():
        where = plain(str(target.parent), limit=200)
        raise OutputError(f"{shown}: cannot write the {what} (directory {where} not found)")
    return target


@contextlib.contextmanager
def _temporary_beside(target: Path) -> Iterator[tuple[IO[str], Path]]:
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fp:
            yield fp, tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_output(
    path: Path, databases: list[Path], what: str, write: Callable[[IO[str]], object]
) -> object:
    """``write(fp)`` into a temporary file beside ``path``, then renamed over it; returns what
    ``write`` returned. Every failure is an ``OutputError`` and leaves ``path`` unchanged."""
    target = check_output(path, databases, what)
    shown = plain(str(path), limit=200)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        with _temporary_beside(target) as (fp, tmp):
            result = write(fp)
            fp.flush()
            os.fsync(fp.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, target)
    except OSError as exc:
        raise OutputError(f"{shown}: cannot write the {what} ({exc.strerror or exc})") from None
    return result
