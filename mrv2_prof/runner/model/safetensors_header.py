"""A ``*.safetensors`` file's header, read and checked as strictly as the safetensors loader
checks it, without reading a tensor.

The format (the ``safetensors`` crate's ``SafeTensors::read_metadata`` and
``Metadata::validate``): an 8-byte little-endian header length ``n`` (at most 100,000,000 and
within the file), ``n`` bytes of UTF-8 JSON (an object: an optional ``__metadata__`` map of
strings to strings, and per tensor name its ``dtype``, ``shape`` and ``data_offsets`` ``[begin,
end]``, all unsigned integers), then the data. Sorted by their offsets, the tensors tile the data
exactly: the first begins at 0, each begins where the one before ends, ``end - begin`` is the
bytes of its shape in its dtype, and the last ends at the end of the file. A file that breaks any
of these rules would fail inside the loader, after a run row exists; here it is one
``CheckpointError`` naming the file and the rule. Duplicate JSON keys, which the loader resolves
silently, are refused too. The file is opened only once it is known to be a regular file
(``input_file.open_regular_file``), so a FIFO is never waited on.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrv2_prof.inputs.input_file import InputError, open_regular_file
from mrv2_prof.runner.model.args import CheckpointError

MAX_HEADER_BYTES = 100_000_000  # the crate's MAX_HEADER_SIZE
_U64 = 1 << 64
# Every dtype the loader knows, with its bits per value.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
    "U64": 64,
}  # fmt: skip


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a header: its dtype and shape (its bytes already checked)."""

    dtype: str
    shape: tuple[int, ...]


class _Bad(ValueError):
    """A rule the header breaks (the message says which); ``read_header`` adds the file."""


def _shown(name: str) -> str:
    return repr(name[:80])


def read_header(file: Path) -> dict[str, TensorEntry]:
    """Tensor name -> dtype and shape of one file, every rule of the format checked; a broken
    rule is a ``CheckpointError`` ``<file>: not a valid safetensors file (<rule>)``."""
    try:
        with open_regular_file(file, "safetensors file") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise _Bad(f"{size} bytes, shorter than its header")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                raise _Bad(f"header of {length:,} bytes, over the format's {MAX_HEADER_BYTES:,}")
            if length > size - 8:
                raise _Bad(f"header of {length:,} bytes in a file of {size:,}")
            raw = f.read(length)
            if len(raw) != length:
                raise _Bad("the file changed while it was read")
        return _entries(_parse(raw), size - 8 - length)
    except InputError as exc:
        raise CheckpointError(str(exc)) from None
    except OSError as exc:
        raise CheckpointError(f"{file}: cannot read ({exc.strerror or exc})") from None
    except _Bad as exc:
        raise CheckpointError(f"{file}: not a valid safetensors file ({exc})") from None


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(f"its header is not UTF-8 (byte {exc.start:,})") from None
    try:
        header = json.loads(text, object_pairs_hook=_object, parse_constant=_constant)
    except _Bad:
        raise
    except (ValueError, RecursionError) as exc:
        raise _Bad(f"its header is not JSON: {' '.join(str(exc).split())[:120]}") from None
    if not isinstance(header, dict):
        raise _Bad("its header is not a JSON object")
    return header


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object with no key given twice and only encodable strings."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Bad(f"its header gives key {_shown(key)} twice")
        if not _encodable(key) or (isinstance(value, str) and not _encodable(value)):
            raise _Bad(f"its header holds a lone surrogate escape near {_shown(key)}")
        out[key] = value
    return out


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _constant(name: str) -> Any:
    raise _Bad(f"its header holds {name}, which is not JSON")


def _usize(value: Any) -> bool:
    return type(value) is int and 0 <= value < _U64


def _entries(header: dict[str, Any], data_bytes: int) -> dict[str, TensorEntry]:
    """Every tensor's entry checked, then their offsets against the data."""
    metadata = header.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _Bad(f"__metadata__ is {type(metadata).__name__}, not a map of strings")
        for key, value in metadata.items():
            if not isinstance(value, str):
                raise _Bad(f"__metadata__[{_shown(key)}] is {_json_type(value)}, not a string")
    spans: list[tuple[int, int, int, str]] = []  # begin, end, bytes, name
    entries: dict[str, TensorEntry] = {}
    for name, entry in header.items():
        dtype, shape, nbytes, (begin, end) = _entry(name, entry)
        entries[name] = TensorEntry(dtype, shape)
        spans.append((begin, end, nbytes, name))
    spans.sort(key=lambda span: (span[0], span[1]))
    at = 0
    for begin, end, nbytes, name in spans:
        where = f"tensor {_shown(name)} (data_offsets [{begin:,}, {end:,}])"
        if end < begin:
            raise _Bad(f"{where} ends before it begins")
        if end > data_bytes:
            raise _Bad(f"{where} lies past the end of the file (truncated?)")
        if begin > at:
            raise _Bad(f"{where} leaves a gap of {begin - at:,} bytes before it")
        if begin < at:
            raise _Bad(f"{where} overlaps the tensor before it, which ends at {at:,}")
        if end - begin != nbytes:
            raise _Bad(f"{where} has {end - begin:,} bytes; its shape and dtype need {nbytes:,}")
        at = end
    if at != data_bytes:
        raise _Bad(f"{data_bytes - at:,} bytes after the last tensor's data")
    return entries


def _entry(name: str, entry: Any) -> tuple[str, tuple[int, ...], int, list[int]]:
    """A tensor's dtype, shape, byte count and offsets; ``_Bad`` when malformed."""
    what = f"tensor {_shown(name)}"
    if not isinstance(entry, dict):
        raise _Bad(f"{what} is {_json_type(entry)}, not an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise _Bad(f"{what} has no {key}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise _Bad(f"{what} has unknown dtype {repr(dtype)[:40]}")
    if not isinstance(shape, list) or not all(_usize(d) for d in shape):
        raise _Bad(f"{what} has shape {repr(shape)[:60]}, not a list of integers >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_usize, offsets)):
        raise _Bad(f"{what} has data_offsets {repr(offsets)[:60]}, not two integers >= 0")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise _Bad(f"{what}: {math.prod(shape):,} values of {dtype} do not end on a byte")
    return dtype, tuple(shape), bits // 8, offsets


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else names.get(type(value), "a number")
