"""The StagedWriteTensor apply as one Triton kernel (MRV2 ``buffer_utils.py``: staged writes).

``apply_packed_writes_triton`` has the contract of ``staged_write.apply_packed_writes_ref`` (the
torch reference and the oracle in tests): scatter ``n`` ragged writes from one packed device
buffer ``rows[n] | starts[n] | lens[n] | offsets[n] | values[total]`` into ``base``. One program
per write, each copying its run of values in ``BLOCK`` chunks, so a write may be empty, a single
element, or a whole row. Writes never overlap (``StagedWriteTensor.stage_write`` refuses that),
so programs need no ordering.
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
