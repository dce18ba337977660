"""SiLU-and-mul of the gated MLP: the Triton kernel beside its torch reference.

The input is the merged gate/up projection's output [T, 2I] (gate in the first I columns, up in
the last I); the output is ``silu(gate) * up`` [T, I]. ``silu_and_mul_ref`` is the torch
decoder's arithmetic (``F.silu`` rounds to the io dtype, then the product rounds again); the
kernel computes in float32 and rounds where the reference does, one program per row and block of
``BLOCK`` columns. Any I (the last block is masked); the input may have any row stride. With
programmatic dependent launch (``pdl.py``) it waits for the kernel before it first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mrv2_prof.runner.model.optional_triton import tl, triton
from mrv2_prof.runner.model.pdl import launch_options, use_pdl

BLOCK = 1024  # output columns per program


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> [T, I]: silu(x[:, :I]) * x[:, I:]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [T, 2I]
    out_ptr,  # [T, I]
    x_stride,
    out_stride,
    n_cols,  # I
    BLOCK: tl.constexpr,
    USE_GDC: tl.constexpr = False,  # launched with PDL (pdl.py)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    if USE_GDC:  # the gate/up GEMM's output: wait for it; the next kernel may start now
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0)
    out = silu_mul(gate.to(tl.float32), up.to(tl.float32), gate.dtype)
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def silu_mul(gate, up, dtype: tl.constexpr):
    """``silu(gate) * up`` from float32 ``gate`` and ``up``, rounded where ``silu_and_mul_ref``
    rounds in ``dtype`` (silu, then the product); shared by every kernel that makes it (this
    one, and the GEMV's, the decode GEMM's and the fused MLP's prologues), so all give its bits."""
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """``silu_and_mul_ref`` in one launch; a new [T, I] tensor."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(
            f"silu_and_mul: expected [T, 2I] with a contiguous last dimension, got "
            f"{tuple(x.shape)} with strides {x.stride()}"
        )
    num_tokens, n_cols = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, n_cols), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(n_cols, BLOCK))](
        x, out, x.stride(0), out.stride(0), n_cols, BLOCK=BLOCK, **launch_options(use_pdl(x.device))
    )
    return out
