"""Triton decode GEMM (split-K) against its torch reference (``gemm_decode_triton.py``).

Without CUDA the kernels run on CPU tensors in Triton's interpreter (``tests/conftest.py``) at
small shapes whose N and K are not multiples of the tiles; the ``gpu`` test uses llama-1b's
projections at M = 64. The kernel accumulates in float32 in a different order from the
reference's GEMM and rounds the residual sum once, so float32 is held to 1e-5 relative and
bfloat16 to two of its roundings. ``pdl.py``'s rules are checked on the sm_90 code of both
kernels with the other kernels' (``tests/runner/test_pdl_order.py``).
"""

from __future__ import annotations

import pytest
import torch
from test_gemv_triton import operands  # the GEMV tests' seeded x, w, bias and residual

from mrv2_prof.runner.model import PRESETS, pdl
from mrv2_prof.runner.model.gemm_decode_triton import (
    ROW_CLASSES,
    DecodeGemmTiles,
    effective_split,
    gemm_decode_ref,
    gemm_decode_triton,
    pick_gemm_tiles,
)

INTERPRET = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (2e-2, 1.6e-2)}


def assert_matches(x, w, b=None, r=None, tiles=None):
    want = gemm_decode_ref(x, w, b, None if r is None else r.clone())
    res = None if r is None else r.clone()
    got = gemm_decode_triton(x, w, b, res, tiles=tiles)
    assert got.shape == want.shape and got.dtype == want.dtype
    if r is not None:
        assert got is res  # updated in place and returned
    atol, rtol = TOL[x.dtype]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    return got


def tiles(split_k: int) -> DecodeGemmTiles:
    return DecodeGemmTiles(block_m=16, block_n=16, block_k=32, split_k=split_k)


# N = 40, K = 72: a masked last tile of N and a masked last step of K (split 3: one step each)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("m", [2, 3, 8, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_reference(dtype, m, split_k):
    x, w, _, _ = operands(m, 40, 72, dtype, seed=m)
    assert_matches(x, w, tiles=tiles(split_k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_one_step_longer_than_k(dtype):
    """K = 72 in one 128-wide step: the first step (read before the PDL wait, peeled off the
    loop) masked past K, and no loop step after it."""
    x, w, b, r = operands(5, 40, 72, dtype, bias=True, residual=True, seed=7)
    assert_matches(x, w, b, r, tiles=DecodeGemmTiles(16, 16, 128))


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("epilogue", ["bias", "residual", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_epilogues(dtype, epilogue, split_k):
    x, w, b, r = operands(
        17, 40, 72, dtype, bias=epilogue != "residual", residual=epilogue != "bias", seed=3
    )
    got = assert_matches(x, w, b, r, tiles=tiles(split_k))
    if r is not None:  # the residual was added: the product alone is far from it
        assert not torch.allclose(got, gemm_decode_ref(x, w, b), atol=0.1)


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_silu_mul_prologue_gives_the_two_launch_bits(monkeypatch, dtype, split_k):
    """``silu_mul``: x is a gate/up [M, 2K] (K = 72: a masked last step); the GEMM equals the
    reference on ``silu_and_mul_ref(x)`` and has the bits of ``silu_and_mul_triton`` then the
    GEMM (the same roundings, the same dot inputs), the residual added in place."""
    from mrv2_prof.runner.model.activation_triton import silu_and_mul_triton

    gate_up, w, _, r = operands(17, 40, 144, dtype, residual=True, seed=13)
    w = w[:, :72].contiguous()
    want = gemm_decode_ref(gate_up, w, None, r.clone(), silu_mul=True)
    got = gemm_decode_triton(gate_up, w, residual=r.clone(), tiles=tiles(split_k), silu_mul=True)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    two = gemm_decode_triton(silu_and_mul_triton(gate_up), w, residual=r.clone(),
                             tiles=tiles(split_k))  # fmt: skip
    torch.testing.assert_close(got, two, atol=0, rtol=0)
    with pytest.raises(ValueError, match="does not fit"):  # gate/up must be twice K wide
        gemm_decode_triton(gate_up[:, :72].contiguous(), w, silu_mul=True)


def test_residual_sum_in_float32_against_exact_arithmetic():
    """Split partials summed in float32, the bias and the residual added, rounded once: within
    float32 roundings of float64 arithmetic on the same inputs."""
    x, w, b, r = operands(3, 40, 200, torch.float32, bias=True, residual=True, seed=9)
    exact = r.double() + x.double() @ w.double().T + b.double()
    got = gemm_decode_triton(x, w, b, r.clone(), tiles=DecodeGemmTiles(16, 16, 32, split_k=4))
    assert (got.double() - exact).abs().max() < 1e-5


def test_effective_split_leaves_no_split_empty():
    assert effective_split(72, 32, 3) == (3, 32)
    assert effective_split(72, 32, 8) == (3, 32)  # only three steps of 32 in K = 72
    assert effective_split(2048, 64, 9) == (8, 256)  # 9 splits of 228 -> 4 steps each
    assert effective_split(2048, 64, 1) == (1, 2048)
    x, w, _, r = operands(2, 40, 72, torch.float32, residual=True, seed=4)
    assert_matches(x, w, r=r, tiles=tiles(8))


def test_pick_gemm_tiles_uses_host_ints_only(monkeypatch):
    """The same ints give the same tiles without asking the device anything, and llama-1b's
    [2048, 2048] projection at M = 64 gets at least one program per H200 SM."""

    def no_device(*_a, **_k):
        raise AssertionError("pick_gemm_tiles asked the device")

    for name in ("is_available", "get_device_properties", "current_device", "device_count"):
        monkeypatch.setattr(torch.cuda, name, no_device)
    t = pick_gemm_tiles(64, 2048, 2048)
    assert t == pick_gemm_tiles(64, 2048, 2048) and hash(t) == hash(pick_gemm_tiles(64, 2048, 2048))
    with pytest.raises(AttributeError):
        t.split_k = 1  # frozen: a graph key's launch cannot be changed under it

    def programs(t, m, n):
        return -(-n // t.block_n) * -(-m // t.block_m) * t.split_k

    assert programs(pick_gemm_tiles(16, 2048, 2048), 16, 2048) >= 132  # 4+ programs an SM
    for n, k in ((1024, 3072), (1024, 2048), (2048, 2048), (576, 1536)):
        # 33-64 rows (one program an SM): one wave, the split the largest that fits it
        t = pick_gemm_tiles(64, n, k)
        most = min(132 // (n // t.block_n), k // t.block_k // 2)  # two K steps a split at least
        assert t.split_k == most and programs(t, 64, n) <= 132
    assert pick_gemm_tiles(64, 1024, 3072).split_k == 4  # qwen3-0.6b's down: 128 programs
    for m in (1, 2, 8, 17, 64, 100, 256):
        for n, k in ((2048, 2048), (3072, 2048), (2048, 8192), (28672, 4096)):
            t = pick_gemm_tiles(m, n, k)
            assert 16 <= t.block_m <= 128 and t.block_m & (t.block_m - 1) == 0
            assert t.block_m >= min(m, 128)
            assert effective_split(k, t.block_k, t.split_k)[0] == t.split_k  # no empty split
    assert pick_gemm_tiles(256, 28672, 4096).split_k == 1  # 448+ tiles: no split needed
    # SmolLM2-135M's o ([576, 576]) at 16 rows: 18 tiles want 8 splits, but its 5 steps of K
    # give 2 of at least 2 steps; at least 5 steps a split (MIN_STEPS_PER_SPLIT): no split
    from mrv2_prof.runner.model import gemm_decode_triton as module

    assert pick_gemm_tiles(16, 576, 576).split_k == 2
    monkeypatch.setattr(module, "MIN_STEPS_PER_SPLIT", 5)
    assert pick_gemm_tiles(16, 576, 576).split_k == 1
    assert pick_gemm_tiles(16, 576, 1536).split_k == 2  # down: 12 steps, two splits of 6


def test_bad_shapes_raise_value_error():
    x, w, b, r = operands(3, 40, 72, torch.float32, bias=True, residual=True)
    with pytest.raises(ValueError, match="does not fit"):
        gemm_decode_triton(x, w[:, :64])
    with pytest.raises(ValueError, match="does not fit"):
        gemm_decode_triton(x[0], w)
    with pytest.raises(ValueError, match=r"0 rows, not in 1\.\.256"):
        gemm_decode_triton(x[:0], w)
    with pytest.raises(ValueError, match=r"257 rows"):
        gemm_decode_triton(torch.zeros(257, 72, device=DEVICE), w)
    with pytest.raises(ValueError, match="contiguous"):
        gemm_decode_triton(x, torch.zeros(72, 40, device=DEVICE).t())
    with pytest.raises(ValueError, match="bfloat16"):
        gemm_decode_triton(x, w.bfloat16())
    with pytest.raises(ValueError, match=r"bias \(39,\)"):
        gemm_decode_triton(x, w, b[:39])
    with pytest.raises(ValueError, match=r"residual \(3, 39\)"):
        gemm_decode_triton(x, w, residual=r[:, :39])
    with pytest.raises(ValueError, match="block_m=8"):
        gemm_decode_triton(x, w, tiles=DecodeGemmTiles(8, 16, 32))


@pytest.mark.parametrize("epilogue", ["none", "bias", "residual", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_last_split_of_a_tile_reduces_it_in_one_launch(monkeypatch, dtype, epilogue):
    """``LAST_SPLIT_REDUCES``: a split GEMM is one launch (the reduction kernel never runs), it
    equals the reference and has the two-launch form's bits (both add the splits in order, then
    the bias, then the residual), and it leaves its tile counters at zero, so a second launch
    over the same counters gives the same bits again."""
    from mrv2_prof.runner.model import gemm_decode_triton as module

    x, w, b, r = operands(17, 40, 72, dtype, bias=epilogue in ("bias", "both"),
                          residual=epilogue in ("residual", "both"), seed=11)  # fmt: skip
    two = gemm_decode_triton(x, w, b, None if r is None else r.clone(), tiles=tiles(3))

    class Refused:
        def __getitem__(self, grid):
            raise AssertionError("the split reduction kernel was launched")

    monkeypatch.setattr(module, "LAST_SPLIT_REDUCES", True)
    monkeypatch.setattr(module, "_gemm_decode_splitk_reduce_kernel", Refused())
    one = assert_matches(x, w, b, r, tiles=tiles(3))
    torch.testing.assert_close(one, two, atol=0, rtol=0)
    (counters,) = module.COUNTERS.buffers(DEVICE)
    assert counters.numel() >= 3 * 2 and not counters.any()  # 3 x 2 tiles of 16, all reset
    again = gemm_decode_triton(x, w, b, None if r is None else r.clone(), tiles=tiles(3))
    torch.testing.assert_close(again, two, atol=0, rtol=0)


def test_pdl_off_the_gpu_is_the_ordinary_launch(monkeypatch):
    """``pdl.LAUNCH_PDL`` on: CPU tensors (the interpreter) launch as ever, same values."""
    x, w, b, r = operands(3, 40, 72, torch.float32, bias=True, residual=True, seed=6)
    want = gemm_decode_triton(x, w, b, r.clone(), tiles=tiles(3))
    monkeypatch.setattr(pdl, "LAUNCH_PDL", True)
    got = gemm_decode_triton(x, w, b, r.clone(), tiles=tiles(3))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("proj", ["qkv", "o", "gate_up", "down"])
def test_gpu_llama_1b_projections_at_batch_64(proj, monkeypatch):
    a = PRESETS["llama-1b"]
    q_out = a.num_attention_heads * a.head_dim
    n, k = {
        "qkv": (q_out + 2 * a.num_key_value_heads * a.head_dim, a.hidden_size),
        "o": (a.hidden_size, q_out),
        "gate_up": (2 * a.intermediate_size, a.hidden_size),
        "down": (a.hidden_size, a.intermediate_size),
    }[proj]
    x, w, _, r = operands(64, n, k, torch.bfloat16, residual=True, seed=1)
    first = assert_matches(x, w)
    torch.testing.assert_close(gemm_decode_triton(x, w), first, atol=0, rtol=0)  # deterministic
    assert_matches(x, w, r=r)
    for split_k in (1, 4):
        assert_matches(x, w, r=r, tiles=DecodeGemmTiles(64, 64, 64, split_k))
    from mrv2_prof.runner.model import gemm_decode_triton as module

    two = gemm_decode_triton(x, w, residual=r.clone(), tiles=DecodeGemmTiles(64, 64, 64, 4))
    monkeypatch.setattr(module, "LAST_SPLIT_REDUCES", True)  # one launch at real sizes
    one = assert_matches(x, w, r=r, tiles=DecodeGemmTiles(64, 64, 64, 4))
    torch.testing.assert_close(one, two, atol=0, rtol=0)  # the same bits


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("m", [17, 24, 32, 48])
def test_gpu_narrow_projections_on_the_64_row_tile(m):
    """qwen3-0.6b's o and down (1,024 outputs, the ``narrow`` path's) at 17-48 rows: the picked
    tile is the 64-row one, its rows past M masked, and it gives the reference's result, with
    the down projection's residual epilogue."""
    a = PRESETS["qwen3-0.6b"]
    q_out = a.num_attention_heads * a.head_dim
    for n, k in ((a.hidden_size, q_out), (a.hidden_size, a.intermediate_size)):
        assert pick_gemm_tiles(m, n, k).block_m == 64
        x, w, _, r = operands(m, n, k, torch.bfloat16, residual=True, seed=m)
        assert_matches(x, w)
        assert_matches(x, w, r=r)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("m", [2, 24, 64])
def test_gpu_silu_mul_prologue_at_qwen3_down(m):
    """qwen3-0.6b's down ([1,024, 3,072]) on its picked tiles with the SiLU-and-mul prologue:
    the reference's result, and the two-launch form's bits."""
    from mrv2_prof.runner.model.activation_triton import silu_and_mul_triton

    a = PRESETS["qwen3-0.6b"]
    gate_up, w, _, r = operands(m, a.hidden_size, 2 * a.intermediate_size, torch.bfloat16,
                                residual=True, seed=m)  # fmt: skip
    w = w[:, : a.intermediate_size].contiguous()
    want = gemm_decode_ref(gate_up, w, None, r.clone(), silu_mul=True)
    got = gemm_decode_triton(gate_up, w, residual=r.clone(), silu_mul=True)
    torch.testing.assert_close(got, want, atol=TOL[torch.bfloat16][0], rtol=TOL[torch.bfloat16][1])
    two = gemm_decode_triton(silu_and_mul_triton(gate_up), w, residual=r.clone())
    torch.testing.assert_close(got, two, atol=0, rtol=0)


@pytest.mark.parametrize(("max_features", "max_rows"), [(None, 256), (64, 256), (64, 16)])
def test_a_model_on_the_decode_gemm_gives_the_cublas_path_logits(
    monkeypatch, max_features, max_rows
):
    """llama-tiny in float32 with the Triton ops: three prompts prefilled, then four decode
    steps of three rows, with ``DECODE_GEMM`` triton against cublas (``F.linear``/``addmm_``):
    the same logits, and the decode GEMM did serve the projections of more than one row: all
    four of a layer, or with ``GEMM_MAX_FEATURES`` 64 (llama-tiny's hidden size) the two of 64
    outputs, o and down (QKV has 128, gate/up 256); with ``GEMM_ROWS`` 2-16 not the prefill's
    20 rows."""
    from test_attention_decode_rope import _decode_logits

    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.runner.model import gemm_decode_triton as module
    from mrv2_prof.runner.model import projections_triton
    from mrv2_prof.runner.model.loader import load_model
    from mrv2_prof.runner.model.model_kernels import triton_model_kernels

    device = torch.device("cuda" if not INTERPRET else "cpu")
    model, args = load_model(ModelSpec(preset="llama-tiny"), device, torch.float32,
                             kernels=triton_model_kernels())  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, args.vocab_size, (n,), generator=gen) for n in (7, 3, 10)]
    want, _ = _decode_logits(model, args, prompts, steps=4)
    rows = []
    kernel = module._gemm_decode_kernel

    class Counted:  # the GEMM's launches, with the rows each served
        def __getitem__(self, grid):
            def launch(*a, **k):
                rows.append(a[6])  # M (after x, w, bias, out, ws, counters)
                return kernel[grid](*a, **k)

            return launch

    monkeypatch.setattr(projections_triton, "DECODE_GEMM", "triton")
    monkeypatch.setattr(projections_triton, "GEMM_MAX_FEATURES", max_features)
    monkeypatch.setattr(projections_triton, "GEMM_ROWS", ((2, max_rows),))
    monkeypatch.setattr(module, "_gemm_decode_kernel", Counted())
    got, _ = _decode_logits(model, args, prompts, steps=4)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # per layer: QKV, o, gate/up, down (or o, down); the prefill (20 rows), four decodes of three
    per_layer = 4 if max_features is None else 2
    passes = 5 if max_rows >= 20 else 4  # the prefill (20 rows) and four decodes of three
    assert sorted(set(rows)) == ([3, 20] if max_rows >= 20 else [3])
    assert len(rows) == passes * per_layer * args.num_hidden_layers


def test_row_classes_name_one_row_count_per_launch_variant(monkeypatch):
    """Every row count 2..256 launches the tiles of its class's representative (so warming the
    representatives compiles every variant), at the presets' projection shapes; the
    representatives are cut to the largest row count a step can have."""
    a = PRESETS["llama-1b"]
    for n, k in ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (151936 // 64, 1024)):
        for m in range(2, 257):
            (rep,) = [hi for lo, hi in ROW_CLASSES if lo <= m <= hi]
            assert pick_gemm_tiles(m, n, k) == pick_gemm_tiles(rep, n, k), (m, n, k)
    from mrv2_prof.runner.model import projections_triton as proj

    monkeypatch.setattr(proj, "DECODE_GEMM", "triton")
    assert proj.warm_rows(256) == [16, 64, 128, 256]
    assert proj.warm_rows(40) == [16, 40] and proj.warm_rows(1) == []
    assert proj.warm_rows(a.max_position_embeddings) == [16, 64, 128, 256, 257]
