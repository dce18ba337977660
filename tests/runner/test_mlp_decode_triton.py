"""The batch-1 MLP in one launch against its torch reference (``mlp_decode_triton.py``).

Without CUDA the kernel runs on CPU tensors in Triton's interpreter; the ``gpu`` tests use the
models' MLP shapes, PDL and CUDA-graph replays. The kernel sums in float32 in another order than
the reference's GEMMs (and, with its atomics, in no fixed order), and its norm is the one-pass
form (the normalised row not rounded), so float32 is held to 1e-5 relative and bfloat16 to about
two ulps of the rounded residual.
"""

from __future__ import annotations

import pytest
import torch

from mrv2_prof.runner.model import pdl
from mrv2_prof.runner.model.mlp_decode_triton import (
    TILE_ELEMENTS,
    MlpTiles,
    mlp_decode_ref,
    mlp_decode_triton,
    mlp_workspace,
    pick_mlp_tiles,
)

INTERPRET = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (6e-2, 1.6e-2)}


def operands(hidden, inter, dtype, seed=0, device=DEVICE):
    gen = torch.Generator(device).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, device=device)).to(dtype)

    norm = (1 + 0.3 * torch.randn(hidden, generator=gen, device=device)).to(dtype)
    return (randn(1, hidden, scale=3.0), norm, 1e-5, randn(2 * inter, hidden, scale=hidden**-0.5),
            randn(hidden, inter, scale=inter**-0.5))  # fmt: skip


# (hidden, intermediate, tiles): one step of each walk; several steps with a masked last one in
# both walks and a masked last program; the same with the down weight transposed
CASES = [
    (64, 96, None),
    (72, 40, MlpTiles(16, 32, 32, 4)),
    (200, 100, MlpTiles(32, 64, 128, 4)),
    (200, 100, "transposed"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hidden,inter,tiles", CASES, ids=lambda c: str(c))
def test_matches_the_reference_and_leaves_its_workspace_zero(hidden, inter, tiles, dtype):
    x, *rest = operands(hidden, inter, dtype, seed=hidden)
    want = mlp_decode_ref(x, *rest)
    if tiles == "transposed":  # the down weight as a transposed copy's view: columns contiguous
        rest[-1], tiles = rest[-1].t().contiguous().t(), MlpTiles(16, 64, 64, 4)
        assert rest[-1].stride() == (1, hidden)
    got = x.clone()
    assert mlp_decode_triton(got, *rest, tiles=tiles) is got  # in place
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    sums, counter = mlp_workspace(x.device, hidden)
    assert not sums.any() and counter.item() == 0  # ready for the next launch
    again = x.clone()  # a second launch on the reset workspace gives the same values
    torch.testing.assert_close(mlp_decode_triton(again, *rest, tiles=tiles), got, atol=atol,
                               rtol=rtol)  # fmt: skip


def test_the_reference_is_the_unfused_mlp_by_hand():
    """``mlp_decode_ref`` in float32: x + W_down (silu(gate) * up) of the normed row."""
    x, norm, eps, gu, down = operands(48, 40, torch.float32, seed=7, device=torch.device("cpu"))
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm
    gate, up = (h @ gu.T).chunk(2, dim=-1)
    want = x + (gate * torch.sigmoid(gate) * up) @ down.T
    torch.testing.assert_close(mlp_decode_ref(x, norm, eps, gu, down), want)
    assert not torch.allclose(want, x, atol=1e-2)  # the MLP changes x


def test_pick_tiles_bounds_the_weight_tiles():
    for hidden, inter in ((576, 1536), (1024, 3072), (2048, 8192), (4096, 14336), (64, 96)):
        t = pick_mlp_tiles(hidden, inter)
        assert t.block_i == (16 if inter <= 2048 else 32)
        assert t.block_i * t.block_k <= TILE_ELEMENTS and t.block_h * t.block_i <= TILE_ELEMENTS
        assert t.block_k <= max(hidden, 2 * t.block_k) and t.block_k & (t.block_k - 1) == 0
    assert pick_mlp_tiles(576, 1536).block_k == 1024  # SmolLM2: the row in one step


def test_bad_shapes_are_refused():
    x, norm, eps, gu, down = operands(64, 96, torch.float32, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="one contiguous row"):
        mlp_decode_triton(torch.cat([x, x]), norm, eps, gu, down)
    with pytest.raises(ValueError, match="do not fit"):
        mlp_decode_triton(x, norm, eps, gu[:-2], down)


def test_pdl_off_the_gpu_is_the_ordinary_launch(monkeypatch):
    monkeypatch.setattr(pdl, "LAUNCH_PDL", True)
    x, *rest = operands(72, 40, torch.float32, seed=3)
    got = mlp_decode_triton(x.clone(), *rest, tiles=MlpTiles(16, 32, 32, 4))
    torch.testing.assert_close(got, mlp_decode_ref(x, *rest), atol=1e-4, rtol=1e-5)


SHAPES = [(576, 1536), (1024, 3072), (2048, 8192), (4096, 14336)]  # SmolLM2 ... llama-3-8b


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("hidden,inter", SHAPES, ids=lambda s: str(s))
def test_gpu_model_shapes(hidden, inter):
    for dtype in (torch.float32, torch.bfloat16):
        x, *rest = operands(hidden, inter, dtype, seed=1)
        got = mlp_decode_triton(x.clone(), *rest)
        torch.testing.assert_close(got, mlp_decode_ref(x, *rest), atol=TOL[dtype][0] * 2,
                                   rtol=TOL[dtype][1])  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(
    INTERPRET or torch.cuda.get_device_capability()[0] < 9, reason="needs a Hopper GPU or later"
)
def test_gpu_pdl_chain_in_a_graph_reads_each_input_after_its_write(monkeypatch):
    """Layers of the fused MLP, each input row rewritten by the kernel just before it, launched
    with PDL eagerly and replayed in a CUDA graph (several replays: the workspace must be zero
    again after each launch): every output is the reference's of that layer's input (a kernel
    that read its row early, or found a stale workspace, would be far off)."""
    monkeypatch.setattr(pdl, "LAUNCH_PDL", True)
    hidden, inter = 576, 1536
    big = torch.randn(64 * 2**20, device=DEVICE)  # a long kernel before each input's last write
    layers = [operands(hidden, inter, torch.bfloat16, seed=s)[1:] for s in range(4)]
    x = torch.empty(1, hidden, device=DEVICE, dtype=torch.bfloat16)
    seeds = torch.randn(8, hidden, device=DEVICE).bfloat16()
    ins = [torch.empty_like(x) for _ in layers]
    outs = [torch.empty_like(x) for _ in layers]

    def chain(step: int):
        for i, layer in enumerate(layers):
            big.mul_(1.0)
            x.copy_(seeds[(step + i) % 8] * (1 + step))  # the input's last write
            ins[i].copy_(x)
            outs[i].copy_(mlp_decode_triton(x, *layer))

    def check():
        for i, layer in enumerate(layers):
            want = mlp_decode_ref(ins[i], *layer)
            torch.testing.assert_close(outs[i], want, atol=6e-2, rtol=1.6e-2)

    chain(1)
    check()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(2)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        check()
