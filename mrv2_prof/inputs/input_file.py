"""Reading a file the user names (a scenario, a trace, a thresholds file, a checkpoint's JSON)
with limits: a regular file only, at most a given number of bytes, and UTF-8 text.

The type is checked with ``stat`` before the file is opened, so a FIFO, a device or a directory
is refused without blocking on it; the file is then opened non-blocking and checked again (it
may have been replaced in between) and read up to one byte past the limit (``read_bytes``), or
handed back open for reading a part of it (``open_regular_file``: a safetensors header). Every
problem is an ``InputError`` whose ``str()`` is one line naming the file.
"""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path
from typing import BinaryIO

from mrv2_prof.views.safe_text import plain

MiB = 1 << 20

_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


class InputError(ValueError):
    """An input file that cannot be read; ``str()`` is ``<file>: <problem>``."""

    def __init__(self, file: str | Path, problem: str) -> None:
        self.file, self.problem = plain(str(file), limit=300), problem
        super().__init__(f"{self.file}: {problem}")


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_regular_file(path: str | Path, what: str) -> os.stat_result:
    """``path``'s stat when it is an existing regular file, else ``InputError`` (not opened)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(path, f"{what} not found") from None
    except OSError as exc:
        raise InputError(path, f"cannot read the {what} ({exc.strerror or exc})") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise InputError(path, f"is {kind}; the {what} must be a regular file")
    return st


def open_regular_file(path: str | Path, what: str) -> BinaryIO:
    """``path`` opened for binary reading when it is a regular file, else ``InputError``: the
    type is checked with ``stat`` first, then the file is opened non-blocking (a FIFO swapped in
    meanwhile does not block) and checked again on the open descriptor."""
    check_regular_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise InputError(path, f"cannot read the {what} ({exc.strerror or exc})") from None
    try:
        kind = _kind(os.fstat(fd).st_mode)
    except OSError as exc:
        os.close(fd)
        raise InputError(path, f"cannot read the {what} ({exc.strerror or exc})") from None
    if kind is not None:
        os.close(fd)
        raise InputError(path, f"is {kind}; the {what} must be a regular file")
    return os.fdopen(fd, "rb")


def read_bytes(path: str | Path, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them."""
    st = check_regular_file(path, what)
    if st.st_size > max_bytes:
        raise InputError(path, _too_big(what, f"{st.st_size:,} bytes", max_bytes))
    chunks, size = [], 0
    with open_regular_file(path, what) as f:
        try:
            while size <= max_bytes:
                chunk = f.read(min(MiB, max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            raise InputError(path, f"cannot read the {what} ({exc.strerror or exc})") from None
    if size > max_bytes:
        raise InputError(path, _too_big(what, "longer", max_bytes))
    return b"".join(chunks)


def _too_big(what: str, size: str, max_bytes: int) -> str:
    return f"the {what} is {size}, over the limit of {max_bytes:,} bytes"


def decode_utf8(data: bytes, file: str | Path, what: str) -> str:
    """``data`` as UTF-8 text (a UTF-8 byte order mark is dropped); a UTF-16/32 file, a NUL
    byte or an invalid byte is an ``InputError`` giving the line."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise InputError(file, f"the {what} is {name} (byte order mark); save it as UTF-8")
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(
            file, f"line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x}); save it as UTF-8"
        ) from None
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise InputError(file, f"line {line}: a NUL byte; the {what} must be text, not binary")
    return text


def read_text(path: str | Path, what: str, max_bytes: int) -> str:
    """The regular file ``path`` as UTF-8 text, at most ``max_bytes`` bytes."""
    return decode_utf8(read_bytes(path, what, max_bytes), path, what)
