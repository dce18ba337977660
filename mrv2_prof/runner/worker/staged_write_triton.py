"""The StagedWriteTensor apply as one Triton kernel (MRV2 ``buffer_utils.py``: staged writes).

``apply_packed_writes_triton`` has the contract of ``staged_write.apply_packed_writes_ref`` (the
torch reference and the oracle in tests): scatter ``n`` ragged writes from one packed device
buffer ``rows[n] | starts[n] | lens[n] | offsets[n] | values[total]`` into ``base``. One program
per write, each copying its run of values in ``BLOCK`` chunks, so a write may be empty, a single
element, or a whole row. Writes never overlap (``StagedWriteTensor.stage_write`` refuses that),
so programs need no ordering.

``apply_appends_triton`` (torch reference ``staged_write.apply_appends_ref``) is the full step's
form of single-element writes: ``n | (row, column, value) x n`` in a static buffer, ``n`` read on
the device, so a captured graph applies each replay's own writes (``full_step.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.worker.triton_launch import Launcher

BLOCK = 256  # elements a program copies per loop iteration


# Values that change from step to step are not specialised on: a new value must
# never trigger a compile in the middle of a run.
@triton.jit(do_not_specialize=["n"])
def _apply_packed_writes_kernel(
    base_ptr,  # [rows, cols], unit column stride
    base_row_stride,
    buf_ptr,  # rows[n] | starts[n] | lens[n] | offsets[n] | values[total]
    n,
    BLOCK: tl.constexpr,
):
    w = tl.program_id(0)
    row = tl.load(buf_ptr + w).to(tl.int64)
    start = tl.load(buf_ptr + n + w).to(tl.int64)
    length = tl.load(buf_ptr + 2 * n + w).to(tl.int32)
    offset = tl.load(buf_ptr + 3 * n + w).to(tl.int64)
    src = buf_ptr + 4 * n + offset
    dst = base_ptr + row * base_row_stride + start
    offs = tl.arange(0, BLOCK)
    for j in range(0, length, BLOCK):
        mask = j + offs < length
        values = tl.load(src + j + offs, mask=mask)
        tl.store(dst + j + offs, values.to(base_ptr.dtype.element_ty), mask=mask)


_apply = Launcher(_apply_packed_writes_kernel)


def apply_packed_writes_triton(base: torch.Tensor, buf: torch.Tensor, n: int, total: int) -> None:
    """Apply ``n`` packed ragged writes to ``base`` [rows, cols] in one launch (none when n = 0).

    ``base`` may have any dtype (values are cast as in the reference) and any row stride, but unit
    column stride; ``buf`` is a 1-D contiguous integer tensor on the same device.
    """
    if base.dim() != 2 or (base.shape[1] > 1 and base.stride(1) != 1):
        raise ValueError(f"base must be 2-D with unit column stride, got {tuple(base.stride())}")
    if buf.device != base.device:
        raise ValueError(f"buf is on {buf.device}, base on {base.device}")
    if buf.dim() != 1 or not buf.is_contiguous():
        raise ValueError("buf must be a 1-D contiguous tensor")
    if buf.dtype.is_floating_point or buf.dtype.is_complex or buf.dtype == torch.bool:
        raise TypeError(f"buf must be an integer tensor, got {buf.dtype}")
    if buf.numel() < 4 * n + total:
        raise ValueError(f"buf holds {buf.numel()} elements, {n} writes need {4 * n + total}")
    if n == 0:
        return
    _apply((n,), base, base.stride(0), buf, n, BLOCK=BLOCK)


APPEND_BLOCK = 128  # single-element writes per program


@triton.jit(do_not_specialize=["cap"])
def _apply_appends_kernel(
    base_ptr,  # [rows, cols], unit column stride
    base_row_stride,
    buf_ptr,  # n | (row, col, value) x n, n <= cap
    cap,
    BLOCK: tl.constexpr,
):
    n = tl.minimum(tl.load(buf_ptr), cap)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t = buf_ptr + 1 + 3 * offs
    row = tl.load(t, mask=mask, other=0).to(tl.int64)
    col = tl.load(t + 1, mask=mask, other=0).to(tl.int64)
    value = tl.load(t + 2, mask=mask, other=0)
    tl.store(base_ptr + row * base_row_stride + col, value.to(base_ptr.dtype.element_ty), mask=mask)


_apply_appends = Launcher(_apply_appends_kernel)


def apply_appends_triton(base: torch.Tensor, buf: torch.Tensor, cap: int) -> None:
    """Apply up to ``cap`` single-element writes from ``buf`` = n | (row, col, value) x n, with
    n read on the device (one launch, ``cdiv(cap, APPEND_BLOCK)`` programs; none when cap = 0)."""
    if base.dim() != 2 or (base.shape[1] > 1 and base.stride(1) != 1):
        raise ValueError(f"base must be 2-D with unit column stride, got {tuple(base.stride())}")
    if buf.dim() != 1 or not buf.is_contiguous() or buf.numel() < 1 + 3 * cap:
        raise ValueError(f"buf must be 1-D, contiguous, of at least {1 + 3 * cap} elements")
    if cap > 0:
        _apply_appends((triton.cdiv(cap, APPEND_BLOCK),), base, base.stride(0), buf, cap,
                       BLOCK=APPEND_BLOCK)  # fmt: skip
