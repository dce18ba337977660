"""The decoder layer's projections with their neighbours, on the Triton path.

A decoder layer calls three projection ops of its kernel bundle (``ModelKernels``), each a GEMM
with the elementwise work on either side of it:

* ``norm_linear``: RMSNorm, then a projection (the input norm and QKV).
* ``add_norm_linear``: the output projection added into the residual stream, RMSNorm of the new
  stream, then a projection (o, residual add + post-attention norm, gate/up).
* ``mlp_down``: SiLU-and-mul, then the down projection added into the residual stream.

Their torch references are in ``model_kernels.py``. For a batch of one row where
``prefers_gemv`` says so (host ints: one CUDA-graph key always takes the same path) the
projections take the decode GEMV of ``gemv_triton.py``; otherwise they are cuBLAS GEMMs beside the
fused elementwise kernels (nine launches a layer). Both paths update the residual stream ``x`` in
place and return it.

``DECODE_GEMV`` selects the batch-1 path (the ``runner.decode_gemv`` setting sets it when a
runner is built: ``runner/worker/kernel_paths.py``; ``benchmarks/decode_roofline.py
--variant`` measures one against another):

* ``plain`` (this module's default; the setting's ``auto`` takes it for models wider than 768
  hidden features, ``fused_onepass`` for narrower ones): the GEMV alone, on weights of at most
  ``PLAIN_MAX_FEATURES`` outputs (QKV, o, down with the residual add in its epilogue), beside the
  elementwise kernels; gate/up stays on cuBLAS. Nine launches a layer, no cuBLAS split-K
  reduction.
* ``fused``: every projection is the GEMV with its neighbours as prologue and epilogue (QKV with
  the input norm, o into the residual, gate/up with the post-attention norm, down with
  SiLU-and-mul into the residual): six launches a layer, but measured slower on the H200 (each of
  the N / 4 programs re-reads and re-normalises the whole input row before its weight stream).
* ``fused_onepass``: ``fused`` with the RMSNorm prologue in one pass (``gemv_triton``'s
  ``one_pass``: the row's squares summed in the weight walk, its scale applied at the end), so no
  program reads its input twice. Six launches a layer; on the H200 6 % faster than ``plain`` on
  SmolLM2-135M, even on qwen3-0.6b, 4-10 % slower on llama-1b and llama-3-8b.
* ``hybrid``: ``fused_onepass`` on weights of at most ``PLAIN_MAX_FEATURES`` outputs, ``plain``'s
  cuBLAS GEMM beside the elementwise kernels on wider ones: the input norm folded into QKV and
  SiLU-and-mul into down, the o GEMV, the residual add + norm kernel and cuBLAS for a gate/up
  wider than that (llama-1b, llama-3-8b: seven launches a layer, two fewer than ``plain``, and
  none of them the fused path's slower wide gate/up GEMV); where gate/up is narrow enough it is
  ``fused_onepass`` (six).
* ``off``: cuBLAS for every batch.

``DECODE_GEMM`` selects the path of the other projections of up to ``GEMM_DECODE_MAX_ROWS`` rows
(decode batches of 2-256; ``runner.decode_gemm``): ``cublas`` or ``triton``, the split-K
weight-streaming GEMM of ``gemm_decode_triton.py`` (its residual epilogue for the down
projection). ``GEMM_MAX_FEATURES`` and ``GEMM_ROWS`` keep it to the narrower projections of
the smaller batches: ``runner.decode_gemm: narrow`` (``NARROW_GEMM``), where under PDL it reads
its first weight tiles while the kernel before it runs and cuBLAS fills few SMs with a small
weight (qwen3-0.6b's o and down, 1,024 outputs; ``kernel_paths.py`` has the measurements).
Three switches take launches out of a layer on it (timed on an H100: the prologue loses and is
off; the o projection's add + norm wins 1-3 % and is on; the down projection's is off, not yet
timed without the prologue), all with the bits of the launches they replace: ``DOWN_SILU_MUL``
(the down projection makes ``silu(gate) * up`` as it reads it, no SiLU-and-mul launch),
``O_ADD_NORM`` (the o projection's partials summed, added into the residual stream and
normalised by one kernel, ``gemm_add_norm_triton``, no split reduction or add + norm launch) and
``DOWN_ADD_NORM`` (the down projection the same, its norm the next layer's input norm or the
final norm, which the decoder then skips: ``fuses_down_norm``, ``mlp_down_norm_triton``).

``FUSED_MLP`` (``runner.fused_mlp``, off by default: faster only on narrow models, and its
atomics' order makes the bits vary from run to run; ``kernel_paths.py`` has the measurements)
puts a batch-1 layer's MLP in one launch where the GEMV path
serves the o projection (``add_norm_mlp_triton``): o added into the residual stream by the GEMV,
then ``mlp_decode_triton`` (the post-attention norm, gate/up, SiLU-and-mul and down into the
residual). Whatever ``DECODE_GEMV`` does with QKV, a layer's MLP is then one launch, not two (the
fused modes) or four (``plain``: the add + norm kernel, cuBLAS's gate/up, SiLU-and-mul, down).

A model reads all three at each call, so they must be set before a CUDA graph is captured.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mrv2_prof.runner.model.activation_triton import silu_and_mul_triton
from mrv2_prof.runner.model.gemm_add_norm_triton import gemm_add_norm_triton
from mrv2_prof.runner.model.gemm_decode_triton import (
    GEMM_DECODE_MAX_ROWS,
    ROW_CLASSES,
    gemm_decode_triton,
)
from mrv2_prof.runner.model.gemv_triton import gemv_triton, prefers_gemv
from mrv2_prof.runner.model.gemv_triton import row_classes as gemv_row_classes
from mrv2_prof.runner.model.mlp_decode_triton import mlp_decode_triton
from mrv2_prof.runner.model.norm_triton import fused_add_rmsnorm_triton, rmsnorm_triton

DECODE_GEMV_MODES = ("fused", "fused_onepass", "hybrid", "plain", "off")
FUSED_MODES = ("fused", "fused_onepass", "hybrid")
WIDTH_BOUND_MODES = ("plain", "hybrid")  # cuBLAS above PLAIN_MAX_FEATURES outputs
DECODE_GEMV = "plain"  # runner.decode_gemv sets it (kernel_paths: auto by the model's width)
PLAIN_MAX_FEATURES = 8192  # where the GEMV alone beats cuBLAS (benchmarks/gemv.py)
DECODE_GEMM_MODES = ("cublas", "triton")
DECODE_GEMM = "cublas"  # runner.decode_gemm sets it: triton for its triton and narrow paths
# With DECODE_GEMM triton, the most output features (None: any) and the ranges of rows a
# projection must have to take it; cuBLAS the others (runner.decode_gemm: narrow sets
# NARROW_GEMM's; kernel_paths.py)
EVERY_GEMM = (None, ((2, GEMM_DECODE_MAX_ROWS),))  # (features, row ranges) of triton / cublas
GEMM_MAX_FEATURES: int | None = EVERY_GEMM[0]
GEMM_ROWS: tuple[tuple[int, int], ...] = EVERY_GEMM[1]
# (features, row ranges) of runner.decode_gemm: narrow: 2-64 rows, 17-32 included since they
# take the 64-row (wgmma) tile (benchmarks/RESULTS.md, twenty-third and twenty-fourth rounds).
NARROW_GEMM = (1024, ((2, 64),))
# The down projection on the decode GEMM makes its input silu(gate) * up as it reads it (one
# launch, the same bits as silu_and_mul then the GEMM). Off: on an H100 (qwen3-0.6b, batch
# 2-64) the down GEMM with it took 300-550 us a step against 160-177, the step 7-25 % longer.
DOWN_SILU_MUL = False
# The o projection on the decode GEMM sums its partials, adds them into the residual stream and
# normalises in one kernel after the GEMM (gemm_add_norm_triton: the same bits as the split
# reduction and the add + norm kernel it replaces): 1-3 % shorter steps on an H100 (qwen3-0.6b,
# batch 2-64; RESULTS.md, twenty-fifth round). The add + norm kernel is then launched only past
# the GEMM's rows, which the warm-up runs for it (warm_rows).
O_ADD_NORM = True
# The down projection on the decode GEMM adds into the residual stream and normalises for the
# next layer (or the final norm) in one kernel after the GEMM, and that layer's QKV takes the
# normalised rows (gemm_add_norm_triton, round_first=False: the GEMM's and the norm kernel's
# bits); its input from the SiLU-and-mul launch, or from DOWN_SILU_MUL's prologue. Off: with the
# prologue the step was longer on an H100; without it, not yet timed.
DOWN_ADD_NORM = False
FUSED_MLP = False  # the batch-1 MLP in one launch (mlp_decode_triton): runner.fused_mlp sets it


def _gemv(x: torch.Tensor, weight: torch.Tensor, fused: bool = True) -> bool:
    """Whether this projection of ``x`` takes the GEMV (with its prologue where ``fused``)."""
    if DECODE_GEMV == "off" or (fused and DECODE_GEMV not in FUSED_MODES):
        return False
    if DECODE_GEMV in WIDTH_BOUND_MODES and weight.shape[0] > PLAIN_MAX_FEATURES:
        return False
    return x.dim() == 2 and x.stride(-1) == 1 and prefers_gemv(x.shape[0], weight.shape[0])


def _gemm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a projection of ``x`` takes the Triton decode GEMM: the rows it serves that the
    GEMV does not take (``linear_triton`` tries the GEMV first; the o and down projections'
    switches on the GEMM leave it its rows too, ``GEMV_ROWS`` above 1 included)."""
    return (
        DECODE_GEMM == "triton"
        and not _gemv(x, weight, fused=False)
        and (GEMM_MAX_FEATURES is None or weight.shape[0] <= GEMM_MAX_FEATURES)
        and x.dim() == 2
        and gemm_serves(x.shape[0])
        and x.dtype == weight.dtype
        and x.stride(-1) == 1
    )


def gemm_serves(rows: int) -> bool:
    """Whether a projection of ``rows`` rows is in ``GEMM_ROWS`` (and the GEMM's 2-256)."""
    ok = 1 < rows <= GEMM_DECODE_MAX_ROWS
    return ok and any(lo <= rows <= hi for lo, hi in GEMM_ROWS)


def warm_rows(max_rows: int, warmed: tuple[int, ...] = ()) -> list[int]:
    """Row counts a warm-up must run so that every projection kernel variant a step of up to
    ``max_rows`` tokens can launch is compiled: where the decode path gives the GEMV more than
    one row (``gemv_triton.GEMV_ROWS``), one count of each of its launch variants
    (``gemv_triton.row_classes``); when the decode GEMM is on, the most rows of each of its
    classes (``gemm_decode_triton.ROW_CLASSES``, a launch variant each) that it serves, then the
    fewest rows over one that it does not serve (where a step can have them), whose projections
    launch what the GEMM's replace (with ``O_ADD_NORM``, the o projection's add + norm kernel: no
    warm shape launches it when the GEMM serves 2-256 rows), unless one of the row counts
    ``warmed`` (the warm-up's other shapes) is such a count."""
    gemv = [r for r in gemv_row_classes(max_rows) if r not in warmed and DECODE_GEMV != "off"]
    if DECODE_GEMM != "triton":
        return gemv
    top = min(max_rows, GEMM_DECODE_MAX_ROWS)
    classes = [range(lo, min(hi, top) + 1) for lo, hi in ROW_CLASSES]
    served = [r for r in (max((r for r in rows if gemm_serves(r)), default=0) for rows in classes)
              if r]  # fmt: skip
    if any(1 < r <= max_rows and not gemm_serves(r) for r in warmed):
        return gemv + served
    unserved = next((r for r in range(2, max_rows + 1) if not gemm_serves(r)), None)
    return gemv + served + ([unserved] if unserved else [])


def _one_pass() -> bool:
    return DECODE_GEMV in ("fused_onepass", "hybrid")


def linear_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T + bias`` on the GEMV, the decode GEMM or cuBLAS (the projections here, and
    the QKV projection of rows already normalised: after ``mlp_down_norm_triton``)."""
    if _gemv(x, weight, fused=False):
        return gemv_triton(x, weight, bias)
    if _gemm(x, weight):
        return gemm_decode_triton(x, weight, bias)
    return F.linear(x, weight, bias)


def norm_linear_triton(
    x: torch.Tensor,  # [T, K]
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None,
) -> torch.Tensor:  # [T, N]
    if _gemv(x, weight):
        return gemv_triton(x, weight, bias, norm=(norm_weight, eps), one_pass=_one_pass())
    return linear_triton(rmsnorm_triton(x, norm_weight, eps), weight, bias)


def add_norm_linear_triton(
    x: torch.Tensor,  # [T, H]: the residual stream, updated in place
    attn: torch.Tensor,  # [T, K]
    o_weight: torch.Tensor,  # [H, K]
    o_bias: torch.Tensor | None,
    norm_weight: torch.Tensor,  # [H]
    eps: float,
    weight: torch.Tensor,  # [N, H]
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, N], x)
    if _gemv(attn, o_weight) and _gemv(x, weight):
        gemv_triton(attn, o_weight, o_bias, residual=x)
        return gemv_triton(x, weight, None, norm=(norm_weight, eps), one_pass=_one_pass()), x
    if O_ADD_NORM and _gemm(attn, o_weight):
        h = gemm_add_norm_triton(attn, o_weight, o_bias, x, norm_weight, eps)
        return linear_triton(h, weight), x
    o = linear_triton(attn, o_weight, o_bias)
    h, x = fused_add_rmsnorm_triton(o, x, norm_weight, eps)
    return linear_triton(h, weight, None), x


def mlp_down_triton(
    x: torch.Tensor,  # [T, H]: the residual stream, updated in place
    gate_up: torch.Tensor,  # [T, 2I]
    weight: torch.Tensor,  # [H, I]
) -> torch.Tensor:  # x
    if _gemv(gate_up, weight):
        return gemv_triton(gate_up, weight, residual=x, silu_mul=True)
    if DOWN_SILU_MUL and _gemm(gate_up, weight):
        return gemm_decode_triton(gate_up, weight, residual=x, silu_mul=True)
    h = silu_and_mul_triton(gate_up)
    if _gemv(h, weight, fused=False):
        return gemv_triton(h, weight, residual=x)
    if _gemm(h, weight):
        return gemm_decode_triton(h, weight, residual=x)
    return x.addmm_(h, weight.t())


def fuses_down_norm(x: torch.Tensor, down_weight: torch.Tensor) -> bool:
    """Whether ``mlp_down_norm_triton`` serves the rows ``x`` [T, H] (host ints only):
    ``DOWN_ADD_NORM`` and the decode GEMM taking the down projection (gate/up has x's rows and
    dtype)."""
    return DOWN_ADD_NORM and _gemm(x, down_weight)


def mlp_down_norm_triton(
    x: torch.Tensor,  # [T, H]: the residual stream, updated in place
    gate_up: torch.Tensor,  # [T, 2I]
    weight: torch.Tensor,  # [H, I]
    norm_weight: torch.Tensor,  # [H]: the next norm's (the next layer's input norm, or the final)
    eps: float,
) -> torch.Tensor:  # [T, H]: the next norm of the new residual rows
    """``mlp_down_triton`` into ``x`` and the next norm of the new rows, from the GEMM (with the
    SiLU-and-mul prologue where ``DOWN_SILU_MUL``, else after the SiLU-and-mul launch) and one
    kernel after it (``gemm_add_norm_triton``), where ``fuses_down_norm``."""
    if DOWN_SILU_MUL:
        return gemm_add_norm_triton(gate_up, weight, None, x, norm_weight, eps, silu_mul=True,
                                    round_first=False)  # fmt: skip
    h = silu_and_mul_triton(gate_up)
    return gemm_add_norm_triton(h, weight, None, x, norm_weight, eps, round_first=False)


def fuses_mlp(attn: torch.Tensor, o_weight: torch.Tensor) -> bool:
    """Whether ``add_norm_mlp_triton`` runs the batch's MLP as one launch (host ints only; the
    MLP kernel takes one row)."""
    return FUSED_MLP and attn.shape[0] == 1 and _gemv(attn, o_weight, fused=False)


def add_norm_mlp_triton(
    x: torch.Tensor,  # [T, H]: the residual stream, updated in place
    attn: torch.Tensor,  # [T, K]
    o_weight: torch.Tensor,
    o_bias: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    gate_up_weight: torch.Tensor,  # [2I, H]
    down_weight: torch.Tensor,  # [H, I]
) -> torch.Tensor:  # x
    """The layer after attention: ``add_norm_linear_triton`` then ``mlp_down_triton``, or, where
    ``fuses_mlp``, the o GEMV into ``x`` and the MLP in one launch."""
    if fuses_mlp(attn, o_weight):
        gemv_triton(attn, o_weight, o_bias, residual=x)
        return mlp_decode_triton(x, norm_weight, eps, gate_up_weight, down_weight)
    args = (o_weight, o_bias, norm_weight, eps, gate_up_weight)
    gate_up, x = add_norm_linear_triton(x, attn, *args)
    return mlp_down_triton(x, gate_up, down_weight)
