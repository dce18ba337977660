"""A GGUF checkpoint's header, read and checked without its tensor data.

GGUF (llama.cpp's format) is a little-endian header, then the tensor data: magic ``GGUF``, a
version, the tensor and metadata counts, the metadata (typed key/value pairs, among them the
architecture's hyperparameters and the tokenizer's vocabulary), one info record per tensor
(name, dims with the row length first, GGML type, offset into the data section), padding to
the file's alignment, the data. ``read_header`` walks the header with the ``gguf`` package's
constants (magic, value and quantization types, block sizes) and checks every count, length and
offset against the file's size, so a truncated or lying file is one ``CheckpointError`` naming
it, whatever the bytes. It reads what the ``gguf`` package's ``GGUFReader`` reads, without what
makes that reader slow (2.5-3.5 s on the SmolLM2 file, against about 10 ms here): an array of
strings (the 49k-token vocabulary and its merges) is walked for its length and never decoded;
the runner does not need it (the tokenizer is read elsewhere). What model the header describes
is ``gguf_model.py``; the tensor data is dequantized by ``gguf_dequant.py``.
"""

from __future__ import annotations

import mmap
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from mrv2_prof.runner.model.args import CheckpointError
from mrv2_prof.runner.model.gguf_dequant import tensor_bytes, type_name

VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 4
_SCALARS = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d", GGUFValueType.BOOL: "?",
}  # fmt: skip
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: int  # GGMLQuantizationType
    shape: tuple[int, ...]  # torch order: (rows, row length); GGUF lists the dims reversed
    offset: int  # of its first byte in the file
    nbytes: int


@dataclass(frozen=True)
class ArrayInfo:
    """An array of strings (or of arrays) in the metadata: its length, its items not decoded."""

    item_type: int
    length: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    metadata: dict[str, Any]  # scalars, strings, tuples of numbers, ArrayInfo
    tensors: dict[str, TensorInfo]


class _Walker:
    """Reads little-endian values off ``buf`` at ``pos``; every read is checked against the end."""

    def __init__(self, buf: mmap.mmap, size: int, bad) -> None:
        self.buf, self.size, self.pos, self.bad = buf, size, 0, bad

    def take(self, fmt: str) -> Any:
        width = struct.calcsize("<" + fmt)
        if self.pos + width > self.size:
            raise self.bad(f"truncated at byte {self.pos:,} of {self.size:,}")
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += width
        return value if len(value) > 1 else value[0]

    def string(self, what: str) -> str:
        length = self.take("Q")
        if self.pos + length > self.size:
            raise self.bad(f"{what} of {length:,} bytes runs past the end (truncated?)")
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.bad(f"{what} is not UTF-8") from None

    def value(self, kind: int, key: str, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == GGUFValueType.STRING:
            return self.string(f"the value of {key!r}")
        if kind != GGUFValueType.ARRAY or depth >= MAX_ARRAY_DEPTH:
            raise self.bad(f"key {key!r} has an unknown value type {kind}")
        item, length = self.take("IQ")
        if item in _SCALARS:
            width = length * struct.calcsize("<" + _SCALARS[item])
            if self.pos + width > self.size:
                raise self.bad(f"array {key!r} of {length:,} items runs past the end")
            values = struct.unpack_from(f"<{length}{_SCALARS[item]}", self.buf, self.pos)
            self.pos += width
            return values
        if item == GGUFValueType.STRING:
            self.skip_strings(length, key)
        else:
            for _ in range(min(length, self.size)):
                self.value(item, key, depth + 1)
            if length > self.size:
                raise self.bad(f"array {key!r} of {length:,} items runs past the end")
        return ArrayInfo(item, length)

    def skip_strings(self, count: int, key: str) -> None:
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        try:
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
        except struct.error:
            pos = size + 1
        if pos > size:
            raise self.bad(f"array {key!r} of {count:,} strings runs past the end (truncated?)")
        self.pos = pos


def read_header(path: str | Path) -> GGUFHeader:
    """The metadata and tensor table of a GGUF file, every offset checked against its size."""
    path = Path(path)

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{path}: not a valid GGUF file ({problem})")

    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        if st.st_size < 24:
            raise bad(f"{st.st_size} bytes, shorter than a GGUF header")
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(path, buf, st.st_size, bad)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: GGUF file does not exist") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except CheckpointError:
        raise
    except (struct.error, ValueError, OverflowError, MemoryError, RecursionError) as exc:
        raise bad(" ".join(str(exc).split())[:200]) from None


def _parse(path: Path, buf: mmap.mmap, size: int, bad) -> GGUFHeader:
    w = _Walker(buf, size, bad)
    magic, version = w.take("II")
    if magic != GGUF_MAGIC:
        raise bad(f"magic {buf[:4]!r}, expected b'GGUF'")
    if version & 0xFFFF == 0:
        raise bad("big-endian GGUF files are not supported")
    if version not in VERSIONS:
        raise bad(f"version {version} is not supported (supported: 2, 3)")
    tensor_count, kv_count = w.take("QQ")
    if kv_count * 13 > size:  # a key of >= 1 byte with its length, a type and a value
        raise bad(f"kv_count {kv_count:,} cannot fit in {size:,} bytes")
    if tensor_count * 32 > size:  # the smallest tensor info record
        raise bad(f"tensor_count {tensor_count:,} cannot fit in {size:,} bytes")
    metadata: dict[str, Any] = {}
    for i in range(kv_count):
        key = w.string(f"key #{i}")
        if key in metadata:
            raise bad(f"key {key!r} appears twice")
        metadata[key] = w.value(w.take("I"), key)
    records = []
    for i in range(tensor_count):
        name = w.string(f"tensor name #{i}")
        n_dims = w.take("I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise bad(f"tensor {name[:80]!r} has {n_dims} dims")
        dims = w.take(f"{n_dims}Q")
        dims = (dims,) if n_dims == 1 else dims
        qtype, offset = w.take("IQ")
        records.append((name, tuple(reversed(dims)), qtype, offset))
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1):
        raise bad(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-w.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, shape, qtype, offset in records:
        shown = repr(name[:80])
        if name in tensors:
            raise bad(f"tensor {shown} appears twice")
        nbytes = tensor_bytes(qtype, shape)
        if nbytes is None or min(shape) < 1:
            raise bad(f"tensor {shown} has shape {list(shape)} in type {type_name(qtype)}")
        if offset % alignment:
            raise bad(f"tensor {shown} has offset {offset:,}, not a multiple of {alignment}")
        if data_start + offset + nbytes > size:
            raise bad(f"tensor {shown} lies past the end of the file (truncated?)")
        tensors[name] = TensorInfo(name, qtype, shape, data_start + offset, nbytes)
    ordered = sorted(tensors.values(), key=lambda t: t.offset)
    for before, after in zip(ordered, ordered[1:], strict=False):
        if after.offset < before.offset + before.nbytes:
            raise bad(f"tensors {before.name[:80]!r} and {after.name[:80]!r} overlap")
    return GGUFHeader(path, metadata, tensors)
