"""StagedWriteTensor: device-resident state updated by packed diffs (MRV2 ``buffer_utils.py``).

The base tensor lives on the device. ``stage_write(row, start, values)`` only records the write on
the CPU; ``apply_write()`` packs every staged write into one contiguous host buffer
(``rows | starts | lens | offsets | values``), sends it with one non-blocking copy, and applies it
with one scatter. No full CPU→device copy per step, no sync. The packed buffer is written into
the next of ``STAGING_DEPTH`` pinned buffers used in turn and copied into one reused device
buffer (``_Staging``): no pinned or device allocation per apply. The CPU rewrites a pinned buffer
only ``STAGING_DEPTH`` applies later, when the step that copied from it has completed (at most
two steps are in flight with async scheduling, and each tensor applies once a step); a buffer
grown out is dropped, and torch's pinned allocator keeps it until its copy is done.

``DenseWriteTensor`` is the simpler alternative kept behind ``runner.staged_writes: false``: a
CPU-resident copy updated in place and sent whole on every apply (V1's approach).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mrv2_prof.runner.worker.copy_audit import CopyAudit

_NUMPY_DTYPES = {torch.int32: np.int32, torch.int64: np.int64}
STAGING_DEPTH = 3  # pinned buffers used in turn: the steps in flight + the one being written


class _Staging:
    """``STAGING_DEPTH`` pinned host buffers used in turn and one device buffer, grown on
    demand (CPU device: plain host buffers, read in place)."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.pin = device.type == "cuda"
        self.host: list[torch.Tensor] = []
        self.views: list[np.ndarray] = []
        self.dev: torch.Tensor | None = None
        self._next = 0

    def next(self, size: int) -> tuple[np.ndarray, torch.Tensor, torch.Tensor | None]:
        """(numpy view, host tensor, device buffer) of at least ``size`` elements."""
        if not self.host or self.host[0].numel() < size:
            cap = max(size, 2 * (self.host[0].numel() if self.host else 0), 256)
            self.host = [
                torch.empty(cap, dtype=self.dtype, pin_memory=self.pin)
                for _ in range(STAGING_DEPTH)
            ]
            self.views = [h.numpy() for h in self.host]
            if self.device.type != "cpu":
                self.dev = torch.empty(cap, dtype=self.dtype, device=self.device)
        i = self._next
        self._next = (i + 1) % STAGING_DEPTH
        return self.views[i], self.host[i], self.dev


@dataclass(frozen=True)
class WriteStats:
    """What one ``apply_write`` moved, next to what a dense copy of the tensor would have moved."""

    writes: int
    rows: int
    elements: int
    staged_bytes: int
    dense_bytes: int


# (base [rows, cols], packed buffer, number of writes, total elements) -> None
ApplyFn = Callable[[torch.Tensor, torch.Tensor, int, int], None]


class StagedWriteTensor:
    """A [rows, cols] (or [rows]) integer tensor on ``device``, written by staged ragged diffs."""

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        apply_fn: ApplyFn | None = None,
        copies: CopyAudit | None = None,
    ) -> None:
        if dtype not in _NUMPY_DTYPES:
            raise TypeError(f"StagedWriteTensor holds int32/int64, not {dtype}")
        if len(shape) not in (1, 2):
            raise ValueError(f"StagedWriteTensor is 1-D or 2-D, got shape {shape}")
        self.device = torch.device(device)
        self.gpu = torch.zeros(shape, dtype=dtype, device=self.device)
        self.num_rows = shape[0]
        self.num_cols = shape[1] if len(shape) == 2 else 1
        self._np_dtype = _NUMPY_DTYPES[dtype]
        self._itemsize = self.gpu.element_size()
        self._rows: list[int] = []
        self._starts: list[int] = []
        self._values: list[np.ndarray | list[int]] = []
        self._spans: dict[int, list[tuple[int, int]]] = {}
        self._apply = apply_fn or apply_packed_writes_ref  # the Triton kernel on the fast path
        self._copies = copies if copies is not None else CopyAudit()
        self._staging = _Staging(dtype, self.device)

    @property
    def dense_bytes(self) -> int:
        return self.gpu.numel() * self._itemsize

    def stage_write(self, row: int, start: int, values: Sequence[int] | np.ndarray | int) -> None:
        """Record ``self[row, start:start+len(values)] = values`` for the next ``apply_write``.
        A list of ints (the scheduler's block ids) is kept as it is: the packing converts it."""
        if type(values) is list:
            vals = values
        else:
            vals = np.asarray(values, dtype=self._np_dtype).reshape(-1)
        end = start + len(vals)
        if not 0 <= row < self.num_rows or start < 0 or end > self.num_cols:
            raise IndexError(
                f"write [{row}, {start}:{end}] outside tensor of shape {tuple(self.gpu.shape)}"
            )
        if len(vals) == 0:
            return
        spans = self._spans.setdefault(row, [])
        for s, e in spans:
            if start < e and s < end:
                raise ValueError(
                    f"staged writes overlap in row {row}: [{s}:{e}] and [{start}:{end}]"
                )
        spans.append((start, end))
        self._rows.append(row)
        self._starts.append(start)
        self._values.append(vals)

    def apply_write(self) -> WriteStats | None:
        """Pack, copy once, apply once. Returns what moved, or None when nothing was staged."""
        n = len(self._rows)
        if n == 0:
            return None
        lens = np.fromiter((len(v) for v in self._values), dtype=self._np_dtype, count=n)
        total = int(lens.sum())
        size = 4 * n + total
        view, host, dev = self._staging.next(size)
        packed = view[:size]  # rows | starts | lens | offsets | values, written in place
        packed[:n] = self._rows
        packed[n : 2 * n] = self._starts
        packed[2 * n : 3 * n] = lens
        packed[3 * n] = 0
        np.cumsum(lens[:-1], out=packed[3 * n + 1 : 4 * n])
        np.concatenate(self._values, out=packed[4 * n :])
        stats = WriteStats(
            writes=n,
            rows=len(self._spans),
            elements=total,
            staged_bytes=packed.nbytes,
            dense_bytes=self.dense_bytes,
        )
        self._rows, self._starts, self._values, self._spans = [], [], [], {}
        buf = host[:size]
        if dev is not None:
            self._copies.copy_(dev[:size], buf)
            buf = dev[:size]
        self._apply(self.gpu.view(self.num_rows, self.num_cols), buf, n, total)
        return stats

    def take_singles(self, limit: int) -> tuple[list[int], WriteStats | None] | None:
        """The staged writes taken out for a caller that applies them itself (the full step's
        graph, ``apply_appends``): ``row, column, value`` of each, interleaved, when every write
        is one element and there are at most ``limit``; else None, and they stay staged. The
        stats count the writes as that packed form (three values each and the count)."""
        n = len(self._rows)
        if n == 0:
            return [], None
        if n > limit or any(len(v) != 1 for v in self._values):
            return None
        triples: list[int] = []
        for row, start, vals in zip(self._rows, self._starts, self._values, strict=True):
            triples += (row, start, int(vals[0]))
        stats = WriteStats(n, len(self._spans), n, (1 + 3 * n) * self._itemsize, self.dense_bytes)
        self._rows, self._starts, self._values, self._spans = [], [], [], {}
        return triples, stats

    def warm_up(self) -> None:
        """One empty write (row 0, no values) through the apply, on this tensor itself: the
        kernel variant its steps launch (dtype, row stride) is compiled, nothing is written."""
        view, host, dev = self._staging.next(4)
        view[:4] = 0  # row 0, start 0, length 0, offset 0
        buf = host[:4]
        if dev is not None:
            self._copies.copy_(dev[:4], buf)
            buf = dev[:4]
        self._apply(self.gpu.view(self.num_rows, self.num_cols), buf, 1, 0)


def apply_packed_writes_ref(base: torch.Tensor, buf: torch.Tensor, n: int, total: int) -> None:
    """Torch reference of the apply kernel: scatter ``n`` ragged writes from a packed buffer.

    ``buf`` = rows[n] | starts[n] | lens[n] | offsets[n] | values[total]; ``total`` is known on the
    host, so no output shape depends on device data (no sync).
    """
    rows, starts, lens, offsets = buf[:n], buf[n : 2 * n], buf[2 * n : 3 * n], buf[3 * n : 4 * n]
    values = buf[4 * n : 4 * n + total]
    write_id = torch.repeat_interleave(
        torch.arange(n, device=buf.device), lens.long(), output_size=total
    )
    within = torch.arange(total, device=buf.device) - offsets.long()[write_id]
    flat = rows.long()[write_id] * base.shape[1] + starts.long()[write_id] + within
    base.view(-1).index_copy_(0, flat, values.to(base.dtype))


def apply_appends_ref(base: torch.Tensor, buf: torch.Tensor, cap: int) -> None:
    """Torch reference of the in-graph apply: ``buf`` = n | (row, column, value) x n, with
    n <= ``cap`` read from the buffer (a graph replays with the count of its step); each
    writes ``base[row, column] = value``. The reference reads n on the host (CPU and tests)."""
    n = min(int(buf[0]), cap)
    triples = buf[1 : 1 + 3 * n].view(n, 3).long()
    base[triples[:, 0], triples[:, 1]] = triples[:, 2].to(base.dtype)


class DenseWriteTensor:
    """Same interface, V1 style: writes go to an unpinned CPU copy, sent whole on every apply."""

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        copies: CopyAudit | None = None,
    ) -> None:
        self.device = torch.device(device)
        self._copies = copies if copies is not None else CopyAudit()
        self.cpu = torch.zeros(shape, dtype=dtype)
        self.gpu = torch.zeros(shape, dtype=dtype, device=self.device)
        self._view = self.cpu.view(shape[0], -1).numpy()
        self._writes = 0
        self._rows: set[int] = set()
        self._elements = 0

    @property
    def dense_bytes(self) -> int:
        return self.cpu.numel() * self.cpu.element_size()

    def stage_write(self, row: int, start: int, values: Sequence[int] | np.ndarray | int) -> None:
        vals = np.asarray(values).reshape(-1)
        if (
            not 0 <= row < self._view.shape[0]
            or start < 0
            or start + len(vals) > self._view.shape[1]
        ):
            raise IndexError(
                f"write [{row}, {start}:{start + len(vals)}] outside {self._view.shape}"
            )
        self._view[row, start : start + len(vals)] = vals
        self._writes += 1
        self._rows.add(row)
        self._elements += len(vals)

    def apply_write(self) -> WriteStats:
        """Send the whole tensor, as V1 does every step, whether or not anything changed."""
        stats = WriteStats(
            self._writes, len(self._rows), self._elements, self.dense_bytes, self.dense_bytes
        )
        self._writes, self._rows, self._elements = 0, set(), 0
        if self.device.type == "cpu":
            self.gpu.copy_(self.cpu)
        else:
            self._copies.copy_(self.gpu, self.cpu.pin_memory())
        return stats


def make_write_tensor(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    staged: bool,
    apply_fn: ApplyFn | None = None,
    copies: CopyAudit | None = None,
) -> StagedWriteTensor | DenseWriteTensor:
    if staged:
        return StagedWriteTensor(shape, dtype, device, apply_fn, copies)
    return DenseWriteTensor(shape, dtype, device, copies)
