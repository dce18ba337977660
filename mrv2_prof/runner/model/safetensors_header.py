"""A checkpoint's ``*.safetensors`` headers, read and checked without loading a tensor.

A safetensors file is an 8-byte little-endian header length, a JSON header (tensor name ->
dtype, shape, byte offsets) and the data. Reading the headers is enough to find, before a run
starts, a truncated or corrupt file and a checkpoint that lacks a tensor the model needs or
holds one of the wrong shape; the loader then reads the tensors it was promised.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from mrv2_prof.runner.model.args import CheckpointError

MAX_HEADER_BYTES = 100 << 20  # the format's own limit
_ITEM_BYTES = {
    **dict.fromkeys(("F64", "I64", "U64"), 8),
    **dict.fromkeys(("F32", "I32", "U32"), 4),
    **dict.fromkeys(("F16", "BF16", "I16", "U16"), 2),
    **dict.fromkeys(("I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"), 1),
}


def read_header(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of one file; ``CheckpointError`` when the header is not valid or
    a tensor's bytes lie outside the file."""

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{file}: not a valid safetensors file ({problem})")

    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"{size} bytes, shorter than its header")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER_BYTES, size - 8):
                raise bad(f"header of {length:,} bytes in a file of {size:,}")
            raw = f.read(length)
    except OSError as exc:
        raise CheckpointError(f"{file}: cannot read ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    data_bytes = size - 8 - length
    shapes: dict[str, tuple[int, ...]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            ok = all(type(d) is int and d >= 0 for d in shape) and type(start) is type(end) is int
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok or dtype not in _ITEM_BYTES:
            raise bad(f"tensor {name[:80]!r} has a malformed entry")
        if not 0 <= start <= end <= data_bytes:
            raise bad(f"tensor {name[:80]!r} lies past the end of the file (truncated?)")
        if end - start != math.prod(shape) * _ITEM_BYTES[dtype]:
            raise bad(f"tensor {name[:80]!r} has {end - start} bytes for shape {shape}")
        shapes[name] = tuple(shape)
    return shapes


def check_tensors(directory: Path, files: list[Path], expected: dict[str, tuple[int, ...]]) -> None:
    """Every expected tensor present with its shape in the files' headers (the first file
    holding a name wins, as in the loader); extra tensors are allowed."""
    found: dict[str, tuple[tuple[int, ...], Path]] = {}
    for file in files:
        for name, shape in read_header(file).items():
            found.setdefault(name, (shape, file))
    missing = [name for name in expected if name not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{directory}: tensor {missing[0]!r} is missing{more}")
    for name, shape in expected.items():
        got, file = found[name]
        if got != shape:
            raise CheckpointError(
                f"{file}: tensor {name!r} has shape {list(got)}, expected {list(shape)}"
            )
