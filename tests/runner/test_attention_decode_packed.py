"""The folded decode attention over several kv heads a program (``attention_decode_packed_triton``)
against the torch references run one after the other (``qk_norm_rope_ref``, ``write_kv_ref``,
``paged_attention_ref``): the output and the cache it leaves. Without CUDA the kernel runs in
Triton's interpreter at small sizes; the ``gpu`` test at llama-1b's, llama-3-8b's and
qwen3-0.6b's shapes."""

from __future__ import annotations

import pytest
import torch

import mrv2_prof.runner.model.attention_decode_packed_triton as packed
import mrv2_prof.runner.model.attention_split_kv_rope_triton as split_fold
from tests.runner.attention_batches import DEVICE, TOL, assert_close_verbose
from tests.runner.test_attention_decode_rope import TOLS, _case


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize(("kvh", "group", "head_dim", "pack"),
                         [(4, 2, 32, 2), (4, 2, 32, 4), (2, 1, 64, 2), (8, 3, 16, 4)])  # fmt: skip
def test_packed_fold_matches_rope_then_write_then_attention(kvh, group, head_dim, pack, norm):
    """Every kv head of every pack: the rows of each head attend over their own head's keys
    (a row reading another head's dims would show), the new k/v of each head at its slot, rows
    of padding requests and q/k left as they were. Contexts from the new key alone to 4 blocks;
    12 rows a program (not a power of two) too."""
    reqs = [(2 * 16 - 1, 1), (16 + 3, 1), (0, 1), (4 * 16, 1)]
    dtype = torch.float32
    args, want, want_cache, _ = _case(reqs, kvh, group, head_dim, 16, dtype, norm=norm,
                                      pad_reqs=2)  # fmt: skip
    q, k = args[0].clone(), args[1].clone()
    got = packed.paged_decode_packed_rope(*args, pack=pack)
    assert_close_verbose(got[: len(reqs)], want, *TOLS[dtype])
    assert_close_verbose(args[9], want_cache, *TOLS[dtype])
    assert torch.equal(args[0], q) and torch.equal(args[1], k)


def test_a_request_with_two_tokens_beside_padding():
    reqs = [(20, 2), (9, 1)]
    args, want, want_cache, _ = _case(reqs, 4, 2, 32, 8, torch.float32, norm=True, pad_reqs=1)
    got = packed.paged_decode_packed_rope(*args, pack=2)
    assert_close_verbose(got[:3], want, *TOLS[torch.float32])
    assert_close_verbose(args[9], want_cache, *TOLS[torch.float32])


def test_rope_attend_takes_it_where_the_switch_divides_the_heads(monkeypatch):
    """``DECODE_HEADS_PER_PROGRAM``: the packed kernel for the unsplit fold where it divides
    the kv heads, the one-head kernel otherwise (3 does not divide 4)."""
    calls = []
    real = packed.paged_decode_packed_rope
    monkeypatch.setattr(split_fold, "paged_decode_packed_rope",
                        lambda *a, pack: calls.append(pack) or real(*a, pack=pack))  # fmt: skip
    args, want, _, _ = _case([(9, 1), (30, 1)], 4, 2, 32, 8, torch.float32, norm=False)
    for setting, taken in [(1, []), (2, [2]), (3, [2]), (4, [2, 4])]:
        monkeypatch.setattr(packed, "DECODE_HEADS_PER_PROGRAM", setting)
        cache = args[9].clone()
        got = split_fold.rope_attend(*args[:9], cache, *args[10:])
        assert calls == taken
        assert_close_verbose(got[:2], want, *TOLS[torch.float32])


def test_a_pack_that_is_not_a_power_of_two_dividing_the_heads_is_refused():
    args, _, _, _ = _case([(9, 1)], 4, 2, 32, 8, torch.float32, norm=False)
    for pack in (3, 8):
        with pytest.raises(ValueError, match=f"{pack} heads a program must be a power of two"):
            packed.paged_decode_packed_rope(*args, pack=pack)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")
@pytest.mark.parametrize(("kvh", "group", "head_dim", "norm"),
                         [(8, 4, 64, False), (8, 4, 128, False), (8, 2, 128, True)])  # fmt: skip
@pytest.mark.parametrize("pack", [2, 4])
def test_gpu_packed_fold_at_real_sizes(kvh, group, head_dim, norm, pack):
    """llama-1b's, llama-3-8b's and qwen3-0.6b's attention shapes, 64 decodes of contexts up to
    3,000, in bf16."""
    reqs = [(int(c), 1) for c in torch.randint(1, 3000, (64,), generator=torch.Generator())]
    bf16 = torch.bfloat16
    args, want, want_cache, _ = _case(reqs, kvh, group, head_dim, 16, bf16, norm=norm)
    got = packed.paged_decode_packed_rope(*args, pack=pack)
    assert_close_verbose(got[: len(reqs)], want, *TOL[bf16])
    assert_close_verbose(args[9], want_cache, *TOL[bf16])
