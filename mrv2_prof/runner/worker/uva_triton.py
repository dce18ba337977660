"""Gather through UVA: ``src[idx]`` where ``src`` is pinned host memory and ``idx`` on the GPU.

The torch ops of the sampler's top-k / top-p path need the batch's parameters on the device;
when the parameters live in a pinned round-robin buffer (``runner.uva``), this one small launch
reads just the batch's rows over the bus instead of copying the table. (On the same device,
``uva.take`` is plain indexing.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.worker.triton_launch import Launcher

BLOCK = 128


@triton.jit(do_not_specialize=["n"])
def _gather_kernel(src_ptr, idx_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    rows = tl.load(idx_ptr + offs, mask=mask, other=0).to(tl.int64)
    tl.store(out_ptr + offs, tl.load(src_ptr + rows, mask=mask), mask=mask)


_gather = Launcher(_gather_kernel)


def gather_triton(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``src`` 1-D contiguous (device memory, or pinned host memory read in place)."""
    if src.dim() != 1 or not src.is_contiguous():
        raise ValueError(f"src must be 1-D and contiguous, got shape {tuple(src.shape)}")
    if idx.dim() != 1:
        raise ValueError(f"idx must be 1-D, got shape {tuple(idx.shape)}")
    out = torch.empty(idx.shape[0], dtype=src.dtype, device=idx.device)
    n = idx.shape[0]
    if n:
        _gather((triton.cdiv(n, BLOCK),), src, idx, out, n, BLOCK=BLOCK)
    return out
