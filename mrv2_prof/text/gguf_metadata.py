"""Reading a GGUF file's metadata (its key/value section) without its tensors.

A GGUF starts with ``GGUF``, a version, the tensor and key counts, then every key with its typed
value; the tensor table and the weights follow. ``gguf.GGUFReader`` parses all of it, every
string of the vocabulary as its own numpy view, which takes seconds on a 100 MB file; a tokenizer
needs only the ``tokenizer.*`` keys and ``general.architecture``, so this walks the key section
with ``struct`` over a memory map, decodes the keys asked for and steps over the others. The
value types are GGUF's (``gguf.GGUFValueType``): versions 2 and 3, either byte order.

Every problem (not a GGUF, an old version, a truncated file, a bad type) is a ``TokenizerError``
naming the file and, where it has one, the key."""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mrv2_prof.text.errors import TokenizerError

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9
# GGUFValueType -> struct code of the scalar types
SCALARS = {
    0: "B",  # UINT8
    1: "b",  # INT8
    2: "H",  # UINT16
    3: "h",  # INT16
    4: "I",  # UINT32
    5: "i",  # INT32
    6: "f",  # FLOAT32
    7: "?",  # BOOL
    10: "Q",  # UINT64
    11: "q",  # INT64
    12: "d",  # FLOAT64
}
MAX_KEYS = 1 << 20  # a real file has a few dozen; a larger count is a damaged header


def read_gguf_metadata(path: Path, wanted: Callable[[str], bool]) -> dict[str, Any]:
    """The values of the keys ``wanted`` accepts: scalars as Python values, strings as str,
    arrays as lists."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _Walk(path, data).metadata(wanted)
    except (OSError, ValueError) as exc:
        if isinstance(exc, TokenizerError):
            raise
        raise TokenizerError(f"{path}: cannot read the GGUF file: {exc}") from None


class _Walk:
    """One pass over the key section, ``pos`` moving forward."""

    def __init__(self, path: Path, data: mmap.mmap) -> None:
        self.path = path
        self.data = data
        self.pos = 0
        self.order = "<"
        self.key = ""

    def fail(self, what: str) -> TokenizerError:
        where = f" (key {self.key})" if self.key else ""
        return TokenizerError(f"{self.path}: {what}{where}")

    def metadata(self, wanted: Callable[[str], bool]) -> dict[str, Any]:
        if self.data[:4] != MAGIC:
            raise self.fail("not a GGUF file (no GGUF magic)")
        (version,) = struct.unpack_from("<I", self.data, 4)
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.order = ">"
            (version,) = struct.unpack_from(">I", self.data, 4)
        if version not in (2, 3):
            raise self.fail(f"GGUF version {version} is not supported (2 or 3)")
        self.pos = 8
        _tensors, keys = self.unpack("QQ")
        if keys > MAX_KEYS:
            raise self.fail(f"GGUF header claims {keys} metadata keys")
        out: dict[str, Any] = {}
        for _ in range(keys):
            self.key = ""
            key = self.string()
            self.key = key
            (kind,) = self.unpack("I")
            if wanted(key):
                out[key] = self.value(kind)
            else:
                self.skip(kind)
        return out

    def unpack(self, codes: str) -> tuple:
        fmt = self.order + codes
        try:
            values = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error:
            raise self.fail("the file ends inside its metadata") from None
        self.pos += struct.calcsize(fmt)
        return values

    def string(self) -> str:
        (length,) = self.unpack("Q")
        end = self.pos + length
        if end > len(self.data):
            raise self.fail("the file ends inside its metadata")
        raw = self.data[self.pos : end]
        self.pos = end
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("a string is not UTF-8") from None

    def strings(self, count: int) -> list[str]:
        """An array of ``count`` strings (the vocabulary, the merges: ~10^5 of them), in one
        tight loop."""
        data, pos, size = self.data, self.pos, len(self.data)
        length_at = struct.Struct(self.order + "Q").unpack_from
        raw = []
        for _ in range(count):
            if pos + 8 > size:
                raise self.fail("the file ends inside its metadata")
            (length,) = length_at(data, pos)
            pos += 8 + length
            raw.append(data[pos - length : pos])
        if pos > size:
            raise self.fail("the file ends inside its metadata")
        self.pos = pos
        try:
            return [item.decode("utf-8") for item in raw]
        except UnicodeDecodeError:
            raise self.fail("a string is not UTF-8") from None

    def value(self, kind: int) -> Any:
        if kind in SCALARS:
            return self.unpack(SCALARS[kind])[0]
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.unpack("IQ")
            if item == STRING:
                return self.strings(count)
            if item in SCALARS:
                return list(self.unpack(f"{count}{SCALARS[item]}"))
            if item == ARRAY:
                return [self.value(ARRAY) for _ in range(count)]
        raise self.fail(f"unknown GGUF value type {kind}")

    def skip(self, kind: int) -> None:
        if kind in SCALARS:
            self.pos += struct.calcsize(SCALARS[kind])
        elif kind == STRING:
            (length,) = self.unpack("Q")
            self.pos += length
        elif kind == ARRAY:
            item, count = self.unpack("IQ")
            if item in SCALARS:
                self.pos += count * struct.calcsize(SCALARS[item])
            else:
                for _ in range(count):
                    self.skip(item)
        else:
            raise self.fail(f"unknown GGUF value type {kind}")
        if self.pos > len(self.data):
            raise self.fail("the file ends inside its metadata")
