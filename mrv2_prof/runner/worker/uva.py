"""Pinned host memory the GPU reads in place (UVA), and round-robin pinned staging buffers.

* ``UvaTable`` — a table in pinned host memory (MRV2's ``UvaBuffer``). The CPU writes rows in
  place; Triton kernels dereference it directly through unified virtual addressing (Triton
  resolves a pinned pointer to its device mapping), so prompt tokens are never copied or staged.
  The CPU must not rewrite a row a step still in flight may read: request slots are reused only
  after the steps that used them completed (``RequestStates``).
* ``PinnedRing`` — ``depth`` pinned buffers used in turn. Data written into one is read by the
  GPU (a copy, or a kernel through UVA) while the CPU already fills the next; with ``depth``
  at least the steps in flight plus the one being written, the CPU never overwrites a buffer the
  GPU may still read, and there is no barrier and no allocation per step.
* ``take`` — ``src[idx]`` for a ``src`` that may be a pinned UVA tensor (a small Triton gather),
  for the torch ops that need the values on the device.
"""

from __future__ import annotations

import numpy as np
import torch

from mrv2_prof.runner.worker.staged_write import WriteStats

# Two steps in flight with async scheduling (one running, one queued) + the one being written.
PINNED_RING_DEPTH = 3


def is_uva(t: torch.Tensor, device: torch.device) -> bool:
    """True when ``t`` is pinned host memory that a kernel on ``device`` may read in place."""
    return device.type == "cuda" and t.device.type == "cpu" and t.is_pinned()


class UvaTable:
    """A pinned host table with the ``StagedWriteTensor`` write interface; nothing to apply.

    ``gpu`` is the pinned tensor itself: what the Triton kernels are given. ``np`` is the CPU's
    view for in-place writes."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.gpu = torch.zeros(shape, dtype=dtype, pin_memory=True)
        self.np = self.gpu.numpy()

    def stage_write(self, row: int, start: int, values: list[int] | np.ndarray | int) -> None:
        if isinstance(values, int):
            values = [values]
        self.np[row, start : start + len(values)] = values

    def apply_write(self) -> WriteStats | None:
        return None  # the kernels read the table where it is


class PinnedRing:
    """``depth`` pinned 1-D buffers of ``size`` elements, handed out in turn."""

    def __init__(self, size: int, dtype: torch.dtype, pin: bool, depth: int = PINNED_RING_DEPTH):
        self.buffers = [torch.zeros(size, dtype=dtype, pin_memory=pin) for _ in range(depth)]
        self.views = [b.numpy() for b in self.buffers]
        self._next = 0

    def next(self) -> tuple[torch.Tensor, np.ndarray]:
        """The next buffer (tensor and numpy view of the same memory)."""
        i = self._next
        self._next = (i + 1) % len(self.buffers)
        return self.buffers[i], self.views[i]


def take(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``src[idx]`` on ``idx``'s device; ``src`` may be a pinned table read through UVA (the
    gather kernel, its indices as int32: one compiled variant per table dtype, whatever index
    dtype the caller has, so the warm-up's covers every caller's)."""
    if src.device == idx.device:
        return src[idx.long()]
    from mrv2_prof.runner.worker.uva_triton import gather_triton

    return gather_triton(src, idx if idx.dtype == torch.int32 else idx.int())
