"""Triton QK-norm + RoPE against its torch reference, and the cos/sin cache against the torch
decoder's per-step angles (``rotary_triton.py``).

Without CUDA the kernel runs on CPU tensors in Triton's interpreter. The reference rotates in the
activations' dtype (as the torch decoder does), the kernel in float32 with one rounding, so
bfloat16 and float16 are held to a tolerance of a few ulps of the inputs' magnitude. The ``gpu``
tests use the presets' head shapes (llama-1b, Llama-3-8B, qwen2-0.5b, qwen3-0.6b).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mrv2_prof.runner.model import PRESETS, RotaryEmbedding, rope_inv_freq
from mrv2_prof.runner.model.attention import write_kv_ref
from mrv2_prof.runner.model.rotary_triton import (
    qk_norm_rope_ref,
    qk_norm_rope_triton,
    rope_cos_sin_cache,
)

INTERPRET = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
TOL = {  # (atol, rtol) of the kernel against the reference, inputs of magnitude ~1
    torch.float32: (1e-5, 1e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (5e-2, 2e-2),
}
LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def cache_for(head_dim: int, max_positions: int = 512, device=DEVICE) -> torch.Tensor:
    args = replace(PRESETS["llama-tiny"], head_dim=head_dim, rope_scaling=LLAMA3, rope_theta=5e5)
    return rope_cos_sin_cache(rope_inv_freq(args, device), max_positions)


def qkv(num_tokens, num_heads, num_kv_heads, head_dim, dtype, seed=0, device=DEVICE):
    """q and k as strided views of one fused [T, (h + 2 kvh) d] projection output."""
    gen = torch.Generator(device).manual_seed(seed)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    fused = torch.randn(num_tokens, width, generator=gen, device=device).to(dtype)
    q = fused[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = fused[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    return fused, q, k.view(num_tokens, num_kv_heads, head_dim)


def norm_weights(head_dim, dtype, seed=1, device=DEVICE):
    gen = torch.Generator(device).manual_seed(seed)
    w = 1 + 0.3 * torch.randn(2, head_dim, generator=gen, device=device)
    return w[0].to(dtype), w[1].to(dtype)


def check(num_tokens, num_heads, num_kv_heads, head_dim, dtype, *, by_position, norm, seed=0):
    fused, q, k = qkv(num_tokens, num_heads, num_kv_heads, head_dim, dtype, seed)
    half = head_dim // 2
    cache = cache_for(head_dim, device=q.device)
    gen = torch.Generator(q.device).manual_seed(seed + 7)
    positions = torch.randint(0, cache.shape[0], (num_tokens,), generator=gen, device=q.device)
    if by_position:
        tables = (cache[:, :half], cache[:, half:], positions)
    else:  # the torch decoder's per-token tables [T, d], both halves equal
        rows = cache[positions]
        cos, sin = rows[:, :half], rows[:, half:]
        tables = (torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype), None)
    weights = (*norm_weights(head_dim, dtype), 1e-6) if norm else ()
    want_q, want_k = qk_norm_rope_ref(q, k, *tables, *weights)
    untouched = fused[:, (num_heads + num_kv_heads) * head_dim :].clone()  # the v columns
    got_q, got_k = qk_norm_rope_triton(q, k, *tables, *weights)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got_q, want_q, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_k, want_k, atol=atol, rtol=rtol)
    assert torch.equal(fused[:, (num_heads + num_kv_heads) * head_dim :], untouched)


# (tokens, heads, kv heads, head_dim): one token; GQA; odd head counts with a head_dim whose half
# is not a power of two; MHA with a tiny head
SHAPES = [(1, 4, 2, 16), (5, 6, 2, 24), (3, 3, 3, 8), (4, 7, 1, 64)]


@pytest.mark.parametrize("norm", [False, True], ids=["rope", "qk_norm_rope"])
@pytest.mark.parametrize("by_position", [True, False], ids=["cache", "per_token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}-h{}-kvh{}-d{}".format(*s))
def test_matches_reference(shape, dtype, by_position, norm):
    check(*shape, dtype, by_position=by_position, norm=norm)


def test_cache_rows_are_the_torch_decoders_angles():
    """The cache holds exactly the float32 cos/sin the torch path computes per step; with it the
    tables are the cache's halves read by position, without it this step's [T, d] tables."""
    args = replace(PRESETS["llama-tiny"], rope_scaling=LLAMA3, max_position_embeddings=300)
    positions = torch.tensor([0, 5, 63, 64, 299])
    plain, cached = RotaryEmbedding(args), RotaryEmbedding(args, cos_sin_cache=True)
    assert plain.cos_sin_cache is None and cached.cos_sin_cache.shape == (300, args.head_dim)
    want_cos, want_sin = plain(positions, torch.float32)
    half = args.head_dim // 2
    assert torch.equal(cached.cos_sin_cache[positions, :half], want_cos[:, :half])
    assert torch.equal(cached.cos_sin_cache[positions, half:], want_sin[:, :half])
    cos, sin, rows = cached.tables(positions, torch.float32)
    assert rows is positions and cos.shape == sin.shape == (300, half)
    assert torch.equal(cos[positions], want_cos[:, :half])
    cos, sin, rows = plain.tables(positions, torch.bfloat16)
    assert rows is None and cos.dtype == torch.bfloat16
    assert torch.equal(cos, want_cos.to(torch.bfloat16)) and torch.equal(sin, want_sin.bfloat16())


def ok_cells(slots: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size] mask of the cache slots a KV write with ``slots`` touches."""
    written = torch.zeros(kv_cache.shape[1] * kv_cache.shape[2], dtype=torch.bool)
    written[slots[slots >= 0]] = True
    return written.view(kv_cache.shape[1], kv_cache.shape[2])


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("norm", [False, True], ids=["rope", "qk_norm_rope"])
def test_fused_kv_write_equals_rope_then_write_kv(norm, cache_dtype):
    """With the cache, one launch also stores the rotated k and v at their slots (exactly what
    ``write_kv_ref`` stores after the RoPE), skipping slots < 0; other slots keep their bytes."""
    T, h, kvh, d, num_blocks, block_size = 6, 6, 3, 24, 5, 4
    fused, q, k = qkv(T, h, kvh, d, torch.float32, seed=4)
    v = fused[:, (h + kvh) * d :].view(T, kvh, d)
    gen = torch.Generator().manual_seed(9)
    kv_cache = torch.randn(2, num_blocks, block_size, kvh, d, generator=gen).to(cache_dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:T]
    slots[[1, 4]] = -1
    cache = cache_for(d)
    positions = torch.randint(0, cache.shape[0], (T,), generator=gen)
    args = (cache[:, : d // 2], cache[:, d // 2 :], positions.to(DEVICE))
    args += (*norm_weights(d, torch.float32), 1e-6) if norm else ()
    want_q, want_k = qk_norm_rope_ref(q, k, *args)
    want_cache = kv_cache.clone()
    ok = slots >= 0
    write_kv_ref(want_k[ok], v[ok], want_cache, slots[ok])
    got_cache = kv_cache.to(DEVICE)
    got_q, got_k = qk_norm_rope_triton(
        q, k, *args, v=v, kv_cache=got_cache, slot_mapping=slots.to(DEVICE)
    )
    torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=1e-5)
    expected_cache = want_cache.clone()  # the kernel's k, rounded as write_kv rounds it
    write_kv_ref(got_k[ok.to(DEVICE)].cpu(), v[ok.to(DEVICE)].cpu(), expected_cache, slots[ok])
    if INTERPRET and cache_dtype == torch.bfloat16:  # the interpreter truncates to bf16
        torch.testing.assert_close(got_cache.cpu(), expected_cache, atol=1e-5, rtol=1.6e-2)
    else:
        assert torch.equal(got_cache.cpu(), expected_cache)
    assert torch.equal(
        got_cache.cpu()[:, ~ok_cells(slots, kv_cache)], kv_cache[:, ~ok_cells(slots, kv_cache)]
    )
    torch.testing.assert_close(got_cache.cpu().float(), want_cache.float(), atol=1e-2, rtol=1e-2)
    with pytest.raises(ValueError, match="a KV write needs"):
        qk_norm_rope_triton(q, k, *args[:3], kv_cache=got_cache, slot_mapping=slots)


def test_empty_batch_and_shape_errors():
    _, q, k = qkv(0, 4, 2, 16, torch.float32)
    cache = cache_for(16)
    assert qk_norm_rope_triton(q, k, cache[:, :8], cache[:, 8:])[0].shape == (0, 4, 16)
    _, q, k = qkv(2, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="even, equal head_dim"):
        qk_norm_rope_triton(q, k[..., :8], cache[:, :8], cache[:, 8:])
    with pytest.raises(ValueError, match=r"\[rows, >= 8\]"):
        qk_norm_rope_triton(q, k, cache[:, :4], cache[:, 8:])
    with pytest.raises(ValueError, match="both weights or none"):
        qk_norm_rope_triton(q, k, cache[:, :8], cache[:, 8:], None, torch.ones(16, device=DEVICE))


# --------------------------------------------------------------------------------------------
# GPU: llama-1b (32/8 heads, d 64), Llama-3-8B (32/8, d 128), qwen2-0.5b (14/2, d 64),
# qwen3-0.6b (16/8, d 128, with the QK norm)

GPU_HEADS = {"llama-1b": (32, 8, 64), "llama-3-8b": (32, 8, 128), "qwen2-0.5b": (14, 2, 64)}


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("num_tokens", [1, 64, 256, 2048])
@pytest.mark.parametrize("model", [*GPU_HEADS, "qwen3-0.6b"])
def test_gpu_preset_shapes_match_reference(model, num_tokens, dtype):
    heads = GPU_HEADS.get(model, (16, 8, 128))
    norm = model.startswith("qwen3")
    check(num_tokens, *heads, dtype, by_position=True, norm=norm, seed=num_tokens)
    check(num_tokens, *heads, dtype, by_position=False, norm=norm, seed=num_tokens + 1)
