"""Triton RMSNorm and residual add + RMSNorm against their torch references (``norm_triton.py``).

Without CUDA the kernels run on CPU tensors in Triton's interpreter (``tests/conftest.py`` sets
``TRITON_INTERPRET``); the interpreter truncates float32 -> bfloat16 where CUDA rounds, so
bfloat16 is held to a two-ulp tolerance there. The ``gpu`` tests use the presets' hidden sizes.
"""

from __future__ import annotations

import pytest
import torch

from mrv2_prof.runner.model.norm_triton import (
    fused_add_rmsnorm_ref,
    fused_add_rmsnorm_triton,
    rmsnorm_ref,
    rmsnorm_triton,
)

INTERPRET = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
EPS = 1e-5
TOL = {  # (atol, rtol): only the reduction order differs (and, interpreted, the bf16 rounding)
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-5, 1.6e-2),
}


def inputs(rows: int, hidden: int, dtype: torch.dtype, seed: int = 0, device=DEVICE):
    gen = torch.Generator(device).manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=device) * scale).to(dtype)

    weight = (1 + randn(hidden, scale=0.2).float()).to(dtype)
    return randn(rows, hidden, scale=3.0), randn(rows, hidden), weight


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    atol, rtol = TOL[expected.dtype]
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


# (rows, hidden): one row, a power of two, sizes that leave a masked tail, one past a warp step
SHAPES = [(1, 64), (5, 100), (3, 257), (2, 2048)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rmsnorm_matches_reference(shape, dtype):
    x, _, weight = inputs(*shape, dtype)
    assert_close(rmsnorm_triton(x, weight, EPS), rmsnorm_ref(x, weight, EPS))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_add_rmsnorm_matches_reference_in_place(shape, dtype):
    x, residual, weight = inputs(*shape, dtype, seed=1)
    want_out, want_residual = fused_add_rmsnorm_ref(x, residual, weight, EPS)
    x_in, residual_in = x.clone(), residual.clone()
    out, new_residual = fused_add_rmsnorm_triton(x_in, residual_in, weight, EPS)
    assert out.data_ptr() == x_in.data_ptr() and new_residual.data_ptr() == residual_in.data_ptr()
    atol, rtol = TOL[dtype]
    if INTERPRET and dtype == torch.bfloat16:  # the sum's rounding, then the norm's
        atol = 2 * rtol
    torch.testing.assert_close(new_residual, want_residual, atol=atol, rtol=rtol)
    torch.testing.assert_close(out, want_out, atol=atol, rtol=rtol)


def test_leading_dims_strided_rows_and_a_promoting_weight():
    """[B, S, H] input, rows of a wider buffer, and a float32 weight on bf16 activations (the
    reference's dtype promotion: a float32 result)."""
    x, _, weight = inputs(6, 96, torch.float32, seed=2)
    assert_close(
        rmsnorm_triton(x.view(2, 3, 96), weight, EPS), rmsnorm_ref(x, weight, EPS).view(2, 3, 96)
    )
    wide = torch.randn(4, 160, device=DEVICE)
    rows = wide[:, :96]
    assert rows.stride(0) == 160
    assert_close(rmsnorm_triton(rows, weight, EPS), rmsnorm_ref(rows, weight, EPS))
    x16 = x.to(torch.bfloat16)
    out = rmsnorm_triton(x16, weight, EPS)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, rmsnorm_ref(x16, weight, EPS), atol=1e-5, rtol=1.6e-2)


def test_empty_batch_and_layout_errors():
    x, residual, weight = inputs(0, 64, torch.float32)
    assert rmsnorm_triton(x, weight, EPS).shape == (0, 64)
    assert fused_add_rmsnorm_triton(x, residual, weight, EPS)[0].shape == (0, 64)
    x, residual, weight = inputs(2, 64, torch.float32)
    with pytest.raises(ValueError, match="65 columns, expected 64"):
        rmsnorm_triton(torch.zeros(2, 65, device=DEVICE), weight, EPS)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        rmsnorm_triton(torch.zeros(64, 2, device=DEVICE).t(), weight, EPS)
    with pytest.raises(ValueError, match="differ"):
        fused_add_rmsnorm_triton(x, residual.double(), weight, EPS)


# --------------------------------------------------------------------------------------------
# GPU: hidden sizes of the presets (qwen2-0.5b 896, qwen3-0.6b 1024, llama-1b 2048, 8B 4096)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("hidden", [896, 1024, 2048, 4096])
@pytest.mark.parametrize("rows", [1, 64, 256])
def test_gpu_preset_sizes_match_reference(rows, hidden, dtype):
    x, residual, weight = inputs(rows, hidden, dtype, seed=rows + hidden)
    assert_close(rmsnorm_triton(x, weight, EPS), rmsnorm_ref(x, weight, EPS))
    want_out, want_residual = fused_add_rmsnorm_ref(x, residual, weight, EPS)
    out, new_residual = fused_add_rmsnorm_triton(x.clone(), residual.clone(), weight, EPS)
    assert torch.equal(new_residual, want_residual)  # one rounding of the same float32 sum
    assert_close(out, want_out)
