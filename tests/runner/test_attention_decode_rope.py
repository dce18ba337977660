"""Decode attention with the RoPE kernel's work as its prologue (``attention_decode_rope_triton``)
against the torch references run one after the other: ``qk_norm_rope_ref`` of the QKV output,
``write_kv_ref`` of the rotated k and v at the token's slot, ``paged_attention_ref`` over the
cache. Both the output and the cache it leaves are compared. Without CUDA the kernel runs in
Triton's interpreter at small sizes; the ``gpu`` test at llama-1b's and qwen3-0.6b's shapes."""

from __future__ import annotations

import pytest
import torch

import mrv2_prof.runner.model.attention_decode_rope_triton as fold
import mrv2_prof.runner.model.attention_split_kv_rope_triton as split_fold
import mrv2_prof.runner.model.attention_split_kv_triton as split_kv
from mrv2_prof.runner.model import kv_cache_shape
from mrv2_prof.runner.model.attention import paged_attention_ref, write_kv_ref
from mrv2_prof.runner.model.attention_triton import decode_keys
from mrv2_prof.runner.model.rotary_triton import qk_norm_rope_ref, rope_cos_sin_cache
from tests.runner.attention_batches import DEVICE, TOL, assert_close_verbose, make_batch

BF16 = torch.bfloat16
TOLS = {**TOL, torch.float16: (4e-3, 4e-3)}


def _case(reqs, kvh, group, head_dim, block_size, dtype, *, norm, pad_reqs=0, seed=0):
    """A decode batch (the cache holding the context only), its un-rotated q/k/v, RoPE tables
    and positions, and the references' output and cache."""
    b = make_batch(reqs, kvh, group, head_dim, block_size, dtype, DEVICE, seed, pad_reqs=pad_reqs)
    gen = torch.Generator(DEVICE).manual_seed(seed + 1)
    t = b.query.shape[0]

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=DEVICE).to(dtype)

    q, k, v = randn(t, kvh * group, head_dim), randn(t, kvh, head_dim), randn(t, kvh, head_dim)
    weights = (randn(head_dim) + 1, randn(head_dim) + 1) if norm else (None, None)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, device=DEVICE) / head_dim))
    longest = max(ctx + q for ctx, q in reqs)  # a real-size batch's contexts reach 3,000
    table = rope_cos_sin_cache(inv_freq.float(), max(512, longest))
    cos, sin = table[:, : head_dim // 2], table[:, head_dim // 2 :]
    positions = torch.tensor(  # each token's position: its request's context, then onwards
        [ctx + i for ctx, q in reqs for i in range(q)], device=DEVICE, dtype=torch.long
    )
    cache = b.kv_cache.clone()  # the context; this step's k/v still to be written
    want_cache = cache.clone()
    qr, kr = qk_norm_rope_ref(q, k, cos, sin, positions, *weights, 1e-6)
    ok = b.meta.slot_mapping >= 0
    write_kv_ref(kr[ok], v[ok], want_cache, b.meta.slot_mapping[ok])
    want = paged_attention_ref(qr.float(), kr.float(), v.float(), want_cache.float(), b.meta,
                               b.scale)  # fmt: skip
    args = (q, k, v, cos, sin, positions, *weights, 1e-6, cache, b.meta, b.scale)
    return args, want[: len(positions)], want_cache, ok


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(2, 1, 64, 16), (1, 4, 64, 8), (1, 3, 32, 16)])
def test_fold_matches_rope_then_write_then_attention(shape, dtype, norm):
    kvh, group, head_dim, bs = shape
    reqs = [(2 * bs - 1, 1), (bs + 3, 1), (0, 1), (3 * bs, 1)]
    args, want, want_cache, _ = _case(reqs, kvh, group, head_dim, bs, dtype, norm=norm, pad_reqs=2)
    q, k = args[0].clone(), args[1].clone()
    got = fold.paged_decode_rope_triton(*args)
    atol, rtol = TOLS[dtype]
    assert_close_verbose(got[: len(reqs)], want, atol, rtol)
    cache = args[9]
    assert_close_verbose(cache, want_cache, atol, rtol)  # the new k/v at their slots
    assert torch.equal(args[0], q) and torch.equal(args[1], k)  # q and k left as they were


def test_a_request_with_two_tokens_beside_padding():
    """A decode batch may hold a request of two tokens beside padding requests (no more tokens
    than requests): its second token sees the first's key, written by the same program."""
    reqs = [(13, 2), (9, 1)]
    args, want, want_cache, _ = _case(reqs, 2, 2, 32, 8, torch.float32, norm=True, pad_reqs=1)
    got = fold.paged_decode_rope_triton(*args)
    assert_close_verbose(got[:3], want, *TOLS[torch.float32])
    assert_close_verbose(args[9], want_cache, *TOLS[torch.float32])


@pytest.mark.parametrize("sms", [1, 1000], ids=["wide-grid", "narrow-grid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_contexts_around_the_first_key_tile(dtype, sms, monkeypatch):
    """Contexts just under, at and past the end of a key tile (``decode_keys``: in 16 bits 128
    keys where the grid fits the SMs, 64 where it does not; 16 in float32), several tiles, and
    tokens of two beside them (the second sees the first's key, written in the same launch)."""
    monkeypatch.setattr(split_kv, "num_sms", lambda device: sms)
    reqs = [(0, 1)] * 8  # the batch's request count: 6 below and 2 padding
    n = decode_keys(dtype, len(reqs), 2, DEVICE)
    assert n == {torch.float32: 16, torch.float16: 64 if sms == 1 else 128}[dtype]
    reqs = [(n - 1, 1), (n, 1), (n + 1, 1), (3 * n + 5, 1), (n - 1, 2), (2 * n, 2)]
    args, want, want_cache, _ = _case(reqs, 2, 4, 32, 16, dtype, norm=True, pad_reqs=2)
    got = fold.paged_decode_rope_triton(*args)
    assert_close_verbose(got[: len(want)], want, *TOLS[dtype])
    assert_close_verbose(args[9], want_cache, *TOLS[dtype])


def test_a_token_without_a_slot_writes_nothing():
    """A padding token (slot -1, as FULL graphs pad) leaves the cache as it was; the others'
    slots are written."""
    reqs = [(20, 1), (9, 1), (30, 1)]
    args, _, _, _ = _case(reqs, 2, 2, 32, 8, torch.float32, norm=False)
    meta, cache = args[10], args[9]
    meta.slot_mapping[1] = -1
    before = cache.clone()
    fold.paged_decode_rope_triton(*args)
    changed = (cache != before).flatten(3).any(-1)  # [2, blocks, block_size]: slots changed
    written = sorted(int(s) for s in meta.slot_mapping.tolist() if s >= 0)
    assert len(written) == 2
    for kv in (0, 1):  # k and v: exactly the two slots
        assert changed[kv].flatten().nonzero().flatten().tolist() == written


def test_folds_rope_in_decode_batches_with_a_cache(monkeypatch):
    args, _, _, _ = _case([(20, 1), (9, 1)], 2, 2, 32, 8, torch.float32, norm=False)
    meta, cache = args[10], args[9]
    assert not fold.folds_rope(2, meta, cache)  # off by default
    monkeypatch.setattr(fold, "ROPE_IN_DECODE_ATTENTION", True)
    assert fold.folds_rope(2, meta, cache)
    assert not fold.folds_rope(3, meta, cache)  # more tokens than requests: not a decode batch
    assert not fold.folds_rope(2, meta, None)  # a dummy run without a cache
    assert not fold.folds_rope(0, meta, cache)
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", 2)
    assert fold.folds_rope(2, meta, cache)  # split-KV attention folds it too


@pytest.mark.parametrize("min_keys", [0, 40])
@pytest.mark.parametrize("splits", [1, 2, 3, 5])
@pytest.mark.parametrize("norm", [False, True])
def test_split_fold_matches_rope_then_write_then_attention(splits, norm, min_keys, monkeypatch):
    """The split-KV kernel with the fold's prologue (``rope_attend`` under a forced split count)
    against the references: every split's keys, the new ones written by the split holding
    them; contexts from 0 (the new key alone) to 4 blocks, splits left empty at 5. With splits of
    at least 48 keys (``MIN_CHUNK_KEYS`` 40, 16-key tiles) the three shorter requests are split
    0's alone, which writes their keys and their output."""
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", splits)
    monkeypatch.setattr(split_kv, "MIN_CHUNK_KEYS", min_keys)
    reqs = [(2 * 16 - 1, 1), (16 + 3, 1), (0, 1), (4 * 16, 1)]
    args, want, want_cache, _ = _case(reqs, 2, 2, 32, 16, torch.float32, norm=norm, pad_reqs=2)
    q, k = args[0].clone(), args[1].clone()
    got = split_fold.rope_attend(*args)
    assert_close_verbose(got[: len(reqs)], want, *TOLS[torch.float32])
    assert_close_verbose(args[9], want_cache, *TOLS[torch.float32])
    assert torch.equal(args[0], q) and torch.equal(args[1], k)


@pytest.mark.parametrize("splits", [2, 4])
def test_split_fold_with_two_tokens_beside_padding(splits, monkeypatch):
    """A request of two tokens whose new keys may fall in different splits: each split writes
    the new keys it holds and reads only its own, so the second token sees the first's key."""
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", splits)
    # keys 31 and 32 of 33: float32 walks 16 keys a step, so the chunks are 32 keys at 2 splits
    # and 16 at 4, and the two new keys fall in different splits either way
    reqs = [(31, 2), (9, 1)]
    args, want, want_cache, _ = _case(reqs, 2, 2, 32, 8, torch.float32, norm=True, pad_reqs=1)
    got = split_fold.rope_attend(*args)
    assert_close_verbose(got[:3], want, *TOLS[torch.float32])
    assert_close_verbose(args[9], want_cache, *TOLS[torch.float32])


def test_a_batch_that_is_not_a_decode_is_refused():
    args, _, _, _ = _case([(20, 1), (9, 1)], 2, 2, 32, 8, torch.float32, norm=False)
    q, k, v = (torch.cat([t, t]) for t in args[:3])
    with pytest.raises(ValueError, match="4 tokens > 2 requests"):
        fold.paged_decode_rope_triton(q, k, v, *args[3:])


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")
@pytest.mark.parametrize(("kvh", "group", "head_dim", "norm"), [(8, 4, 64, False),
                                                                 (8, 2, 128, True)])  # fmt: skip
@pytest.mark.parametrize("splits", [None, 4, "policy"])
def test_gpu_fold_at_real_sizes(kvh, group, head_dim, norm, splits, monkeypatch):
    """The unsplit fold, the split one at 4 splits and at the policy's count (the context bound
    of the batch's block table), through ``rope_attend`` as the model calls it."""
    if splits == "policy":
        monkeypatch.setattr(split_kv, "SPLIT_KV_ENABLED", True)
    elif splits is not None:
        monkeypatch.setattr(split_kv, "FORCED_SPLITS", splits)
    reqs = [(int(c), 1) for c in torch.randint(1, 3000, (64,), generator=torch.Generator())]
    if splits == "policy":  # 8 of them: the policy splits at small batch
        reqs = reqs[:8]
    args, want, want_cache, _ = _case(reqs, kvh, group, head_dim, 16, BF16, norm=norm)
    if splits == "policy":
        assert split_kv.decode_split_count(args[10], kvh, DEVICE) > 1
    got = split_fold.rope_attend(*args)
    assert_close_verbose(got[: len(reqs)], want, *TOL[BF16])
    assert_close_verbose(args[9], want_cache, *TOL[BF16])


def _decode_logits(model, args, prompts, steps: int) -> tuple[torch.Tensor, list]:
    """Each prompt prefilled, then ``steps`` decode batches of all of them (each feeding its
    greedy token): the decode steps' logits and the caches."""
    from test_fused_model import paged_batch

    bs = 4
    caches = [torch.zeros(kv_cache_shape(args, 64 * len(prompts), bs), device=DEVICE)
              for _ in range(args.num_hidden_layers)]  # fmt: skip
    lens = [len(p) for p in prompts]
    with torch.no_grad():
        meta, positions = paged_batch([(0, n) for n in lens], bs)
        hidden = model(torch.cat(prompts).to(DEVICE), positions, caches, meta)
        last = torch.tensor(lens, device=DEVICE).cumsum(0) - 1
        ids = model.compute_logits(hidden[last]).argmax(-1)
        out = []
        for s in range(steps):
            meta, positions = paged_batch([(n + s, 1) for n in lens], bs)
            logits = model.compute_logits(model(ids, positions, caches, meta))
            out.append(logits)
            ids = logits.argmax(-1)
    return torch.stack(out), caches


@pytest.mark.parametrize("qk_norm", [False, True])
def test_a_model_with_the_fold_decodes_as_without(qk_norm, monkeypatch):
    """llama-tiny in float32 with the Triton ops (Qwen3's q/k norm fitted where asked): three
    prompts prefilled, then four decode steps, with the fold on and off: the same logits and
    the same caches (the fold's layers launch one kernel fewer)."""
    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.runner.model import RMSNorm
    from mrv2_prof.runner.model.loader import load_model
    from mrv2_prof.runner.model.model_kernels import triton_model_kernels

    kernels = triton_model_kernels()
    model, args = load_model(ModelSpec(preset="llama-tiny"), DEVICE, torch.float32,
                             kernels=kernels)  # fmt: skip
    if qk_norm:
        gen = torch.Generator().manual_seed(5)
        for layer in model.model.layers:
            for name in ("q_norm", "k_norm"):
                norm = RMSNorm(args.head_dim, args.rms_norm_eps, kernels.rmsnorm).to(DEVICE)
                norm.weight.data = 1 + 0.3 * torch.randn(args.head_dim, generator=gen).to(DEVICE)
                setattr(layer.self_attn, name, norm)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, args.vocab_size, (n,), generator=gen) for n in (7, 3, 10)]
    want, want_caches = _decode_logits(model, args, prompts, steps=4)
    calls = []
    kernel = fold._paged_decode_rope_kernel

    class Counted:  # the fold's kernel, its launches counted
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    monkeypatch.setattr(fold, "ROPE_IN_DECODE_ATTENTION", True)
    monkeypatch.setattr(fold, "_paged_decode_rope_kernel", Counted())
    got, caches = _decode_logits(model, args, prompts, steps=4)
    assert len(calls) == 4 * args.num_hidden_layers  # every decode layer took the fold
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    for c, w in zip(caches, want_caches, strict=True):
        torch.testing.assert_close(c, w, atol=1e-6, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")
@pytest.mark.parametrize("preset", ["llama-1b", "qwen3-0.6b"])
@pytest.mark.parametrize(("decode_gemv", "num_reqs"),
                         [("fused_onepass", 1), ("plain", 1), ("plain", 64)])  # fmt: skip
def test_gpu_a_decode_layer_with_the_fold_is_one_launch_shorter(
    preset, decode_gemv, num_reqs, monkeypatch
):
    """bf16, a uniform decode batch: a decoder layer with the fold launches one kernel fewer
    than without it (five with the fused GEMV prologues at batch 1), and its output is the
    unfolded layer's within bf16."""
    from test_fused_model import device_kernels, paged_batch

    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.runner.model import projections_triton
    from mrv2_prof.runner.model.loader import load_model
    from mrv2_prof.runner.model.model_kernels import triton_model_kernels

    monkeypatch.setattr(projections_triton, "DECODE_GEMV", decode_gemv)
    model, args = load_model(ModelSpec(preset=preset), DEVICE, BF16, kernels=triton_model_kernels())
    cache = torch.zeros(kv_cache_shape(args, 64 * num_reqs, 16), dtype=BF16, device=DEVICE)
    meta, positions = paged_batch([(100 + 7 * i, 1) for i in range(num_reqs)], 16)
    x = torch.randn(num_reqs, args.hidden_size, device=DEVICE, dtype=BF16)
    layer = model.model.layers[3]
    rope = model.model.rotary_emb.tables(positions, x.dtype)
    outs, counts = {}, {}
    with torch.no_grad():
        for on in (False, True):
            monkeypatch.setattr(fold, "ROPE_IN_DECODE_ATTENTION", on)
            outs[on] = layer(x.clone(), rope, cache, meta)
            xs = x.clone()  # the layer adds into it in place, call after call
            counts[on] = len(device_kernels(lambda xs=xs: layer(xs, rope, cache, meta)))
    assert counts[True] == counts[False] - 1, counts
    if decode_gemv == "fused_onepass":
        assert counts[True] == 5, counts
    torch.testing.assert_close(outs[True], outs[False], atol=5e-2, rtol=5e-2)
