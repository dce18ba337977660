"""``benchmarks/kernel_resources.py``: a decode step's Triton launches recorded on the CPU as a
132-SM GPU taking PDL would make them, compiled for sm_90 and their cubins' registers, spills and
shared memory read back; the blocks an SM holds worked by hand. The folded decode attention's
stages (``attention_triton.narrow_stages``) are checked against what the compile takes: at
head_dim 256, five stages would not fit an SM and the launch takes four."""

from __future__ import annotations

import sys

import pytest

from tests.benchmark_runs import BENCHMARKS, load_benchmark, nvidia_tool_here, run_benchmark

DUMP = """
Resource usage:
 Common:
  GLOBAL:11 CONSTANT[4]:8
 Function _walk:
  REG:143 STACK:8 SHARED:1024 LOCAL:16 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
KIB = 1024


def test_blocks_an_sm_holds_are_the_least_its_registers_shared_memory_and_warps_allow(monkeypatch):
    """By hand, sm_90's 65,536 registers (256 a warp at a time), 228 KiB of shared memory (1 KiB
    a block reserved, 227 the most one block takes), 64 warps, 32 blocks:
    65 regs x 32 threads = 2,080 -> 2,304 a warp, x 4 warps = 9,216: 7 blocks (shared: 45);
    143 regs -> 4,608 a warp, 18,432 a block: 3, and 71 KiB + 1 KiB: 228 / 72 = 3;
    253 regs, 8 warps -> 8,192 a warp, the whole file: 1; 23 regs, 4 warps, none shared -> 21 by
    registers, 16 by warps; 269 KiB: over what one block may take, 0."""
    kr = load_benchmark("kernel_resources", monkeypatch)
    assert kr.blocks_per_sm(65, 4, 4 * KIB) == 7
    assert kr.blocks_per_sm(143, 4, 71 * KIB) == 3
    assert kr.blocks_per_sm(143, 4, 40 * KIB) == 3  # registers bind: shared would allow 5
    assert kr.blocks_per_sm(253, 8, 2 * KIB) == 1
    assert kr.blocks_per_sm(23, 4, 0) == 16
    assert kr.blocks_per_sm(255, 4, 269 * KIB) == 0
    assert kr.blocks_per_sm(32, 1, 227 * KIB) == 1 and kr.blocks_per_sm(32, 1, 228 * KIB) == 0


def test_the_cubin_resources_are_read_from_cuobjdump(monkeypatch):
    kr = load_benchmark("kernel_resources", monkeypatch)
    assert kr.resource_usage(DUMP) == (143, 24)  # STACK 8 + LOCAL 16
    with pytest.raises(ValueError, match="no resource usage"):
        kr.resource_usage("Resource usage:\n Common:\n  GLOBAL:11\n")


@pytest.fixture
def compiling(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # it records launches and compiles


def test_a_decode_steps_launches_are_recorded_as_a_gpu_makes_them(tmp_path, compiling):
    """qwen3-0.6b, two layers on the one-pass fused path with the MLP in one launch and RoPE
    folded into attention: a layer is the QKV GEMV (with the norm), the folded attention, the o
    GEMV and the MLP, then the final norm; 8 kv heads, so a batch of one is 8 programs of Triton's
    4 warps, and a batch of 64 (512 programs on 132 SMs) the wide grid's 2 warps."""
    run = run_benchmark(
        "kernel_resources.py", tmp_path / "r.json", "--preset", "qwen3-0.6b", "--layers", "2",
        "--batch", "1", "64", "--variant", "fused_onepass+pdl+fold+split+mlp", "--list",
        timeout=300,
    )  # fmt: skip
    one = [r for r in run.results if r["batch"] == 1]
    layer = ["_gemv_kernel", "_paged_decode_rope_kernel", "_gemv_kernel", "_mlp_decode_kernel"]
    assert [r["kernel"] for r in one] == 2 * layer + ["_rmsnorm_kernel"]
    attention = [r for r in run.results if r["kernel"] == "_paged_decode_rope_kernel"]
    by_batch = {(r["batch"], tuple(r["grid"]), r["num_warps"], r["num_stages"]) for r in attention}
    assert len(attention) == 4 and by_batch == {(1, (1, 8), 4, 3), (64, (64, 8), 2, 3)}
    assert "regs" not in one[0] and "| _mlp_decode_kernel | 96 | 8 | 3 |" in run.stdout


def test_the_narrow_gemm_takes_o_and_down_up_to_its_rows_bound(tmp_path, compiling):
    """``+narrow``: qwen3-0.6b's o and down (1,024 outputs) take the Triton decode GEMM at 8 rows
    (32 tiles of 32 outputs, K split 4 and 5 ways: one program an SM or more, each split whole
    steps of 128) and its split reduction, a launch each, and at 32 and 64 rows (``NARROW_GEMM``'s
    2-64: the 64-row tile, its dot ``wgmma``, split 4 ways: one 120 KiB program an SM, one wave);
    under ``+narrow16`` (2-16 rows: the bound read when the paths are applied) at 8 rows only."""
    run = run_benchmark(
        "kernel_resources.py", tmp_path / "n.json", "--preset", "qwen3-0.6b", "--layers", "1",
        "--batch", "8", "32", "64", "--variant", "plain+pdl+fold+split+narrow",
        "--variant", "plain+pdl+fold+split+narrow16", "--list", timeout=300,
    )  # fmt: skip
    gemms = {(r["variant"], r["batch"], tuple(r["grid"]))
             for r in run.results if r["kernel"] == "_gemm_decode_kernel"}  # fmt: skip
    narrow, narrow16 = "plain+pdl+fold+split+narrow", "plain+pdl+fold+split+narrow16"
    assert {g for g in gemms if g[1] == 8} == {
        (v, 8, (32, 1, s)) for v in (narrow, narrow16) for s in (4, 5)}  # fmt: skip
    assert {g for g in gemms if g[1] > 8} == {(narrow, 32, (32, 1, 4)), (narrow, 64, (32, 1, 4))}


needs_toolchain = pytest.mark.skipif(
    not nvidia_tool_here("cuobjdump"), reason="needs Triton's NVIDIA backend and its cuobjdump"
)


def _attention(tmp_path, name: str, *args: str) -> dict:
    run = run_benchmark(
        "kernel_resources.py", tmp_path / f"{name}.json", "--kernels", "_paged_decode_rope",
        *args, timeout=400,
    )  # fmt: skip
    rows = [r for r in run.results if r["kernel"] == "_paged_decode_rope_kernel"]
    assert all("regs" in r for r in rows) and not any("regs" in r for r in run.results[:1])
    return rows


@needs_toolchain
def test_five_stages_double_the_folded_attentions_buffers_and_fit_at_head_dim_128(
    tmp_path, compiling
):
    """qwen3-0.6b (head_dim 128): at 3 stages the kernel's shared memory holds one 128-key tile's
    K and V (2 x 128 x 128 x 2 bytes = 64 KiB) and not two; at 5 (``+ds5``) two (128 KiB), still
    under the 227 KiB a block may take; no spill either way."""
    three, five = _attention(
        tmp_path, "q", "--preset", "qwen3-0.6b", "--variant", "plain+pdl+fold+split",
        "--variant", "plain+pdl+fold+split+ds5",
    )  # fmt: skip
    assert (three["num_stages"], five["num_stages"]) == (3, 5)
    assert 64 * KIB <= three["shared_bytes"] < 128 * KIB <= five["shared_bytes"] < 227 * KIB
    assert three["spill_bytes"] == five["spill_bytes"] == 0
    assert three["blocks_per_sm"] >= 1 and five["blocks_per_sm"] >= 1


@needs_toolchain
def test_at_head_dim_256_five_stages_would_not_fit_so_the_launch_takes_four(tmp_path, compiling):
    """llama-1b's shape at head_dim 256: two tiles' K and V are 2 x 2 x 128 x 256 x 2 bytes =
    256 KiB, over the 227 KiB a block may take: compiled at 5 stages the kernel cannot run (0
    blocks an SM, at 4 warps or at 8); under ``+ds5`` the launch takes 4 stages (one tile) and
    fits."""
    (capped,) = _attention(
        tmp_path, "c", "--head-dim", "256", "--variant", "plain+pdl+fold+split+ds5"
    )
    (forced,) = _attention(
        tmp_path, "f", "--head-dim", "256", "--variant", "plain+pdl+fold+split", "--stages", "5",
        "--warps", "8",
    )  # fmt: skip
    assert (forced["num_stages"], forced["num_warps"]) == (5, 8)
    assert forced["shared_bytes"] >= 256 * KIB
    assert forced["blocks_per_sm"] == 0
    assert capped["num_stages"] == 4 and 128 * KIB <= capped["shared_bytes"] < 227 * KIB
    assert capped["blocks_per_sm"] >= 1


@needs_toolchain
def test_a_register_cap_on_the_wide_grid_lets_an_sm_hold_more_of_its_programs(tmp_path, compiling):
    """llama-1b at batch 256 (2,048 programs of 2 warps on the wide grid): ``+wr128`` passes
    ``maxnreg`` 128 at launch, and the compiled kernel keeps to it; 128 registers x 64 threads
    is 8,192 a program, so registers allow 8 programs an SM (20 KiB of shared memory allows 10),
    at least as many as without the cap, and the grid takes no more waves."""
    free, capped = _attention(
        tmp_path, "w", "--batch", "256", "--variant", "plain+pdl+fold+split",
        "--variant", "plain+pdl+fold+split+wr128",
    )  # fmt: skip
    assert free["maxnreg"] is None and capped["maxnreg"] == 128
    assert capped["regs"] <= 128 and capped["blocks_per_sm"] == 8
    assert capped["blocks_per_sm"] >= free["blocks_per_sm"] and capped["waves"] <= free["waves"]
    assert capped["waves"] == pytest.approx(256 * 8 / (132 * 8))


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--head-dim", "48"], "--head-dim: '48' is not a power of two in [16, 256]"),
        (["--kernels", "("], "--kernels: '(' is not a regular expression"),
        (["--variant", "plain+turbo"], "--variant: 'plain+turbo': expected MODE"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2_before_anything_runs(tmp_path, args, named):
    import os
    import subprocess

    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "kernel_resources.py"), "--out", str(out), *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and named in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() and proc.stdout == ""
