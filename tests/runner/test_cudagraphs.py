"""CUDA graphs on the GPU: FULL and PIECEWISE replays against the eager forward pass, the same
tokens through a whole randomized workload, and the ``graph_dispatch`` table of real CLI runs.
Dispatch logic without a GPU is tested in test_cudagraph_manager.py."""

from __future__ import annotations

import bisect
import json
from pathlib import Path

import pytest
import torch
from test_async_scheduling import assert_same_tokens, run_drive
from test_run import cli, query

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker.cudagraph_manager import BatchDescriptor
from mrv2_prof.runner.worker.step_inputs import HostStep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
ROOT = Path(__file__).resolve().parents[2]


def graph_engine(**kw) -> Engine:
    config = dict(
        device="cuda",
        kernels="triton",
        cudagraph_mode="full_and_piecewise",
        max_num_seqs=16,
        max_num_batched_tokens=256,
        max_model_len=256,
        num_kv_blocks=512,
        async_scheduling=False,
        uva=False,
        enable_prefix_caching=False,  # the tests count the tokens they schedule
    )
    config.update(kw)
    return Engine(RunnerConfig(**config), ModelSpec(preset="llama-tiny", dtype="float32"))


# Eager and replayed passes on the same kernels, every graph there from start-up (``three_ways``)
SAME_KERNELS = dict(piecewise_capture="startup", rope_in_attention=False)


def next_batch(engine: Engine):
    """Schedule the next step and prepare its inputs, without running it."""
    so = engine.scheduler.schedule()
    r = engine.runner
    r.req_states.begin_step()
    r._update_states(so)
    r.req_states.apply_writes()
    r.block_tables.apply_write()
    return so, r._prepare_inputs(so)


def three_ways(engine: Engine, batch):
    """Logits of one batch: eager, FULL replay (if it dispatches there), PIECEWISE replay."""
    r, model = engine.runner, engine.runner.model
    meta = batch.attn_metadata(engine.config.block_size)
    eager = model.compute_logits(
        model(batch.input_ids, batch.positions, r.kv_caches, meta)[batch.logits_indices]
    )
    d = r.graphs.dispatch(BatchDescriptor.of(batch.num_scheduled_tokens_np))
    full = None
    if d.mode == "full":
        if r.graph_runner.full_step is not None:  # the graph builds the inputs itself
            r.graph_runner.full_step.upload(d.key, HostStep.of(batch), [])
        full = r.graph_runner.replay_full(d.key, batch).clone()
    keys = r.graphs.piecewise_keys
    key = keys[bisect.bisect_left(keys, batch.num_tokens)]
    hidden = r.graph_runner.run_piecewise(key, batch, meta)
    piecewise = model.compute_logits(hidden[batch.logits_indices])
    return d, key, eager, full, piecewise


def assert_close_same_argmax(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def add_decoders(engine: Engine, n: int, tag: str) -> list[str]:
    ids = [f"{tag}{i}" for i in range(n)]
    reqs = [
        engine.add_request(rid, list(range(3 + i, 13 + 2 * i)), SamplingParams(max_tokens=50))
        for i, rid in enumerate(ids)
    ]
    while any(r.num_output_tokens == 0 for r in reqs):  # their prefills (maybe chunked)
        engine.step()
    return ids


def test_full_and_piecewise_replays_equal_eager_logits_at_every_size_fp32():
    """Exactly at a capture size the replays are bit-exact in fp32; padded up to one, they
    agree within 1e-4 and pick the same greedy tokens. Every size is captured at start-up, and
    the RoPE fold is off: a PIECEWISE graph keeps the separate RoPE kernel, which eager decode
    batches would otherwise fold into attention (the same values, rounded differently)."""
    engine = graph_engine(**SAME_KERNELS)
    full_sizes = engine.runner.graphs.plan.full_sizes
    assert full_sizes == (1, 2, 4, 8, 16)
    for size in sorted({*full_sizes, 3, 5, 13}):
        ids = add_decoders(engine, size, f"b{size}-")
        so, batch = next_batch(engine)
        assert batch.num_tokens == batch.num_reqs == size
        d, pw_key, eager, full, piecewise = three_ways(engine, batch)
        assert d.mode == "full" and d.key == min(s for s in full_sizes if s >= size)
        assert d.padded_tokens == d.key
        if size in full_sizes:
            assert torch.equal(full, eager), size
        else:
            assert_close_same_argmax(full, eager)
        if pw_key == size:
            assert torch.equal(piecewise, eager), size
        else:
            assert_close_same_argmax(piecewise, eager)
        for rid in ids:
            engine.abort_request(rid)


def test_piecewise_replays_equal_eager_logits_for_mixed_batches_fp32():
    engine = graph_engine(**SAME_KERNELS)
    for decoders, prompt_len in ((4, 20), (3, 18), (8, 24)):
        ids = add_decoders(engine, decoders, f"m{decoders}-")
        engine.add_request(f"p{decoders}", list(range(40, 40 + prompt_len)), SamplingParams())
        so, batch = next_batch(engine)
        assert batch.num_tokens == decoders + prompt_len
        d, pw_key, eager, full, piecewise = three_ways(engine, batch)
        assert (d.mode, d.reason) == ("piecewise", "mixed prefill/decode batch")
        assert full is None and d.key == pw_key
        if pw_key == batch.num_tokens:
            assert torch.equal(piecewise, eager)
        else:
            assert_close_same_argmax(piecewise, eager)
        for rid in [*ids, f"p{decoders}"]:
            engine.abort_request(rid)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_graph_modes_give_the_eager_tokens_fp32(async_scheduling):
    """A randomized workload with chunked prefill, preemption and aborts: the same greedy and
    seeded tokens whether steps run eagerly, as FULL graphs or as PIECEWISE graphs."""
    common = dict(kernels="triton", async_scheduling=async_scheduling)
    _, eager = run_drive("cuda", "float32", cudagraph_mode="none", **common)
    for mode, full_step in (
        ("full", True),
        ("full", False),
        ("piecewise", True),
        ("full_and_piecewise", True),
    ):
        engine, out = run_drive(
            "cuda", "float32", cudagraph_mode=mode, full_step_graph=full_step, **common
        )
        replays = engine.runner.graphs.replays
        assert sum(replays.values()) > 0, mode
        assert {m for m, _ in replays} <= ({"full", "piecewise"} if "_" in mode else {mode})
        gr = engine.runner.graph_runner
        assert (gr.full_step is not None) == (full_step and mode != "piecewise")
        assert_same_tokens(out, eager)


def run_scenario(tmp_path: Path, name: str, *sets: str) -> tuple[Path, str]:
    db = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}.duckdb"
    args = ["run", str(ROOT / "scenarios" / f"{name}.yaml"), "--headless", "--db", str(db)]
    for s in ("model.preset=llama-tiny", "runner.num_kv_blocks=4096", *sets):
        args += ["--set", s]
    proc = cli(*args, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (run_id,) = query(db, "SELECT run_id FROM runs")[0]
    return db, run_id


DISPATCH = """
SELECT s.num_reqs, s.num_tokens, s.num_prefill_tokens, g.mode, g.hit, g.padded_tokens, g.reason
FROM graph_dispatch g JOIN steps s USING (run_id, step) WHERE run_id = ? ORDER BY step
"""


def test_a_decode_heavy_run_replays_full_graphs_for_every_decode_step(tmp_path):
    db, run_id = run_scenario(
        tmp_path, "decode_heavy", "workload.num_requests=24", "workload.output_len.value=24"
    )
    rows = query(db, DISPATCH, run_id)
    decode = [r for r in rows if r[2] == 0 and r[0] > 0]
    assert len(decode) >= 20
    assert all(r[3] == "full" and r[4] for r in decode), decode[:3]
    assert {r[5] for r in decode} >= {24}  # 24 requests replay the size-24 graph
    assert all(r[5] >= r[0] for r in decode)
    (n, total_s) = query(
        db, "SELECT count(*), sum(capture_s) FROM graph_captures WHERE run_id = ?", run_id
    )[0]
    assert n > 0 and total_s > 0
    info = json.loads(query(db, "SELECT info FROM runs WHERE run_id = ?", run_id)[0][0])
    assert info["capture_s"] > 0 and info["graph_memory_bytes"] > 0
    # decode steps replay the one size-24 graph; every other key was captured for nothing
    assert info["graph_keys_replayed"] >= 1 and info["graph_replays"] >= len(decode)
    assert info["graph_keys_captured"] == info["num_graphs"] > info["graph_keys_replayed"]
    assert 0 < info["unused_capture_s"] <= info["capture_s"]


def test_a_prefill_heavy_run_uses_piecewise_for_mixed_steps_and_none_above(tmp_path):
    db, run_id = run_scenario(
        tmp_path,
        "prefill_heavy",
        "runner.max_num_seqs=256",
        "runner.max_num_batched_tokens=512",
        "workload.num_requests=6",
        "workload.prompt_len.min=600",
        "workload.prompt_len.max=900",
    )
    rows = query(db, DISPATCH, run_id)
    prefill = [r for r in rows if r[2] > 0]
    assert prefill and all(r[3] == "piecewise" and r[4] for r in prefill), prefill[:3]
    assert any(r[6] == "mixed prefill/decode batch" for r in prefill)
    assert all(r[3] == "full" for r in rows if r[2] == 0 and r[0] > 0)

    db, run_id = run_scenario(tmp_path, "prefill_heavy", "workload.num_requests=4")
    rows = query(db, DISPATCH, run_id)
    big = [r for r in rows if r[1] > 128]
    assert big and all(
        r[3] == "none" and not r[4] and r[6] == f"num_tokens {r[1]} > largest capture size 128"
        for r in big
    )


def test_strict_refuses_full_graphs_with_the_torch_attention(tmp_path):
    proc = cli(
        "run",
        str(ROOT / "scenarios" / "decode_heavy.yaml"),
        "--headless",
        "--strict",
        "--db",
        str(tmp_path / "x.duckdb"),
        "--set",
        "model.preset=llama-tiny",
        "--set",
        "runner.kernels=torch",
        "--set",
        "runner.cudagraph_mode=full",
        *("--set", "runner.uva=false"),  # another refusal would come first
        *("--set", "probes.nvtx=false", "--set", "probes.cuda_events=false"),
        *("--set", "probes.sync_finder=false", "--set", "probes.copy_audit=false"),
        *("--set", "probes.nvml_hz=0"),
    )
    assert proc.returncode == 2, proc.stderr
    assert "runner.cudagraph_mode: full needs the Triton attention" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.duckdb").exists()


def test_prompt_logprobs_with_graphs_equal_eager_fp32():
    """Steps with prompt logprobs leave FULL for PIECEWISE (or eager) and give eager's values."""
    prompts = {f"q{i}": list(range(5 + i, 60 + 7 * i)) for i in range(3)}
    out = {}
    for mode in ("none", "full_and_piecewise"):
        engine = graph_engine(cudagraph_mode=mode, max_num_batched_tokens=64)
        reqs = {
            rid: engine.add_request(rid, ids, SamplingParams(max_tokens=4, prompt_logprobs=2))
            for rid, ids in prompts.items()
        }
        while engine.has_unfinished_requests():
            engine.step()
        out[mode] = {rid: r.prompt_logprobs for rid, r in reqs.items()}
        assert all(len(out[mode][rid]) == len(ids) - 1 for rid, ids in prompts.items())
    for rid in prompts:
        for got, want in zip(out["full_and_piecewise"][rid], out["none"][rid], strict=True):
            assert [t for t, _ in got] == [t for t, _ in want]
            assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=1e-5)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_piecewise_graphs_captured_on_first_use_give_the_eager_tokens_fp32(async_scheduling):
    """``runner.piecewise_capture: first_use`` through the randomized workload: each PIECEWISE
    size is captured once, by the step that first needs it (between that step's input build
    and its forward pass), replayed by that step and later ones, and the tokens are the eager
    ones."""
    common = dict(kernels="triton", async_scheduling=async_scheduling)
    _, eager = run_drive("cuda", "float32", cudagraph_mode="none", **common)
    engine, out = run_drive(
        "cuda", "float32", cudagraph_mode="full_and_piecewise", piecewise_capture="first_use",
        **common,
    )  # fmt: skip
    graphs = engine.runner.graphs
    first = [r for r in graphs.captures if r.on_first_use]
    assert first and {r.mode for r in first} == {"piecewise"}
    assert not [r for r in graphs.captures if r.mode == "piecewise" and not r.on_first_use]
    assert len({r.key for r in first}) == len(first)  # each size once
    assert all(graphs.replays.get(r.replay_key, 0) >= 1 for r in first)
    assert_same_tokens(out, eager)


def test_a_first_use_capture_is_recorded_on_its_step(tmp_path):
    """The CLI run: the capture's ``graph_captures`` row carries the step that captured it, that
    step's dispatch reason says so, later steps of the same size replay it with the plain
    reason, and the start-up capture time (``runs.info.capture_s``) holds FULL graphs only."""
    db, run_id = run_scenario(
        tmp_path, "prefill_heavy", "runner.max_num_seqs=256", "runner.max_num_batched_tokens=512",
        "workload.num_requests=6", "workload.prompt_len.min=600", "workload.prompt_len.max=900",
        "runner.piecewise_capture=first_use",
    )  # fmt: skip
    captures = query(
        db, "SELECT key, mode, step, capture_s FROM graph_captures WHERE run_id = ?", run_id
    )
    first = [c for c in captures if c[2] >= 0]
    assert first and all(c[1] == "piecewise" for c in first)
    assert all(c[1] == "full" for c in captures if c[2] < 0)
    rows = query(
        db, "SELECT step, mode, padded_tokens, reason FROM graph_dispatch WHERE run_id = ? "
        "ORDER BY step", run_id,
    )  # fmt: skip
    by_step = {r[0]: r for r in rows}
    for key, _, step, _ in first:
        size = int(key.split(":")[1])
        assert by_step[step][1:3] == ("piecewise", size)
        assert by_step[step][3].endswith(f"PIECEWISE {size} captured on first use, this step")
        later = [r for r in rows if r[0] > step and r[1] == "piecewise" and r[2] == size]
        assert all("first use" not in r[3] for r in later)
    info = json.loads(query(db, "SELECT info FROM runs WHERE run_id = ?", run_id)[0][0])
    startup = sum(c[3] for c in captures if c[2] < 0)
    assert info["capture_s"] >= startup > 0
