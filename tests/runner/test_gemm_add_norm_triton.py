"""The o projection with the residual add and RMSNorm after it (``gemm_add_norm_triton.py``)
against its torch reference and against the launches it replaces (the decode GEMM with its split
reduction, then ``fused_add_rmsnorm_triton``): the same bits.

Without CUDA the kernels run on CPU tensors in Triton's interpreter at small shapes whose H and K
are not multiples of the tiles; the ``gpu`` test uses qwen3-0.6b's o projection.
"""

from __future__ import annotations

import pytest
import torch
from test_gemv_triton import operands  # the GEMV tests' seeded x, w, bias and residual

from mrv2_prof.runner.model import PRESETS
from mrv2_prof.runner.model.gemm_add_norm_triton import gemm_add_norm_ref, gemm_add_norm_triton
from mrv2_prof.runner.model.gemm_decode_triton import (
    DecodeGemmTiles,
    gemm_decode_partials,
    gemm_decode_triton,
)
from mrv2_prof.runner.model.norm_triton import fused_add_rmsnorm_triton

INTERPRET = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (3e-2, 2e-2)}


def case(m, h, k, dtype, bias, seed):
    attn, w, b, x = operands(m, h, k, dtype, bias=bias, residual=True, seed=seed)
    gen = torch.Generator(DEVICE).manual_seed(seed + 1)
    norm = (1 + 0.3 * torch.randn(h, generator=gen, device=DEVICE)).to(dtype)
    return attn, w, b, 3 * x, norm


def assert_matches(attn, w, b, x, norm, tiles=None):
    """The reference within the dtype's tolerance, and the unfused launches' bits."""
    want_h, want_x = gemm_add_norm_ref(attn, w, b, x, norm, 1e-5)
    two_x = x.clone()
    o = gemm_decode_triton(attn, w, b, tiles=tiles)
    two_h, _ = fused_add_rmsnorm_triton(o, two_x, norm, 1e-5)
    got_x = x.clone()
    got_h = gemm_add_norm_triton(attn, w, b, got_x, norm, 1e-5, tiles=tiles)
    atol, rtol = TOL[attn.dtype]
    torch.testing.assert_close(got_x, want_x, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_h, want_h, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_x, two_x, atol=0, rtol=0)
    torch.testing.assert_close(got_h, two_h, atol=0, rtol=0)
    return got_h, got_x


# H = 40 (a masked row block and a masked last tile of H), K = 72 (a masked last step of K)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_the_reference_and_the_launches_it_replaces(dtype, split_k, bias):
    attn, w, b, x, norm = case(5, 40, 72, dtype, bias, seed=split_k)
    got_h, got_x = assert_matches(attn, w, b, x, norm, DecodeGemmTiles(16, 16, 32, split_k))
    assert not torch.allclose(got_x, x)  # the residual stream did change, in place


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_down_projections_form_has_the_gemm_and_norm_kernels_bits(dtype, split_k):
    """``round_first=False, silu_mul=True`` (the down projection): the residual added to the
    float32 sum and rounded once, then the norm; the reference's values, and the bits of the
    GEMM with its SiLU-and-mul prologue adding into the residual, then ``rmsnorm_triton``."""
    from mrv2_prof.runner.model.norm_triton import rmsnorm_triton

    gate_up, w, _, x, norm = case(5, 40, 144, dtype, False, seed=7 + split_k)
    w = w[:, :72].contiguous()
    tiles = DecodeGemmTiles(16, 16, 32, split_k)
    want_h, want_x = gemm_add_norm_ref(gate_up, w, None, x, norm, 1e-5, silu_mul=True,
                                       round_first=False)  # fmt: skip
    two_x = gemm_decode_triton(gate_up, w, residual=x.clone(), tiles=tiles, silu_mul=True)
    two_h = rmsnorm_triton(two_x, norm, 1e-5)
    got_x = x.clone()
    got_h = gemm_add_norm_triton(gate_up, w, None, got_x, norm, 1e-5, tiles=tiles,
                                 silu_mul=True, round_first=False)  # fmt: skip
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got_x, want_x, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_h, want_h, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_x, two_x, atol=0, rtol=0)
    torch.testing.assert_close(got_h, two_h, atol=0, rtol=0)


def test_partials_are_one_a_split_and_sum_to_the_product():
    """``gemm_decode_partials``: [splits, M, N] float32, the splits of K each its own product
    (hand-checked: split s is x[:, Ks] @ w[:, Ks].T), one where K is not split."""
    attn, w, _, _ = operands(3, 40, 96, torch.float32, seed=5)
    ws = gemm_decode_partials(attn, w, tiles=DecodeGemmTiles(16, 16, 32, 3))
    assert ws.shape == (3, 3, 40) and ws.dtype == torch.float32
    for s in range(3):
        part = attn[:, 32 * s : 32 * (s + 1)] @ w[:, 32 * s : 32 * (s + 1)].T
        torch.testing.assert_close(ws[s], part, atol=1e-5, rtol=1e-5)
    one = gemm_decode_partials(attn, w, tiles=DecodeGemmTiles(16, 16, 32, 1))
    assert one.shape == (1, 3, 40)
    torch.testing.assert_close(one[0], attn @ w.T, atol=1e-5, rtol=1e-5)


def test_bad_shapes_raise_value_error():
    attn, w, b, x, norm = case(3, 40, 72, torch.float32, True, seed=2)
    with pytest.raises(ValueError, match=r"residual \(3, 39\) is not \[3, 40\]"):
        gemm_add_norm_triton(attn, w, b, x[:, :39].contiguous(), norm, 1e-5)
    with pytest.raises(ValueError, match="must be"):
        gemm_add_norm_triton(attn, w, b, x, norm[:39], 1e-5)
    with pytest.raises(ValueError, match="does not fit"):
        gemm_add_norm_triton(attn[:, :71], w, b, x, norm, 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("m", [2, 16, 24, 64])
def test_gpu_qwen3_o_projection(m):
    """qwen3-0.6b's o ([1,024, 2,048]) on its picked tiles in bfloat16: the reference's values
    and the unfused launches' bits."""
    a = PRESETS["qwen3-0.6b"]
    attn, w, _, x, norm = case(m, a.hidden_size, a.num_attention_heads * a.head_dim,
                               torch.bfloat16, False, seed=m)  # fmt: skip
    assert_matches(attn, w, None, x, norm)


def test_the_row_count_is_not_specialised():
    """A decode batch's rows change from step to step: neither kernel of the pair is compiled
    again for a new count (which would be a compile in the middle of a run)."""
    from test_triton_launch import jit_of

    from mrv2_prof.runner.model.gemm_add_norm_triton import _splits_add_rmsnorm_kernel
    from mrv2_prof.runner.model.gemm_decode_triton import _gemm_decode_kernel

    for kernel in (_splits_add_rmsnorm_kernel, _gemm_decode_kernel):
        (m,) = [p for p in jit_of(kernel).params if p.name == "M"]
        assert m.do_not_specialize, kernel


@pytest.mark.parametrize("prologue", [True, False], ids=["prologue", "no-prologue"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_model_with_the_switches_decodes_with_the_same_bits(monkeypatch, dtype, prologue):
    """llama-tiny (two layers) with the Triton ops and every projection of 2+ rows on the
    decode GEMM: three prompts prefilled (20 rows), then four decode steps of three, with
    ``O_ADD_NORM`` and ``DOWN_ADD_NORM`` (and ``DOWN_SILU_MUL``, or not) on and off: the same
    logits, bit for bit; with them on no add + norm launch, a SiLU-and-mul launch a layer only
    without the prologue, and of the input norms only the first layer's (each down projection
    makes the next norm, the last the final)."""
    from test_attention_decode_rope import _decode_logits

    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.runner.model import projections_triton
    from mrv2_prof.runner.model.loader import load_model
    from mrv2_prof.runner.model.model_kernels import triton_model_kernels

    model, args = load_model(ModelSpec(preset="llama-tiny"), DEVICE, dtype,
                             kernels=triton_model_kernels())  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, args.vocab_size, (n,), generator=gen) for n in (7, 3, 10)]
    monkeypatch.setattr(projections_triton, "DECODE_GEMM", "triton")
    monkeypatch.setattr(projections_triton, "GEMM_MAX_FEATURES", None)
    monkeypatch.setattr(projections_triton, "GEMM_ROWS", ((2, 256),))
    monkeypatch.setattr(projections_triton, "O_ADD_NORM", False)  # the baseline: all three off
    want, _ = _decode_logits(model, args, prompts, steps=4)
    launched = []
    for name in ("silu_and_mul_triton", "fused_add_rmsnorm_triton", "rmsnorm_triton"):
        kernel = getattr(projections_triton, name)
        counted = lambda *a, _k=kernel, _n=name: launched.append(_n) or _k(*a)  # noqa: E731
        monkeypatch.setattr(projections_triton, name, counted)
    monkeypatch.setattr(projections_triton, "DOWN_SILU_MUL", prologue)
    monkeypatch.setattr(projections_triton, "O_ADD_NORM", True)
    monkeypatch.setattr(projections_triton, "DOWN_ADD_NORM", True)
    got, _ = _decode_logits(model, args, prompts, steps=4)
    forward = ["rmsnorm_triton"] + ([] if prologue else ["silu_and_mul_triton"] * 2)
    assert args.num_hidden_layers == 2 and launched == forward * 5  # 5 forwards
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("prologue", [True, False], ids=["prologue", "no-prologue"])
def test_gpu_engine_with_the_switches_gives_the_torch_tokens(monkeypatch, prologue):
    """fp32 llama-tiny, the seeded workload of the fused-model tests (chunked prefill,
    preemption, aborts), ``decode_gemm: narrow`` with ``O_ADD_NORM`` and ``DOWN_ADD_NORM`` (and
    ``DOWN_SILU_MUL``, or not) on: the torch set's tokens eagerly and under FULL and PIECEWISE
    graphs."""
    from test_async_scheduling import assert_same_tokens, run_drive

    from mrv2_prof.runner.model import projections_triton

    _, want = run_drive("cuda", "float32", kernels="torch", cudagraph_mode="none")
    monkeypatch.setattr(projections_triton, "DOWN_SILU_MUL", prologue)
    monkeypatch.setattr(projections_triton, "O_ADD_NORM", True)
    monkeypatch.setattr(projections_triton, "DOWN_ADD_NORM", True)
    for mode in ("none", "full", "piecewise"):
        _, got = run_drive("cuda", "float32", kernels="triton", cudagraph_mode=mode,
                           decode_gemm="narrow", pdl=True)  # fmt: skip
        assert_same_tokens(got, want)
