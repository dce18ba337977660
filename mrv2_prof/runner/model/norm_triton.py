"""RMSNorm, and residual add + RMSNorm in one pass: Triton kernels beside their torch references.

References (the model's torch path, and the oracles of the kernels): ``rmsnorm_ref`` is Llama's
RMSNorm as Hugging Face computes it: x in float32, ``x * rsqrt(mean(x^2) + eps)``, cast back to
x's dtype, times the weight (in the promoted dtype). ``fused_add_rmsnorm_ref`` first adds the
residual in the activations' dtype (``x + residual``) and returns the normalised sum and the sum
(vLLM's ``fused_add_rms_norm`` contract: the sum is the new residual stream).

Kernels: one program per row, float32 math, io in the tensors' own dtype (bfloat16, float16 or
float32); any hidden size (the row is masked up to a power of two). They round where the
reference rounds (the sum to the io dtype, the normalised row to the io dtype before the weight),
so they differ from it only by the order of the reduction. With programmatic dependent launch
(``pdl.py``) a program loads the norm weight, waits for the kernel before it, and lets the next
one start before it reads its row. ``fused_add_rmsnorm_triton`` works in
place: the sum overwrites ``residual`` and the normalised row overwrites ``x``, so a decoder
layer allocates nothing for them.
"""

from __future__ import annotations

import torch

from mrv2_prof.runner.model.optional_triton import tl, triton
from mrv2_prof.runner.model.pdl import launch_options, use_pdl


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """[..., H] -> [..., H] in the promoted dtype of ``x`` and ``weight``."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def fused_add_rmsnorm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual), x + residual); new tensors."""
    residual = x + residual
    return rmsnorm_ref(residual, weight, eps), residual


@triton.jit
def _rmsnorm_kernel(
    x_ptr,  # [N, H]: the input rows
    x_stride,
    res_ptr,  # [N, H]: residual rows, updated to x + residual (when HAS_RESIDUAL)
    res_stride,
    out_ptr,  # [N, H]: the normalised rows (may be x_ptr)
    out_stride,
    w_ptr,  # [H]
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_GDC: tl.constexpr = False,  # launched with PDL (pdl.py): the weight first, then wait
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if USE_GDC:  # the rows are the previous kernel's output; the next kernel may start now
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    add_rmsnorm_row(x, res_ptr + row * res_stride, out_ptr + row * out_stride, w, cols, mask,
                    n_cols, eps, HAS_RESIDUAL)  # fmt: skip


@triton.jit
def add_rmsnorm_row(x, res_row, out_row, w, cols, mask, n_cols, eps, HAS_RESIDUAL: tl.constexpr):
    """A row ``x`` (plus the residual row, rounded and stored back as the new residual, where
    ``HAS_RESIDUAL``) normalised and scaled by ``w`` (float32), stored at ``out_row``, rounded
    where the references round; shared with the kernels that end in a norm
    (``gemm_add_norm_triton``), so that they give this kernel's bits."""
    if HAS_RESIDUAL:
        r = tl.load(res_row + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_row.dtype.element_ty)
        tl.store(res_row + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    y = (xf * rstd).to(x.dtype).to(tl.float32)  # the reference's cast back before the weight
    tl.store(out_row + cols, (y * w).to(out_row.dtype.element_ty), mask=mask)


def row_launch_settings(n_cols: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a row of ``n_cols``: the whole row in one block."""
    block = triton.next_power_of_2(n_cols)
    num_warps = 4 if block < 2048 else 8 if block < 8192 else 16 if block < 32768 else 32
    return block, num_warps


def _rows(t: torch.Tensor, name: str, hidden: int) -> torch.Tensor:
    """``t`` as [N, H] rows with a unit column stride, without a copy."""
    if t.shape[-1] != hidden:
        raise ValueError(f"rmsnorm: {name} has {t.shape[-1]} columns, expected {hidden}")
    rows = t if t.dim() == 2 else t.view(-1, hidden)
    if rows.stride(-1) != 1:
        raise ValueError(f"rmsnorm: {name} needs a contiguous last dimension")
    return rows


def _launch(x, residual, out, weight, eps) -> None:
    n_rows, hidden = x.shape
    if n_rows == 0:
        return
    block, num_warps = row_launch_settings(hidden)
    res = residual if residual is not None else x
    _rmsnorm_kernel[(n_rows,)](
        x,
        x.stride(0),
        res,
        res.stride(0),
        out,
        out.stride(0),
        weight,
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=num_warps,
        **launch_options(use_pdl(x.device)),
    )


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rmsnorm_ref`` in one launch; a new tensor."""
    hidden = weight.shape[0]
    rows = _rows(x, "x", hidden)
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    _launch(rows, None, out, weight, eps)
    return out.view(x.shape)


def fused_add_rmsnorm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_add_rmsnorm_ref`` in one launch, in place: returns (x, residual), ``residual``
    now holding x + residual and ``x`` its normalised rows (a new tensor instead when the weight's
    dtype promotes the output)."""
    hidden = weight.shape[0]
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(
            f"fused_add_rmsnorm: x {tuple(x.shape)} {x.dtype} and residual "
            f"{tuple(residual.shape)} {residual.dtype} differ"
        )
    x_rows, res_rows = _rows(x, "x", hidden), _rows(residual, "residual", hidden)
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    out = x_rows
    if out_dtype != x.dtype:
        out = torch.empty(x_rows.shape, dtype=out_dtype, device=x.device)
    _launch(x_rows, res_rows, out, weight, eps)
    return out.view(x.shape), residual
