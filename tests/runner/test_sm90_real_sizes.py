"""The decode kernels that are off by default compile for sm_90 at the presets' real sizes and
fit an H200's shared memory (``sm90_real_sizes.py``: compiled on the CPU, no GPU needed), so a
GPU run that switches them on does not fail at its first launch."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.runner.pdl_rules import run_without_interpreter  # noqa: E402
from tests.runner.sm90_real_sizes import FOLD_PRESETS  # noqa: E402

H200_SHARED = 232_448  # bytes of shared memory a block may use (227 KiB)


@pytest.fixture(scope="module")
def report() -> list[dict]:
    return run_without_interpreter("tests.runner.sm90_real_sizes")


def test_every_variant_fits_the_shared_memory(report):
    assert [r for r in report if r["shared"] > H200_SHARED] == []


def test_the_fold_compiles_for_every_head_layout(report):
    folds = [r for r in report if r["kernel"] == "_paged_decode_rope_kernel"]
    assert [r["case"] for r in folds] == [f"fold {p}" for p in FOLD_PRESETS]
    assert all("USE_GDC': True" in r["constexprs"] for r in folds)  # with PDL, as on an H200


def test_the_gemm_compiles_for_every_row_class_split_or_not(report):
    gemms = [r for r in report if r["kernel"] == "_gemm_decode_kernel"]
    for block_m in (16, 64, 128):  # the row classes' tiles (17-64 rows: 64, wgmma's)
        for split in (True, False):
            want = (f"'BLOCK_M': {block_m},", f"'SPLIT': {split}")
            assert any(all(w in r["constexprs"] for w in want) for r in gemms), want
    assert all(r["shared"] > 0 for r in gemms)  # a pipelined dot: the compile did size it
    reduces = [r for r in report if r["kernel"] == "_gemm_decode_splitk_reduce_kernel"]
    assert reduces and {"'RESIDUAL': True" in r["constexprs"] for r in reduces} == {True, False}


def test_the_gemm_with_the_silu_mul_prologue_fits_in_float32_too(report):
    """The down projection's SiLU-and-mul prologue at 64 rows reads gate and up tiles: at bf16's
    4 stages a float32 launch needed 272 KiB and failed to launch on an H100
    (``bounded_stages`` gives it 2); bf16 keeps its 4."""
    from tests.runner.sm90_real_sizes import PROLOGUE_CASES

    rows = {r["case"]: r for r in report if r["case"].startswith("prologue")}
    assert sorted(rows) == sorted(f"prologue m={m} {d}" for m, d in PROLOGUE_CASES)
    assert all("'SILU_MUL': True" in r["constexprs"] for r in rows.values())
    assert "'num_stages': 4" in rows["prologue m=64 bfloat16"]["constexprs"]
    assert "'num_stages': 2" in rows["prologue m=64 float32"]["constexprs"]
    assert "'num_stages': 4" in rows["prologue m=16 float32"]["constexprs"]
    assert max(r["shared"] for r in rows.values()) <= H200_SHARED
