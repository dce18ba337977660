"""The warm-up's forward passes (``startup.warm_forward``) cover every class of batch whose
kernels differ, whatever the limits: a token count == 1, % 16 == 0 and neither; a decode batch
and a prefill; the prefill attention with decode tiles and with prefill tiles (16-bit dtypes,
which a CPU run never takes); each shape within the limits and through the real cache."""

from __future__ import annotations

import types

import pytest
import torch

from mrv2_prof.runner.model.attention_decode_triton import is_decode_batch
from mrv2_prof.runner.model.attention_triton import DECODE_TILES, PREFILL_TILES, pick_tiles
from mrv2_prof.runner.worker import startup


def _shapes(monkeypatch, seqs: int, tokens: int, model_len: int) -> list[tuple[int, int]]:
    runs = []

    def record(runner, num_tokens, num_reqs, with_kv_cache=False):
        assert with_kv_cache  # attends through the real cache: its kernels compile
        runs.append((num_tokens, num_reqs))

    monkeypatch.setattr(startup, "dummy_run", record)
    config = types.SimpleNamespace(
        max_num_seqs=seqs, max_num_batched_tokens=tokens, max_model_len=model_len,
        block_size=16, max_num_blocks_per_req=-(-model_len // 16),
    )  # fmt: skip
    model = types.SimpleNamespace(kernels=types.SimpleNamespace(name="triton"))
    runner = types.SimpleNamespace(
        config=config, model=model, device=torch.device("cpu"),
        kv_caches=[torch.empty(2, 1, 16, 8, 4)],  # [2, blocks, block size, kv heads, d]
    )  # fmt: skip
    startup.warm_forward(runner)
    return runs


@pytest.mark.parametrize(
    "seqs, tokens, model_len",
    [(4, 32, 80), (4, 24, 80), (1, 32, 80), (256, 8192, 4096), (128, 2048, 131072), (8, 500, 70)],
)
def test_every_class_is_warmed_within_the_limits(monkeypatch, seqs, tokens, model_len):
    runs = _shapes(monkeypatch, seqs, tokens, model_len)
    assert len(runs) == len(set(runs)) <= 5  # each shape once: at most five compiles a kernel
    for n, r in runs:
        assert 1 <= r <= min(seqs, n) and n <= min(tokens, model_len - 1), (n, r)
    counts = {n for n, _ in runs}
    assert 1 in counts
    assert any(n % 16 == 0 for n in counts), counts
    assert any(n != 1 and n % 16 for n in counts), counts
    decode = [(n, r) for n, r in runs if is_decode_batch(n, r)]
    prefill = [(n, r) for n, r in runs if not is_decode_batch(n, r)]
    assert decode and prefill
    tiles = {pick_tiles(n, r, torch.bfloat16) for n, r in prefill}
    assert tiles == {DECODE_TILES, PREFILL_TILES}
    if seqs > 1:  # several requests, in a decode batch and in a prefill
        assert any(r > 1 for _, r in decode) and any(r > 1 for _, r in prefill)


@pytest.mark.parametrize(("tokens", "model_len"), [(8192, 4096), (40, 80), (24, 30)])
def test_with_the_decode_gemm_each_of_its_row_classes_is_run(monkeypatch, tokens, model_len):
    """``runner.decode_gemm: triton``: one more forward per class of the GEMM's variants that a
    step within the limits can reach, each the largest count of its class that fits (one
    request: a prefill; a shape the others already run is not run twice)."""
    from mrv2_prof.runner.model import projections_triton
    from mrv2_prof.runner.model.gemm_decode_triton import ROW_CLASSES

    base = _shapes(monkeypatch, 4, tokens, model_len)
    monkeypatch.setattr(projections_triton, "DECODE_GEMM", "triton")
    runs = _shapes(monkeypatch, 4, tokens, model_len)
    budget = min(tokens, model_len - 1)
    want = [min(hi, budget) for lo, hi in ROW_CLASSES if lo <= budget]
    if budget > 256:  # every shape above is the GEMM's: the fewest rows it does not serve too
        want.append(257)
    assert runs == list(dict.fromkeys(base + [(n, 1) for n in want]))  # a shape runs once
    assert all(n <= budget for n, _ in runs)


@pytest.mark.parametrize(("tokens", "want"), [(8192, [16, 64]), (40, [16, 40]), (24, [16, 24])])
def test_with_the_narrow_decode_gemm_its_served_classes_are_run(monkeypatch, tokens, want):
    """``runner.decode_gemm: narrow`` (2-64 rows): the warm-up runs the most rows of each class
    the GEMM serves within the budget (2-16 and 17-64, a launch variant each), none above 64
    (the prefill shapes of more than 64 rows launch what the GEMM's replace)."""
    from mrv2_prof.runner.model import projections_triton

    base = _shapes(monkeypatch, 4, tokens, 4096)
    monkeypatch.setattr(projections_triton, "DECODE_GEMM", "triton")
    monkeypatch.setattr(projections_triton, "GEMM_ROWS", projections_triton.NARROW_GEMM[1])
    runs = _shapes(monkeypatch, 4, tokens, 4096)
    assert runs == list(dict.fromkeys(base + [(n, 1) for n in want]))


@pytest.mark.parametrize(("seqs", "model_len", "unsplit"), [(256, 4096, 17), (8, 4096, None)])
def test_with_split_kv_a_decode_batch_it_leaves_unsplit_is_run(monkeypatch, seqs, model_len,
                                                              unsplit):  # fmt: skip
    """``runner.split_kv`` on, 132 SMs, 8 kv heads: the policy splits every decode batch of up
    to 16 requests (``test_attention_split_kv``), so the warm-up's decode batches (1 and 8
    requests) compile only the split kernel; a decode batch of 17 compiles the unsplit one too.
    With at most 8 requests a step no decode batch goes unsplit, and none is added."""
    from mrv2_prof.runner.model import attention_split_kv_triton as split_kv

    monkeypatch.setattr(split_kv, "SPLIT_KV_ENABLED", True)
    monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)
    runs = _shapes(monkeypatch, seqs, 8192, model_len)
    decode = [r for n, r in runs if is_decode_batch(n, r)]
    cpu = torch.device("cpu")
    unsplit_runs = [r for r in decode if split_kv.split_count(r, 8, model_len, cpu) == 1]
    assert unsplit_runs == ([unsplit] if unsplit else [])
    assert any(split_kv.split_count(r, 8, model_len, cpu) > 1 for r in decode)


@pytest.mark.parametrize(("seqs", "wide"), [(256, 17), (17, 17), (16, None)])
def test_a_decode_batch_wider_than_the_sms_is_run(monkeypatch, seqs, wide):
    """132 SMs, 8 kv heads: decode batches of up to 16 requests take the 128-key tile, from 17
    the wide grid's 64 (``attention_triton.decode_keys``); the warm-up runs a batch of 17 when
    a step can hold 17 requests, so both tiles compile before serving, and none past the limit."""
    from mrv2_prof.runner.model import attention_split_kv_triton as split_kv
    from mrv2_prof.runner.model.attention_triton import decode_keys

    monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)
    runs = _shapes(monkeypatch, seqs, 8192, 4096)
    decode = [r for n, r in runs if is_decode_batch(n, r)]
    cpu = torch.device("cpu")
    tiles = {decode_keys(torch.bfloat16, r, 8, cpu) for r in decode}
    assert tiles == ({128, 64} if wide else {128})
    assert max(decode) == (wide or min(seqs, 8))


def test_the_wide_decode_grid_takes_its_own_warps_and_stages(monkeypatch):
    """132 SMs, 8 kv heads: the folded decode kernels launch with Triton's 4 warps and
    ``DECODE_STAGES`` up to 16 requests and with ``WIDE_DECODE_WARPS`` / ``WIDE_DECODE_STAGES``
    from 17, the batch where ``decode_keys`` turns to the wide tile."""
    from mrv2_prof.runner.model import attention_split_kv_triton as split_kv
    from mrv2_prof.runner.model import attention_triton

    monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)
    monkeypatch.setattr(attention_triton, "WIDE_DECODE_WARPS", 8)
    monkeypatch.setattr(attention_triton, "WIDE_DECODE_STAGES", 1)
    monkeypatch.setattr(attention_triton, "DECODE_STAGES", 5)
    cpu = torch.device("cpu")
    for reqs in (1, 16, 17, 256):
        wide = attention_triton.decode_keys(torch.bfloat16, reqs, 8, cpu) == 64
        launch = attention_triton.decode_launch(reqs, 8, cpu, 64)
        assert launch == ({"num_warps": 8, "num_stages": 1} if wide else {"num_stages": 5})
        assert wide == (reqs >= 17)
    monkeypatch.setattr(attention_triton, "WIDE_DECODE_MAXNREG", 128)  # the wide grid's alone
    assert attention_triton.decode_launch(17, 8, cpu, 64) == {
        "num_warps": 8,
        "num_stages": 1,
        "maxnreg": 128,
    }
    assert attention_triton.decode_launch(16, 8, cpu, 64) == {"num_stages": 5}


def test_narrow_grid_stages_stay_where_two_key_tiles_fit_an_sm(monkeypatch):
    """5 or more ``DECODE_STAGES`` keep two 128-key tiles' K and V in shared memory: at head_dim
    128 in bf16 that is 2 x 2 x 128 x 128 x 2 = 128 KiB (+16 margin), under sm_90's 227 KiB a
    block, so 5 stays 5; at 256 it is 256 KiB, so the narrow launch takes 4 (one tile, as 3);
    3 and 4 stay what they are at any head size."""
    from mrv2_prof.runner.model import attention_split_kv_triton as split_kv
    from mrv2_prof.runner.model import attention_triton

    monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)  # 8 programs: a narrow grid
    monkeypatch.setattr(attention_triton, "DECODE_STAGES", 5)
    assert [attention_triton.narrow_stages(d) for d in (64, 128, 256)] == [5, 5, 4]
    launch = attention_triton.decode_launch(1, 8, torch.device("cpu"), head_dim=256)
    assert launch == {"num_stages": 4}
    for stages in (3, 4):
        monkeypatch.setattr(attention_triton, "DECODE_STAGES", stages)
        assert attention_triton.narrow_stages(256) == stages
