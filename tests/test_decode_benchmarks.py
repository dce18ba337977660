"""The decode benchmarks (``benchmarks/decode_roofline.py``, ``benchmarks/peer_transformers.py``)
run end to end on the CPU in their smoke modes, and the roofline's kernel count puts each kernel
with the launch that made it."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from tests.benchmark_runs import BENCHMARKS, load_benchmark, run_benchmark


def smoke_run(name: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    return run_benchmark(f"{name}.py", out, "--cpu-smoke", *args, timeout=300).data


def test_kernels_are_counted_by_their_launch(tmp_path, monkeypatch):
    roofline = load_benchmark("decode_roofline", monkeypatch)

    def launch(name, corr):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "args": {"correlation": corr}}

    def kernel(name, corr, dur, cat="kernel", ts=0.0):
        return {"ph": "X", "cat": cat, "name": name, "dur": dur, "ts": ts,
                "args": {"correlation": corr}}  # fmt: skip

    events = [
        launch("cudaGraphLaunch", 1),
        launch("cudaGraphLaunch", 2),
        launch("cuLaunchKernel", 3),
        launch("cudaMemcpyAsync", 4),
        # replay 1: gemm 100-110, rmsnorm 113-115, gemm 114-124 (overlaps: no gap) -> 3 µs idle
        kernel("gemm", 1, 10.0, ts=100.0),
        kernel("rmsnorm", 1, 2.0, ts=113.0),
        kernel("gemm", 1, 10.0, ts=114.0),
        # replay 2, listed out of order: gemm 500-510, gemm 511-521, rmsnorm 525-527 -> 5 µs
        kernel("rmsnorm", 2, 2.0, ts=525.0),
        kernel("gemm", 2, 10.0, ts=511.0),
        kernel("gemm", 2, 10.0, ts=500.0),
        kernel("sample", 3, 5.0, ts=530.0),  # eager: after replay 2, not one of its gaps
        kernel("copy", 4, 1.0, cat="gpu_memcpy"),
        kernel("gemm", 99, 10.0),  # launched before the window opened
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = roofline.count_kernels(str(path), steps=2)
    assert got["graph_kernels_per_step"] == 3 and got["eager_kernels_per_step"] == 0.5
    assert got["memcpy_per_step"] == 0.5 and got["launched_before_window"] == 1
    # a replay's kernels count their own time: replay 1's second gemm starts under rmsnorm
    # (114 < 115), so 1 µs of its 10 is rmsnorm's, not counted twice
    assert got["kernel_us_per_step"] == (40 - 1 + 4 + 5) / 2
    assert got["graph_gap_us_per_step"] == (3 + 5) / 2
    assert [k["kernel"] for k in got["top_kernels"]] == ["gemm", "sample", "rmsnorm"]
    assert got["top_kernels"][0] == {"kernel": "gemm", "us_per_step": 19.5, "calls_per_step": 2.0}


def test_decode_roofline_cpu_smoke(tmp_path):
    data = smoke_run("decode_roofline", tmp_path)
    rows = data["results"]
    assert [r["batch"] for r in rows] == [1, 4] and data["meta"]["read_bytes_per_s"] > 0
    for r in rows:
        assert r["preset"] == "llama-tiny" and r["tpot_ms"] > 0 and r["timed_steps"] > 0
        assert r["step_bytes"] == r["weight_bytes"] + r["kv_bytes"] and r["kv_bytes"] > 0
        assert 0 < r["utilisation"] < 1
    assert rows[1]["kv_bytes"] == 4 * rows[0]["kv_bytes"]  # the same context length


@pytest.mark.slow
@pytest.mark.parametrize("padded", [False, True], ids=["generate_batch", "padded"])
def test_peer_transformers_cpu_smoke(tmp_path, padded):
    data = smoke_run("peer_transformers", tmp_path, *(["--hf-padded"] if padded else []))
    (row,) = data["results"]
    ours, hf = row["ours"], row["hf"]
    assert row["preset"] == "llama-tiny" and hf["transformers"]
    assert ours["decode_tokens"] == hf["decode_tokens"] == 8
    assert ours["batch_tokens"] == hf["batch_tokens"] == 4 * 8
    assert ours["decode_tpot_ms"] > 0 and hf["decode_tpot_ms"] > 0
    assert row["batch_tok_s_ratio"] == ours["batch_tok_s"] / hf["batch_tok_s"]
    assert hf["batch_api"] == ("padded generate" if padded else "generate_batch")


@pytest.mark.parametrize("batch", [1, 8])
def test_the_tools_step_bytes_equal_the_benchmarks(batch, monkeypatch):
    """The per-step roofline (runner/model/step_cost.py, analysis/roofline.py) counts a decode
    step's weight and KV bytes as benchmarks/decode_roofline.py does; it adds only the logits
    rows the step writes."""
    import numpy as np

    from mrv2_prof.analysis.roofline import step_figures
    from mrv2_prof.runner.config import ModelSpec, RunnerConfig
    from mrv2_prof.runner.engine import Engine

    roofline = load_benchmark("decode_roofline", monkeypatch)
    engine = Engine(RunnerConfig(max_model_len=512), ModelSpec(preset="llama-tiny"))
    weights, kv = roofline.step_bytes(engine, batch, context_len=100.0)
    cost = engine.info.step_cost
    # steps row as analysis/roofline.py selects it: step, reqs, tokens, prefill, drafts, context,
    # pairs, GPU ns (a decode step: one token per request, 100 tokens of context each)
    row = np.array([[0, batch, batch, 0, 0, 100 * batch, 100 * batch, 1e6]])
    ours = step_figures(row, cost, {"hbm_read_bytes_per_s": 1e12})
    assert ours.bytes[0] == weights + kv + batch * cost["logits_bytes_per_row"]


@pytest.mark.parametrize(
    ("script", "says"),
    [("gemv.py", "gemv_triton matches gemv_ref"),
     ("gemv_pipeline.py", "the pipelined gemv_triton matches gemv_ref with each decode launch"),
     ("decode_gemm.py", "gemm_decode_triton matches gemm_decode_ref"),
     ("grid_barrier.py", "both sides match torch's W x over 1 program(s), counters reset"),
     ("mlp_decode.py", "the fused MLP equals its reference")],
)  # fmt: skip
def test_kernel_benchmarks_cpu_smoke(script, says):
    """The GEMV (its walk unpipelined and pipelined), decode-GEMM and grid-barrier benchmarks'
    smoke modes: each kernel against its reference at tiny shapes in the interpreter, as the GPU
    run would time them."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--cpu-smoke"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert says in proc.stdout


def test_each_op_of_the_forward_replays_is_timed_and_set_against_its_roof(monkeypatch):
    """Two FULL replays of a one-layer forward and one sampling replay (left out: not the
    forward's pattern): each op's launches and µs per step, then its bytes per step from the
    op's cost, the roof's bound at 1 GB/s and the time to gain, most first."""
    trace = load_benchmark("decode_trace", monkeypatch)
    layer = [("_rmsnorm_kernel", 2.0), ("_gemv_kernel", 10.0), ("_paged_decode_rope_kernel", 4.0),
             ("_gemv_kernel", 6.0), ("_rmsnorm_kernel", 2.0), ("nvjet_gate_up", 12.0),
             ("_silu_and_mul_kernel", 1.0), ("_gemv_kernel", 8.0)]  # fmt: skip
    forward = [*layer, ("_rmsnorm_kernel", 1.0), ("nvjet_lm_head", 20.0)]
    events = []
    for corr, t0 in ((1, 0.0), (2, 1000.0), (3, 2000.0)):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch",
                       "args": {"correlation": corr}})  # fmt: skip
        kernels = forward if corr < 3 else [("_gumbel_argmax_kernel", 3.0)]
        t = t0
        for name, dur in kernels:
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur,
                           "args": {"correlation": corr}})  # fmt: skip
            t += dur + 1.0
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"traceEvents": events}, f)
    got = trace.count_kernels(f.name, steps=2, layers=1)
    ops = got["ops_per_step"]
    assert ops["qkv"] == {"launches": 1, "us": 10.0} and ops["attention"] == {
        "launches": 1,
        "us": 4.0,
    }
    assert ops["norm"] == {"launches": 2, "us": 3.0}  # the input norm and the final one
    assert ops["add_norm"]["us"] == 2.0 and "other" not in ops
    assert ops["lm_head"] == {"launches": 1, "us": 20.0}
    cost = {"qkv": {"weight_bytes": 6000}, "lm_head": {"weight_bytes": 4000, "bytes_per_row": 500}}
    roofs = trace.op_roofs(ops, cost, (2, 2, 10, 10), bandwidth=1e9, peak=None)
    # qkv: 6000 B at 1 GB/s = 6 µs of 10 (4 to gain); lm_head: 5000 B = 5 µs of 20 (15)
    assert [(r["op"], r["roof_us"], r["to_gain_us"]) for r in roofs] == [
        ("lm_head", 5.0, 15.0),
        ("qkv", 6.0, 4.0),
    ]
    assert roofs[1]["of_roof"] == 0.6
    # launch-bound under 2 µs of work a launch at the roof: 5 and 6 µs are not; two norms of
    # 100 B each are (0.1 µs a launch at 1 GB/s)
    assert [r["launch_bound"] for r in roofs] == [False, False]
    cost["norm"] = {"weight_bytes": 100}
    roofs = trace.op_roofs(ops, cost, (2, 2, 10, 10), bandwidth=1e9, peak=None)
    assert {r["op"]: r["launch_bound"] for r in roofs}["norm"] is True


def test_an_op_launched_early_under_pdl_counts_its_own_time(monkeypatch, tmp_path):
    """One replay where the o projection's GEMV starts 5 µs into attention's 8 (programmatic
    dependent launch) and ends 6 µs after it: o's time per step is those 6 µs, attention's its 8,
    and the in-graph gaps are the one 1 µs gap after o."""
    trace = load_benchmark("decode_trace", monkeypatch)
    spans = [("_rmsnorm_kernel", 0.0, 2.0), ("_gemv_kernel", 2.0, 10.0),
             ("_paged_decode_rope_kernel", 10.0, 18.0), ("_gemv_kernel", 15.0, 24.0),
             ("_rmsnorm_kernel", 25.0, 27.0), ("nvjet_gate_up", 27.0, 30.0),
             ("_silu_and_mul_kernel", 30.0, 31.0), ("_gemv_kernel", 31.0, 33.0),
             ("_rmsnorm_kernel", 33.0, 34.0), ("nvjet_lm_head", 34.0, 40.0)]  # fmt: skip
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch",
               "args": {"correlation": 1}}]  # fmt: skip
    events += [{"ph": "X", "cat": "kernel", "name": n, "ts": a, "dur": b - a,
                "args": {"correlation": 1}} for n, a, b in spans]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = trace.count_kernels(str(path), steps=1, layers=1)
    ops = got["ops_per_step"]
    assert ops["o"] == {"launches": 1, "us": 6.0} and ops["attention"]["us"] == 8.0
    assert sum(o["us"] for o in ops.values()) == 40.0 - 1.0  # the replay's busy time
    assert got["graph_gap_us_per_step"] == 1.0


def test_a_variant_names_its_paths_and_split_switches(monkeypatch):
    """``decode_roofline.py --variant``: the extras in a fixed order whatever the spelling's;
    ``split`` the policy, ``splitN`` N forced splits, ``minkN`` split-KV's fewest keys a split
    (N >= 1), ``keysN`` the decode kernels' key tile (a power of two >= 16), ``siluwN`` the
    batch-1 SiLU-and-mul GEMV's warps (a power of two to 16), ``wwN`` / ``wsN`` the wide decode
    grid's warps / stages (1, 2, 4 or 8), ``wrN`` its register cap (64-168), ``lsN`` / ``bkN``
    the batch-1 GEMV's loop stages (2-6) / step of K (a power of two, 256-4,096); anything else
    refused, naming the text."""
    roofline = load_benchmark("decode_roofline", monkeypatch)
    mode, extras = roofline.parse_variant("plain+split4+fold+pdl")
    assert (mode, extras) == ("plain", ("pdl", "fold", "split4"))
    assert roofline.split_switches(extras) == (True, 4)
    assert roofline.split_switches(roofline.parse_variant("fused_onepass+split")[1]) == (True, None)
    assert roofline.split_switches(("pdl", "gemm")) == (False, None)
    assert roofline.parse_variant("plain+keys64+fold")[1] == ("fold", "keys64")
    extras = roofline.parse_variant("plain+keys64+mink256+split")[1]
    assert extras == ("split", "mink256", "keys64")
    assert roofline.extra_int(extras, "mink", 0) == 256
    assert roofline.extra_int(extras, "keys", 128) == 64
    assert roofline.extra_int(("pdl",), "mink", 7) == 7
    extras = roofline.parse_variant("fused_onepass+siluw4+pdl")[1]
    assert extras == ("pdl", "siluw4") and roofline.extra_int(extras, "siluw", 8) == 4
    extras = roofline.parse_variant("plain+wr96+ws2+fold+ww8")[1]
    assert extras == ("fold", "ww8", "ws2", "wr96") and roofline.extra_int(extras, "ws", 3) == 2
    assert roofline.extra_int(extras, "wr", None) == 96
    assert roofline.extra_int(extras, "ww", 4) == 8
    extras = roofline.parse_variant("plain+bk2048+ls3+pdl")[1]
    assert extras == ("pdl", "ls3", "bk2048") and roofline.extra_int(extras, "ls", 0) == 3
    assert roofline.extra_int(extras, "bk", 1024) == 2048
    mode, extras = roofline.parse_variant("fused_onepass+mlp+pdl")  # a runner setting
    assert extras == ("pdl", "mlp") and roofline.variant_paths(mode, extras)["fused_mlp"] is True
    assert roofline.variant_paths("plain", ("pdl",))["fused_mlp"] is False
    mode, extras = roofline.parse_variant("plain+narrow64+pdl")
    assert extras == ("pdl", "narrow64")
    assert roofline.variant_paths(mode, extras)["decode_gemm"] == "narrow"
    assert roofline.variant_paths(mode, ("gemm",))["decode_gemm"] == "triton"
    assert roofline.variant_paths("plain", ("pdl",))["decode_gemm"] == "cublas"  # never auto
    extras = roofline.parse_variant("plain+ms64+narrow+pdl")[1]  # a module switch, not a path
    assert extras == ("pdl", "narrow", "ms64") and roofline.extra_int(extras, "ms", 2) == 64
    for bad in ("plain+split0", "plain+splitx", "plain+turbo", "fast+pdl", "plain+keys48",
                "plain+keys8", "plain+mink0", "plain+minkx", "plain+siluw3",
                "plain+siluw", "plain+ww3", "plain+ws", "plain+ws7", "plain+ls1",
                "plain+ls", "plain+bk100", "plain+bk", "plain+ds", "plain+ds7", "plain+wr",
                "plain+wr100", "plain+narrow0", "plain+narrowx", "plain+gemm64", "plain+ms",
                "plain+ms0", "plain+ms65", "plain+msx", "plain+gv", "plain+gv0", "plain+gv5",
                "plain+oan+xoan"):  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(bad))):
            roofline.parse_variant(bad)


def test_a_variants_module_switches_hold_inside_the_block_and_are_restored_after(monkeypatch):
    """``variant_switches``, shared by ``decode_roofline.py`` and ``kernel_stalls.py``: each
    switch a variant names set in the block, every one back to its value after, an error in the
    block included."""
    roofline = load_benchmark("decode_roofline", monkeypatch)
    from mrv2_prof.runner.model import attention_split_kv_triton as split
    from mrv2_prof.runner.model import attention_triton as attn
    from mrv2_prof.runner.model import gemm_decode_triton as gemm
    from mrv2_prof.runner.model import gemv_triton as gemv
    from mrv2_prof.runner.model import projections_triton as proj

    names = [(split, "FORCED_SPLITS"), (attn, "DECODE_KEYS"), (attn, "WIDE_DECODE_KEYS"),
             (split, "MIN_CHUNK_KEYS"), (gemv, "SILU_MUL_WARPS"), (gemv, "GEMV_ROWS"),
             (gemv, "LOOP_STAGES"),
             (gemv, "M1_BLOCK_K"), (attn, "WIDE_DECODE_WARPS"),
             (attn, "WIDE_DECODE_STAGES"), (attn, "DECODE_STAGES"),
             (attn, "WIDE_DECODE_MAXNREG"), (proj, "NARROW_GEMM"),
             (gemm, "LAST_SPLIT_REDUCES"), (gemm, "MIN_STEPS_PER_SPLIT"),
             (proj, "DOWN_SILU_MUL"), (proj, "O_ADD_NORM"), (proj, "DOWN_ADD_NORM")]  # fmt: skip
    before = [getattr(m, n) for m, n in names]
    variant = "plain+split3+keys32+mink96+siluw2+gv3+ls4+bk512+ww8+ws1+ds5+wr128"
    variant += "+narrow64+lastred+ms9+gsilu+oan+dan"
    extras = roofline.parse_variant(variant)[1]
    with pytest.raises(RuntimeError, match="in the block"), roofline.variant_switches(extras):
        narrow = (1024, ((2, 64),))
        want = [3, 32, 32, 96, 2, 3, 4, 512, 8, 1, 5, 128, narrow, True, 9, True, True, True]
        assert [getattr(m, n) for m, n in names] == want
        raise RuntimeError("in the block")
    assert [getattr(m, n) for m, n in names] == before
    with roofline.variant_switches(("pdl",)):  # named nothing: every switch as it was
        assert [getattr(m, n) for m, n in names] == before
    with pytest.raises(argparse.ArgumentTypeError):
        roofline.parse_variant("plain+narrow+oan+xoan")  # on and off at once
    for default in (False, True):  # xoan: the o add + norm off whatever the default
        with monkeypatch.context() as m:
            m.setattr(proj, "O_ADD_NORM", default)
            with roofline.variant_switches(roofline.parse_variant("plain+narrow+xoan")[1]):
                assert proj.O_ADD_NORM is False
            with roofline.variant_switches(roofline.parse_variant("plain+narrow+oan")[1]):
                assert proj.O_ADD_NORM is True
            assert proj.O_ADD_NORM is default


def test_the_tile_benchmark_reads_each_key_once_and_times_distinct_caches(monkeypatch):
    """``decode_attention_tiles.py``: a batch's KV bytes are every cached key's k and v once
    (hand-worked), and its cold copies are the same values in caches of their own."""
    import torch

    from tests.runner.attention_batches import make_batch

    tiles = load_benchmark("decode_attention_tiles", monkeypatch)
    batch = make_batch([(40, 1), (7, 1)], 2, 4, 32, 16, torch.bfloat16)
    assert tiles.kv_bytes(batch) == 2 * (41 + 8) * 2 * 32 * 2  # k and v, 49 keys, 2 heads, bf16
    copies = tiles.copies_of(batch, 3)
    ptrs = {c.kv_cache.data_ptr() for c in copies} | {batch.kv_cache.data_ptr()}
    assert len(ptrs) == 4
    assert all(torch.equal(c.kv_cache, batch.kv_cache) and c.meta is batch.meta for c in copies)
