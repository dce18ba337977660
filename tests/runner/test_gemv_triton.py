"""Triton decode GEMV against its torch reference (``gemv_triton.py``).

Without CUDA the kernel runs on CPU tensors in Triton's interpreter; the ``gpu`` tests use the
presets' projection shapes. The kernel accumulates in float32 in a different order from the
reference's GEMM, so float32 is held to 1e-5 relative and the 16-bit types to two ulps of the
rounded output.
"""

from __future__ import annotations

import pytest
import torch

from mrv2_prof.runner.model import gemv_triton as gemv_triton_module
from mrv2_prof.runner.model import pdl
from mrv2_prof.runner.model.gemv_triton import (
    GEMV_MAX_ROWS,
    RMSNORM,
    SILU_MUL,
    SILU_MUL_WARPS,
    GemvTiles,
    gemv_ref,
    gemv_triton,
    pick_tiles,
)

INTERPRET = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 1.6e-2)}


def operands(m, n, k, dtype, *, bias=False, residual=False, seed=0, device=DEVICE):
    gen = torch.Generator(device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    x, w = randn(m, k), randn(n, k) / k**0.5
    return x, w, randn(n) if bias else None, randn(m, n) if residual else None


def assert_matches(x, w, b=None, r=None, tiles=None):
    want = gemv_ref(x, w, b, None if r is None else r.clone())
    got = gemv_triton(x, w, b, None if r is None else r.clone(), tiles=tiles)
    assert got.shape == want.shape and got.dtype == want.dtype
    atol, rtol = TOL[x.dtype]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


# (M, N, K): one row; M not a power of two; N with a masked last block; K with a masked last
# step; K below one step
SHAPES = [(1, 64, 256), (3, 40, 200), (4, 24, 96), (2, 16, 7)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "M{}-N{}-K{}".format(*s))
def test_matches_reference(shape, dtype):
    assert_matches(*operands(*shape, dtype), tiles=GemvTiles(block_n=8, block_k=64))


@pytest.mark.parametrize("epilogue", ["bias", "residual", "both"])
def test_epilogues(epilogue):
    x, w, b, r = operands(
        3, 40, 130, torch.bfloat16, bias=epilogue != "residual", residual=epilogue != "bias"
    )
    assert_matches(x, w, b, r, tiles=GemvTiles(block_n=16, block_k=32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 3])
def test_rmsnorm_prologue(m, dtype):
    """RMSNorm of each row before the product: K with a masked last step (two loop passes)."""
    x, w, b, r = operands(m, 24, 200, dtype, bias=True, residual=True, seed=7)
    x = 4 * x + 1  # rows whose rms is far from 1
    gen = torch.Generator(DEVICE).manual_seed(13)
    g = torch.rand(200, generator=gen, device=DEVICE).to(dtype) + 0.5
    want = gemv_ref(x, w, b, r.clone(), norm=(g, 1e-5))
    got = gemv_triton(x, w, b, r.clone(), norm=(g, 1e-5), tiles=GemvTiles(block_n=8, block_k=64))
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    unnormed = gemv_ref(x, w, b, r.clone())
    assert not torch.allclose(unnormed, want, atol=atol, rtol=rtol)  # the prologue matters


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 3])
def test_rmsnorm_prologue_in_one_pass(m, dtype):
    """``one_pass``: the row's squares summed in the weight walk and its scale applied at the
    end give the reference's values. Against exact arithmetic (float64 on the same inputs): in
    bfloat16 it is no further off on average than the two-pass prologue, whose normalised row
    is rounded to bfloat16 first; in float32 both are off by float32 roundings only."""
    x, w, b, r = operands(m, 24, 200, dtype, bias=True, residual=True, seed=7)
    x = 4 * x + 1  # rows whose rms is far from 1
    gen = torch.Generator(DEVICE).manual_seed(13)
    g = torch.rand(200, generator=gen, device=DEVICE).to(dtype) + 0.5
    tiles = GemvTiles(block_n=8, block_k=64)  # K = 200: a masked last step
    got = gemv_triton(x, w, b, r.clone(), norm=(g, 1e-5), tiles=tiles, one_pass=True)
    two_pass = gemv_triton(x, w, b, r.clone(), norm=(g, 1e-5), tiles=tiles)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, gemv_ref(x, w, b, r.clone(), norm=(g, 1e-5)), atol=atol,
                               rtol=rtol)  # fmt: skip
    x64, w64, g64 = x.double(), w.double(), g.double()
    normed = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * g64
    exact = r.double() + normed @ w64.T + b.double()
    err = (got.double() - exact).abs().mean()
    if dtype == torch.float32:
        assert err < 1e-6, err
    else:
        assert err <= (two_pass.double() - exact).abs().mean(), err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_silu_mul_prologue(dtype):
    """x is a gate/up row [2K]: silu(gate) * up, K = 150 (a masked last step)."""
    gate_up, w, _, r = operands(2, 40, 300, dtype, residual=True, seed=11)
    w = w[:, :150].contiguous()
    want = gemv_ref(gate_up, w, None, r.clone(), silu_mul=True)
    got = gemv_triton(gate_up, w, None, r.clone(), silu_mul=True, tiles=GemvTiles(8, 64))
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    with pytest.raises(ValueError, match="does not fit"):
        gemv_triton(gate_up[:, :150], w, silu_mul=True)
    with pytest.raises(ValueError, match="one prologue"):
        gemv_triton(gate_up, w, silu_mul=True, norm=(torch.ones(150, device=DEVICE), 1e-5))


@pytest.mark.parametrize("prologue", ["none", "norm", "norm_one_pass", "silu_mul"])
@pytest.mark.parametrize("m", [1, 3])
def test_pipelined_walk_matches_the_reference(m, prologue):
    """``loop_stages`` > 1 (the walk of K software-pipelined) gives the reference's values with
    every prologue and epilogue; K = 200 over 64-wide steps: a masked last step."""
    x, w, b, r = operands(m, 24, 200, torch.float32, bias=True, residual=True, seed=5)
    g = torch.rand(200, device=DEVICE) + 0.5
    tiles = GemvTiles(block_n=8, block_k=64, loop_stages=3)
    if prologue == "silu_mul":
        x = torch.randn(m, 400, device=DEVICE)
        want = gemv_ref(x, w, b, r.clone(), silu_mul=True)
        got = gemv_triton(x, w, b, r.clone(), silu_mul=True, tiles=tiles)
    elif prologue.startswith("norm"):
        want = gemv_ref(x, w, b, r.clone(), norm=(g, 1e-5))
        one = prologue == "norm_one_pass"
        got = gemv_triton(x, w, b, r.clone(), norm=(g, 1e-5), tiles=tiles, one_pass=one)
    else:
        want, got = gemv_ref(x, w, b, r.clone()), gemv_triton(x, w, b, r.clone(), tiles=tiles)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_residual_is_updated_in_place_and_returned():
    x, w, _, r = operands(2, 24, 64, torch.float32, residual=True, seed=5)
    want = r + x @ w.T
    got = gemv_triton(x, w, residual=r, tiles=GemvTiles(block_n=8, block_k=32))
    assert got is r
    torch.testing.assert_close(r, want, atol=1e-5, rtol=1e-5)


def test_strided_rows_and_errors():
    wide = torch.randn(3, 100, device=DEVICE)
    x = wide[:, :64]  # rows of a wider buffer
    w = torch.randn(16, 64, device=DEVICE)
    assert_matches(x, w, tiles=GemvTiles(block_n=8, block_k=32))
    assert gemv_triton(x[:0], w).shape == (0, 16)
    with pytest.raises(ValueError, match="does not fit"):
        gemv_triton(x, torch.randn(16, 63, device=DEVICE))
    with pytest.raises(ValueError, match="GEMV_MAX_ROWS"):
        gemv_triton(torch.randn(GEMV_MAX_ROWS + 1, 64, device=DEVICE), w)
    with pytest.raises(ValueError, match="contiguous"):
        gemv_triton(x, torch.randn(64, 16, device=DEVICE).t())


def test_the_decode_path_gives_the_gemv_up_to_gemv_rows_and_warms_each_variant(monkeypatch):
    """``prefers_gemv`` takes 1 to ``GEMV_ROWS`` rows (1 by default); ``row_classes`` names one
    row count of each launch variant above one row (M's power of two: 2, then 3-4), cut to the
    rows a step can have."""
    from mrv2_prof.runner.model.gemv_triton import prefers_gemv, row_classes

    assert gemv_triton_module.GEMV_ROWS == 1 and row_classes(256) == []
    assert prefers_gemv(1, 2048) and not prefers_gemv(2, 2048) and not prefers_gemv(0, 2048)
    monkeypatch.setattr(gemv_triton_module, "GEMV_ROWS", 4)
    assert [m for m in range(8) if prefers_gemv(m, 2048)] == [1, 2, 3, 4]
    assert not prefers_gemv(2, gemv_triton_module.GEMV_MAX_FEATURES + 1)
    assert row_classes(256) == [2, 4] and row_classes(3) == [2, 3] and row_classes(1) == []
    from mrv2_prof.runner.model import projections_triton as proj

    monkeypatch.setattr(proj, "DECODE_GEMV", "plain")  # the warm-up runs them (not run before)
    assert proj.warm_rows(256) == [2, 4] and proj.warm_rows(256, (1, 4, 8)) == [2]
    monkeypatch.setattr(proj, "DECODE_GEMV", "off")
    assert proj.warm_rows(256) == []
    monkeypatch.setattr(gemv_triton_module, "GEMV_ROWS", 3)
    assert row_classes(256) == [2, 3]
    for rows in ((2,), (3, 4)):  # each class is one tile choice (and one BLOCK_M)
        assert len({pick_tiles(m, 2048, 2048) for m in rows}) == 1


def test_pick_tiles_bounds_the_partial_products():
    for m in range(1, GEMV_MAX_ROWS + 1):
        for n in (64, 2048, 3072, 16384, 128256):
            t = pick_tiles(m, n, 2048)
            block_m = 1 << (m - 1).bit_length()
            assert block_m * t.block_n * t.block_k <= 4096
    # the SiLU-and-mul prologue at M = 1 takes SILU_MUL_WARPS (the sweep's winner), no other
    assert pick_tiles(1, 2048, 8192, SILU_MUL).num_warps == SILU_MUL_WARPS == 8
    assert pick_tiles(1, 2048, 8192, RMSNORM).num_warps == pick_tiles(1, 2048, 8192).num_warps == 4


def test_pick_tiles_pipelines_only_long_walks_at_one_row(monkeypatch):
    """The module's loop stages at M = 1 where K holds ``LOOP_MIN_K`` elements; a shorter walk
    and more rows stay unpipelined."""
    monkeypatch.setattr(gemv_triton_module, "LOOP_STAGES", 3)
    long_k = gemv_triton_module.LOOP_MIN_K
    assert pick_tiles(1, 2048, long_k).loop_stages == 3
    assert pick_tiles(1, 2048, long_k, SILU_MUL).loop_stages == 3
    assert pick_tiles(1, 2048, long_k - 1).loop_stages == 0
    assert pick_tiles(2, 2048, long_k).loop_stages == 0
    monkeypatch.setattr(gemv_triton_module, "LOOP_STAGES", 0)
    assert pick_tiles(1, 2048, long_k).loop_stages == 0
    monkeypatch.setattr(gemv_triton_module, "M1_BLOCK_K", 2048)  # the step of K at M = 1 only
    assert (
        pick_tiles(1, 2048, long_k).block_k == 2048 and pick_tiles(2, 2048, long_k).block_k < 2048
    )


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize(
    "n,k", [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (6144, 4096), (4096, 14336)]
)
def test_gpu_projection_shapes(m, n, k):
    x, w, _, r = operands(m, n, k, torch.bfloat16, residual=True, seed=m)
    assert_matches(x, w)
    assert_matches(x, w, r=r)
    g = torch.rand(k, device=DEVICE).to(torch.bfloat16) + 0.5
    want = gemv_ref(x, w, norm=(g, 1e-6))
    torch.testing.assert_close(gemv_triton(x, w, norm=(g, 1e-6)), want, atol=2e-2, rtol=1.6e-2)
    gate_up = torch.randn(m, 2 * k, device=DEVICE).to(torch.bfloat16)
    want = gemv_ref(gate_up, w, residual=r.clone(), silu_mul=True)
    got = gemv_triton(gate_up, w, residual=r.clone(), silu_mul=True)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=1.6e-2)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("n,k", [(3072, 2048), (16384, 2048), (2048, 8192), (4096, 14336)])
def test_gpu_pipelined_walk_at_projection_shapes(n, k, stages):
    """The software-pipelined walk (compiled, its copies asynchronous) at M = 1, with each
    prologue the decode path launches, against the reference."""
    x, w, _, r = operands(1, n, k, torch.bfloat16, residual=True, seed=stages)
    for tiles in (GemvTiles(4, 1024, 4, loop_stages=stages), GemvTiles(8, 256, 8, 2, stages)):
        assert_matches(x, w, r=r, tiles=tiles)
        g = torch.rand(k, device=DEVICE).to(torch.bfloat16) + 0.5
        want = gemv_ref(x, w, norm=(g, 1e-6))
        got = gemv_triton(x, w, norm=(g, 1e-6), tiles=tiles, one_pass=True)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=1.6e-2)
        gate_up = torch.randn(1, 2 * k, device=DEVICE).to(torch.bfloat16)
        want = gemv_ref(gate_up, w, residual=r.clone(), silu_mul=True)
        got = gemv_triton(gate_up, w, residual=r.clone(), silu_mul=True, tiles=tiles)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=1.6e-2)


def test_pdl_off_the_gpu_is_the_ordinary_launch(monkeypatch):
    """``pdl.LAUNCH_PDL`` gives the values of the ordinary launch: on a device without PDL (the
    interpreter's CPU tensors, a GPU before Hopper) it is the ordinary launch; on Hopper, with
    its input ready, the waits change nothing."""
    monkeypatch.setattr(pdl, "LAUNCH_PDL", True)
    x, w, b, r = operands(1, 24, 200, torch.float32, bias=True, residual=True, seed=3)
    g = torch.rand(200, device=DEVICE) + 0.5
    tiles = GemvTiles(block_n=8, block_k=64)
    got = gemv_triton(x, w, b, r.clone(), norm=(g, 1e-5), tiles=tiles)
    monkeypatch.setattr(pdl, "LAUNCH_PDL", False)
    want = gemv_triton(x, w, b, r.clone(), norm=(g, 1e-5), tiles=tiles)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(
    INTERPRET or torch.cuda.get_device_capability()[0] < 9, reason="needs a Hopper GPU or later"
)
@pytest.mark.parametrize("one_pass,stages", [(False, 0), (True, 0), (True, 3)])
def test_gpu_pdl_gemv_waits_for_the_kernel_that_writes_its_input(monkeypatch, one_pass, stages):
    """A chain that rewrites the GEMV's input just before it, each link launched with PDL: the
    input row is produced by the kernel before (an elementwise op on a large tensor, so it is
    still running when the GEMV may start), eagerly and replayed in a CUDA graph; every output
    equals the chain run without PDL (a GEMV that read its input early would differ)."""
    monkeypatch.setattr(pdl, "LAUNCH_PDL", True)
    monkeypatch.setattr(gemv_triton_module, "LOOP_STAGES", stages)  # the pipelined walk's wait
    k, n = 4096, 6144
    gen = torch.Generator(DEVICE).manual_seed(0)
    big = torch.randn(64 * 2**20, generator=gen, device=DEVICE)  # 256 MiB: a long first kernel
    ws = [torch.randn(n, k, generator=gen, device=DEVICE).bfloat16() / k**0.5 for _ in range(4)]
    g = (torch.rand(k, generator=gen, device=DEVICE) + 0.5).bfloat16()
    x = torch.empty(1, k, device=DEVICE, dtype=torch.bfloat16)
    outs = [torch.empty(1, n, device=DEVICE, dtype=torch.bfloat16) for _ in ws]

    def chain(step: int):
        for i, w in enumerate(ws):
            x.copy_((big[: k * 1024].view(k, 1024)[:, (step + i) % 1024] * 0.5).view(1, k))
            big.mul_(1.0)  # a long kernel between the input's write and the GEMV
            x.copy_(x + (step + i))  # the input's last write, right before the GEMV
            outs[i].copy_(gemv_triton(x, w, norm=(g, 1e-5), one_pass=one_pass))
        return [o.clone() for o in outs]

    got = chain(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(2)
    graph.replay()
    replayed = [o.clone() for o in outs]
    monkeypatch.setattr(pdl, "LAUNCH_PDL", False)
    torch.testing.assert_close(got, chain(1), atol=0, rtol=0)
    torch.testing.assert_close(replayed, chain(2), atol=0, rtol=0)


@pytest.mark.parametrize("mode", ["plain", "fused_onepass"])
def test_a_model_with_the_gemv_at_three_rows_decodes_as_on_cublas(monkeypatch, mode):
    """llama-tiny in float32 with the Triton ops: three prompts prefilled, then four decode steps
    of three rows, with ``GEMV_ROWS`` 4 (each decode step's projections on the GEMV, its
    prologues too) and 1 (cuBLAS and the separate norm / SiLU-and-mul launches): the same greedy
    tokens and logits within float32's reordering of the sums."""
    from test_attention_decode_rope import _decode_logits

    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.runner.model import projections_triton
    from mrv2_prof.runner.model.loader import load_model
    from mrv2_prof.runner.model.model_kernels import triton_model_kernels

    model, args = load_model(ModelSpec(preset="llama-tiny"), DEVICE, torch.float32,
                             kernels=triton_model_kernels())  # fmt: skip
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, args.vocab_size, (n,), generator=gen) for n in (7, 3, 10)]
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", mode)
    want, _ = _decode_logits(model, args, prompts, steps=4)
    rows, kernel = [], projections_triton.gemv_triton

    def gemv(x, *a, **k):
        rows.append(x.shape[0])
        return kernel(x, *a, **k)

    monkeypatch.setattr(projections_triton, "gemv_triton", gemv)
    monkeypatch.setattr(gemv_triton_module, "GEMV_ROWS", 4)
    got, _ = _decode_logits(model, args, prompts, steps=4)
    assert set(rows) == {3}  # the decode steps' projections (the prefill's 20 rows stay off it)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("mode", ["plain", "fused_onepass"])
def test_gpu_engine_with_the_gemv_at_up_to_four_rows_gives_the_torch_tokens(monkeypatch, mode):
    """fp32 llama-tiny, the seeded workload of the fused-model tests (chunked prefill,
    preemption, aborts; decode batches of 1-4 among others) with ``GEMV_ROWS`` 4: the torch
    set's tokens eagerly and under FULL and PIECEWISE graphs."""
    from test_async_scheduling import assert_same_tokens, run_drive

    _, want = run_drive("cuda", "float32", kernels="torch", cudagraph_mode="none")
    monkeypatch.setattr(gemv_triton_module, "GEMV_ROWS", 4)
    for graphs in ("none", "full", "piecewise"):
        _, got = run_drive("cuda", "float32", kernels="triton", cudagraph_mode=graphs,
                           decode_gemv=mode, pdl=True)  # fmt: skip
        assert_same_tokens(got, want)
