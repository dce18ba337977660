"""The folded decode attention that reads its context's keys before the PDL wait
(``attention_decode_early_triton``) against the torch references run one after the other
(``qk_norm_rope_ref``, ``write_kv_ref`` at the token's slot, ``paged_attention_ref`` over the
cache: ``test_attention_decode_rope._case``), through ``rope_attend`` as the model calls it, and a
model decoding with it as without. Without CUDA the kernel runs in Triton's interpreter at small
sizes; the ``gpu`` test at llama-1b's and qwen3-0.6b's shapes."""

from __future__ import annotations

import pytest
import torch

import mrv2_prof.runner.model.attention_decode_early_triton as early
import mrv2_prof.runner.model.attention_decode_rope_triton as fold
import mrv2_prof.runner.model.attention_split_kv_rope_triton as split_fold
import mrv2_prof.runner.model.attention_split_kv_triton as split_kv
from mrv2_prof.runner.model.attention import paged_attention_ref, write_kv_ref
from mrv2_prof.runner.model.attention_triton import decode_keys
from mrv2_prof.runner.model.rotary_triton import qk_norm_rope_ref
from tests.runner.attention_batches import DEVICE, TOL, assert_close_verbose
from tests.runner.test_attention_decode_rope import TOLS, _case, _decode_logits

BF16 = torch.bfloat16


@pytest.fixture
def early_on(monkeypatch):
    """The early kernel serves ``rope_attend``; its launches are counted (grids)."""
    calls = []
    kernel = early._early_decode_kernel

    class Counted:
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    monkeypatch.setattr(early, "EARLY_DECODE_ATTENTION", True)
    monkeypatch.setattr(early, "_early_decode_kernel", Counted())
    return calls


@pytest.mark.parametrize("prefetch", [0, 32])
@pytest.mark.parametrize("splits", [1, 2, 3, 5])
@pytest.mark.parametrize("norm", [False, True])
def test_early_fold_matches_rope_then_write_then_attention(
    splits, norm, prefetch, early_on, monkeypatch
):
    """Contexts from 0 (the new key alone) to 4 blocks of 16, float32 (16-key tiles), split 1
    to 5 ways (splits left empty at 5), the first key tile or 32 keys read before the wait: the
    output and the cache the references leave; q and k left as they were."""
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", splits)
    monkeypatch.setattr(early, "PREFETCH_KEYS", prefetch)
    reqs = [(2 * 16 - 1, 1), (16 + 3, 1), (0, 1), (4 * 16, 1), (16, 1)]
    args, want, want_cache, _ = _case(reqs, 2, 2, 32, 16, torch.float32, norm=norm, pad_reqs=2)
    q, k = args[0].clone(), args[1].clone()
    got = split_fold.rope_attend(*args)
    assert early_on == [(len(reqs) + 2, 2, splits)]
    assert_close_verbose(got[: len(reqs)], want, *TOLS[torch.float32])
    assert_close_verbose(args[9], want_cache, *TOLS[torch.float32])
    assert torch.equal(args[0], q) and torch.equal(args[1], k)


@pytest.mark.parametrize("splits", [1, 2, 4])
def test_early_fold_with_two_tokens_beside_padding(splits, early_on, monkeypatch):
    """A request of two tokens: the second sees the first's key (rotated in registers, never
    read back), wherever the split boundaries fall; each new key stored once."""
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", splits)
    reqs = [(31, 2), (9, 1)]
    args, want, want_cache, _ = _case(reqs, 2, 2, 32, 8, torch.float32, norm=True, pad_reqs=1)
    got = split_fold.rope_attend(*args)
    assert_close_verbose(got[:3], want, *TOLS[torch.float32])
    assert_close_verbose(args[9], want_cache, *TOLS[torch.float32])


@pytest.mark.parametrize("sms", [1, 1000], ids=["wide-grid", "narrow-grid"])
def test_early_fold_around_the_first_key_tile_in_16_bits(sms, early_on, monkeypatch):
    """float16, unsplit: contexts just under, at and past a key tile (64 or 128 keys), so the
    keys read before the wait are all, some or none of the context's."""
    monkeypatch.setattr(split_kv, "num_sms", lambda device: sms)
    n = decode_keys(torch.float16, 8, 2, DEVICE)
    reqs = [(n - 1, 1), (n, 1), (n + 1, 1), (3 * n + 5, 1), (0, 1), (2 * n, 1)]
    args, want, want_cache, _ = _case(reqs, 2, 4, 32, 16, torch.float16, norm=True, pad_reqs=2)
    got = split_fold.rope_attend(*args)
    assert_close_verbose(got[: len(want)], want, *TOLS[torch.float16])
    assert_close_verbose(args[9], want_cache, *TOLS[torch.float16])


def test_a_key_without_a_slot_is_seen_but_not_stored(early_on):
    """A token whose slot is -1: its key is not stored, and attention still sees it as the QKV
    output gives it (``paged_attention_ref``: a chunk's own keys from its arguments)."""
    reqs = [(20, 1), (9, 1), (30, 1)]
    args, _, _, _ = _case(reqs, 2, 2, 32, 8, torch.float32, norm=False)
    q, k, v, cos, sin, positions, qw, kw, eps, cache, meta, scale = args
    meta.slot_mapping[1] = -1
    want_cache = cache.clone()
    qr, kr = qk_norm_rope_ref(q, k, cos, sin, positions, qw, kw, eps)
    ok = meta.slot_mapping >= 0
    write_kv_ref(kr[ok], v[ok], want_cache, meta.slot_mapping[ok])
    want = paged_attention_ref(qr, kr, v, want_cache, meta, scale)
    got = split_fold.rope_attend(*args)
    assert_close_verbose(got[:3], want[:3], *TOLS[torch.float32])
    assert torch.equal(cache, want_cache)  # token 1's slot left as it was


def test_early_needs_a_power_of_two_prefetch(early_on, monkeypatch):
    monkeypatch.setattr(early, "PREFETCH_KEYS", 24)
    args, _, _, _ = _case([(20, 1)], 2, 2, 32, 8, torch.float32, norm=False)
    with pytest.raises(ValueError, match="PREFETCH_KEYS 24"):
        split_fold.rope_attend(*args)


def test_a_model_with_the_early_fold_decodes_as_without(early_on, monkeypatch):
    """llama-tiny in float32 with the Triton ops: three prompts prefilled, then four decode
    steps with the early fold and without any fold: the same logits and caches."""
    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.runner.model.loader import load_model
    from mrv2_prof.runner.model.model_kernels import triton_model_kernels

    model, args = load_model(ModelSpec(preset="llama-tiny"), DEVICE, torch.float32,
                             kernels=triton_model_kernels())  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, args.vocab_size, (n,), generator=gen) for n in (7, 3, 10)]
    monkeypatch.setattr(early, "EARLY_DECODE_ATTENTION", False)
    want, want_caches = _decode_logits(model, args, prompts, steps=4)
    assert early_on == []
    monkeypatch.setattr(early, "EARLY_DECODE_ATTENTION", True)
    monkeypatch.setattr(fold, "ROPE_IN_DECODE_ATTENTION", True)
    got, caches = _decode_logits(model, args, prompts, steps=4)
    assert len(early_on) == 4 * args.num_hidden_layers  # every decode layer took it
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    for c, w in zip(caches, want_caches, strict=True):
        torch.testing.assert_close(c, w, atol=1e-6, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")
@pytest.mark.parametrize(("kvh", "group", "head_dim", "norm"), [(8, 4, 64, False),
                                                                 (8, 2, 128, True)])  # fmt: skip
@pytest.mark.parametrize(("splits", "num_reqs"), [(1, 1), (1, 8), (4, 64), ("policy", 1),
                                                  ("policy", 8), (None, 64)])  # fmt: skip
def test_gpu_early_fold_at_real_sizes(kvh, group, head_dim, norm, splits, num_reqs, early_on,
                                      monkeypatch):  # fmt: skip
    """bf16 at llama-1b's and qwen3-0.6b's heads, contexts to 3,000: unsplit, 4 splits and the
    policy's count, with PDL as the engine launches it."""
    if splits == "policy":
        monkeypatch.setattr(split_kv, "SPLIT_KV_ENABLED", True)
    elif splits is not None:
        monkeypatch.setattr(split_kv, "FORCED_SPLITS", splits)
    gen = torch.Generator().manual_seed(num_reqs)
    reqs = [(int(c), 1) for c in torch.randint(1, 3000, (num_reqs,), generator=gen)]
    args, want, want_cache, _ = _case(reqs, kvh, group, head_dim, 16, BF16, norm=norm)
    got = split_fold.rope_attend(*args)
    assert len(early_on) == 1
    assert_close_verbose(got[: len(reqs)], want, *TOL[BF16])
    assert_close_verbose(args[9], want_cache, *TOL[BF16])
