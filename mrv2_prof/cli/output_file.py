"""Files the command line writes (``report -o``, ``export -o``): checked before anything is
rendered, written beside the target and renamed over it.

A target is refused when it is the run database (or its write-ahead log) under any spelling:
the check compares the file's device and inode, so ``./runs.duckdb``, an absolute path, a
symlink or a hard link to the database are all the same file. Directories, devices, FIFOs and
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

from mrv2_prof.views.safe_text import plain


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


def check_output(path: Path, databases: list[Path], what: str) -> Path:
    """The file to replace (``path`` with symlinks resolved); ``OutputError`` if ``path`` is a
    database of the run, a directory or not a regular file, or its directory does not exist."""
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
