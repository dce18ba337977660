"""A projection into the residual stream with the RMSNorm after it, at decode batches of 2-64, in
two launches beside its torch reference: the o projection with the post-attention norm, and the
down projection with the next layer's input norm (or the final norm).

On the decode GEMM (``gemm_decode_triton.py``) a layer's o projection is the GEMM, the split
reduction where K is split, then ``fused_add_rmsnorm_triton``: the o rows added into the
residual stream and the sum normalised for gate/up. Here the GEMM writes its float32 partial
sums (``gemm_decode_partials``: one a split of K, one where K is not split) and a single kernel,
one program a row, sums them in split order, adds the bias, rounds where the split reduction
rounds (the o projection's output), adds that into the residual row in place and writes the
normalised row, rounded where the add + norm kernel rounds: the same bits as the launches it
replaces, with one launch a layer fewer (two where K is split). A row is one block, so the
norm's sum of squares needs no second pass.

The down projection (``round_first=False``) adds into the residual stream as its GEMM does: the
residual added to the float32 sum, then rounded once (``addmm_``'s and the split reduction's
arithmetic), and its input may be gate/up with the SiLU-and-mul prologue (``silu_mul``). Its
norm is the next layer's input norm, so that layer's QKV projection takes the normalised rows
as they are (``projections_triton.DOWN_ADD_NORM``), and after the last layer the final norm.

PDL (``pdl.py``): the kernel reads the norm's weight and the bias (the model's) before it waits,
then the partials and the residual row.

``gemm_add_norm_ref`` is the torch arithmetic it replaces (``F.linear``, then
``fused_add_rmsnorm_ref``; for the down projection ``gemm_decode_ref`` with the residual, then
``rmsnorm_ref``), the oracle of the tests. ``projections_triton.O_ADD_NORM`` and
``DOWN_ADD_NORM`` put the decoder's projections on it (the first on, the second off:
``projections_triton`` says why).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mrv2_prof.runner.model.activation_triton import silu_and_mul_ref
from mrv2_prof.runner.model.gemm_decode_triton import (
    DecodeGemmTiles,
    gemm_decode_partials,
    gemm_decode_ref,
)
from mrv2_prof.runner.model.norm_triton import (
    add_rmsnorm_row,
    fused_add_rmsnorm_ref,
    rmsnorm_ref,
    row_launch_settings,
)
from mrv2_prof.runner.model.optional_triton import tl, triton
from mrv2_prof.runner.model.pdl import launch_options, use_pdl


def gemm_add_norm_ref(
    attn: torch.Tensor,  # [M, K]
    o_weight: torch.Tensor,  # [H, K]
    o_bias: torch.Tensor | None,
    x: torch.Tensor,  # [M, H]: the residual stream
    norm_weight: torch.Tensor,  # [H]
    eps: float,
    *,
    silu_mul: bool = False,  # attn is gate/up: silu_and_mul_ref(attn) is the input
    round_first: bool = True,  # o rounded, then added (False: added in float32, rounded once)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + o), x + o), o = ``attn @ o_weight.T (+ o_bias)``; new tensors."""
    if silu_mul:
        attn = silu_and_mul_ref(attn)
    if not round_first:
        new_x = gemm_decode_ref(attn, o_weight, o_bias, x)
        return rmsnorm_ref(new_x, norm_weight, eps), new_x
    return fused_add_rmsnorm_ref(F.linear(attn, o_weight, o_bias), x, norm_weight, eps)


@triton.jit(do_not_specialize=["M"])  # the batch changes from step to step: no recompile
def _splits_add_rmsnorm_kernel(
    ws_ptr,  # [SPLITS, M, H] float32 partial sums of the projection (o or down)
    b_ptr,  # [H] or a dummy
    res_ptr,  # [M, H]: the residual rows, updated to residual + the projection
    res_stride,
    out_ptr,  # [M, H]: the normalised rows
    out_stride,
    w_ptr,  # [H]: the norm's weight
    M,
    n_cols,  # H
    eps,
    SPLITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROUND_FIRST: tl.constexpr,  # the sum rounded, then added (else added in float32, rounded)
    BLOCK: tl.constexpr,
    USE_GDC: tl.constexpr = False,  # launched with PDL (pdl.py): the weights first, then wait
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    bias = tl.zeros([BLOCK], tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    y = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLITS):  # the split reduction's order: the same sums
        y += tl.load(ws_ptr + (s * M + row) * n_cols + cols, mask=mask, other=0.0)
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()
    res_row, out_row = res_ptr + row * res_stride, out_ptr + row * out_stride
    if ROUND_FIRST:  # the o projection's output rounded, then the add + norm kernel's add
        o = (y + bias).to(res_ptr.dtype.element_ty)
        add_rmsnorm_row(o, res_row, out_row, w, cols, mask, n_cols, eps, True)
    else:  # the residual added to the float32 sum and rounded once, as the GEMM's epilogue
        r = tl.load(res_row + cols, mask=mask, other=0.0).to(tl.float32)
        x = (y + bias + r).to(res_ptr.dtype.element_ty)
        tl.store(res_row + cols, x, mask=mask)
        add_rmsnorm_row(x, res_row, out_row, w, cols, mask, n_cols, eps, False)


def gemm_add_norm_triton(
    attn: torch.Tensor,
    o_weight: torch.Tensor,
    o_bias: torch.Tensor | None,
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    *,
    tiles: DecodeGemmTiles | None = None,
    silu_mul: bool = False,
    round_first: bool = True,
) -> torch.Tensor:
    """``gemm_add_norm_ref`` in two launches: ``x`` updated in place, the normalised rows
    returned (a new [M, H] tensor)."""
    m, h = attn.shape[0], o_weight.shape[0]
    if x.dim() != 2 or tuple(x.shape) != (m, h) or x.stride(-1) != 1:
        raise ValueError(f"gemm_add_norm: residual {tuple(x.shape)} is not [{m}, {h}]")
    if tuple(norm_weight.shape) != (h,) or (o_bias is not None and tuple(o_bias.shape) != (h,)):
        raise ValueError(f"gemm_add_norm: the norm's weight and the bias must be [{h}]")
    ws = gemm_decode_partials(attn, o_weight, tiles=tiles, silu_mul=silu_mul)
    out = torch.empty((m, h), dtype=x.dtype, device=x.device)
    block, num_warps = row_launch_settings(h)
    _splits_add_rmsnorm_kernel[(m,)](
        ws,
        o_bias if o_bias is not None else ws,
        x,
        x.stride(0),
        out,
        out.stride(0),
        norm_weight,
        m,
        h,
        eps,
        SPLITS=ws.shape[0],
        HAS_BIAS=o_bias is not None,
        ROUND_FIRST=round_first,
        BLOCK=block,
        num_warps=num_warps,
        **launch_options(use_pdl(x.device)),
    )
    return out
