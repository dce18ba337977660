"""Triton SiLU-and-mul against its torch reference (``activation_triton.py``).

Without CUDA the kernel runs on CPU tensors in Triton's interpreter (which truncates float32 ->
bfloat16 where CUDA rounds: bfloat16 is held to two ulps there). The ``gpu`` tests use the
presets' intermediate sizes.
"""

from __future__ import annotations

import pytest
import torch

from mrv2_prof.runner.model.activation_triton import BLOCK, silu_and_mul_ref, silu_and_mul_triton

INTERPRET = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
TOL = {  # (atol, rtol): exp's implementation differs, the roundings are the reference's
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}


def gate_up(num_tokens: int, inter: int, dtype: torch.dtype, seed: int = 0, device=DEVICE):
    gen = torch.Generator(device).manual_seed(seed)
    return (3 * torch.randn(num_tokens, 2 * inter, generator=gen, device=device)).to(dtype)


def assert_matches(x: torch.Tensor) -> None:
    got, want = silu_and_mul_triton(x), silu_and_mul_ref(x)
    assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
    atol, rtol = TOL[x.dtype]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


# (tokens, I): one token; I below one block; I with a masked last block; I of exactly two blocks
SHAPES = [(1, 128), (3, 1000), (2, BLOCK + 476), (2, 2 * BLOCK)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}-I{}".format(*s))
def test_matches_reference(shape, dtype):
    assert_matches(gate_up(*shape, dtype))


def test_strided_rows_empty_batch_and_errors():
    wide = gate_up(4, 300, torch.float32, seed=3)
    rows = wide[:, :200]  # [T, 2I] rows of a wider buffer: gate = cols 0..99, up = 100..199
    assert rows.stride(0) == 600
    assert_matches(rows)
    assert silu_and_mul_triton(gate_up(0, 64, torch.float32)).shape == (0, 64)
    with pytest.raises(ValueError, match=r"\[T, 2I\]"):
        silu_and_mul_triton(torch.zeros(2, 7, device=DEVICE))
    with pytest.raises(ValueError, match=r"\[T, 2I\]"):
        silu_and_mul_triton(torch.zeros(8, 2, device=DEVICE).t())


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("inter", [3072, 4864, 8192, 14336])  # qwen3-0.6b, qwen2, 1B, 8B
@pytest.mark.parametrize("num_tokens", [1, 64, 256])
def test_gpu_preset_sizes_match_reference(num_tokens, inter, dtype):
    assert_matches(gate_up(num_tokens, inter, dtype, seed=inter))
