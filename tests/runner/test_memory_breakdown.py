"""The start-up memory breakdown (runner/worker/memory_breakdown.py): its arithmetic on
hand-made figures, the pools read from graphs and the allocator's segments, the weights counted
once; on the GPU (``-m gpu``) each graph pool's bytes against the allocator snapshot's own sum
of that pool's segments."""

from __future__ import annotations

import json

import duckdb
import pytest
import torch

from mrv2_prof.runner.worker.memory_breakdown import (
    CPU_NOTE,
    account,
    graph_pools,
    memory_breakdown,
    pool_segment_bytes,
    weight_bytes,
)
from mrv2_prof.views.memory_line import memory_line, memory_rows

GiB = 2**30
MiB = 2**20


def _figures(**changes):
    figures = dict(
        total=80 * GiB,
        free=10 * GiB,
        torch_reserved=66 * GiB,
        weights=16 * GiB,
        kv_cache=40 * GiB,
        activation_peak=3 * GiB,
        pools={(0, 1): (["full:8", "full:4", "piecewise:8"], 600 * MiB)},
        key_growth={"full:8": 400 * MiB, "full:4": 100 * MiB, "piecewise:8": 100 * MiB},
        pinned_host=64 * MiB,
    )
    return account(**(figures | changes))


def test_the_breakdown_adds_up():
    m = _figures()
    assert m["graph_bytes"] == 600 * MiB
    assert m["other_torch_bytes"] == 66 * GiB - 16 * GiB - 40 * GiB - 600 * MiB
    assert m["non_torch_bytes"] == (80 - 10 - 66) * GiB
    # every byte the device uses is in one part (the activation peak was freed: not a part)
    parts = ("weights_bytes", "kv_cache_bytes", "graph_bytes", "other_torch_bytes")
    assert sum(m[p] for p in parts) + m["non_torch_bytes"] + m["free_bytes"] == m["total_bytes"]
    assert m["activation_peak_bytes"] == 3 * GiB and m["pinned_host_bytes"] == 64 * MiB
    assert m["shared_pool"] is True
    assert m["graph_pools"] == [
        {"pool": "0,1", "keys": ["full:8", "full:4", "piecewise:8"], "bytes": 600 * MiB}
    ]
    assert m["key_growth_bytes"]["full:8"] == 400 * MiB
    json.dumps(m)  # stored in runs.info as it is


def test_pools_of_one_key_each_are_not_shared_and_largest_come_first():
    m = _figures(pools={(0, 1): (["full:8"], 10 * MiB), (0, 2): (["draft:8xk2"], 30 * MiB)})
    assert m["shared_pool"] is False
    assert [p["pool"] for p in m["graph_pools"]] == ["0,2", "0,1"]
    assert m["graph_bytes"] == 40 * MiB


def test_no_graphs_and_no_profiling_run():
    m = _figures(pools={}, key_growth=None, activation_peak=None)
    assert m["graph_bytes"] == 0 and m["graph_pools"] == [] and not m["shared_pool"]
    assert m["activation_peak_bytes"] is None
    assert m["other_torch_bytes"] == 10 * GiB


def test_segments_are_summed_per_pool_on_their_device():
    segments = [
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 2 * MiB},
        {"device": 0, "segment_pool_id": (0, 1), "total_size": 20 * MiB},
        {"device": 0, "segment_pool_id": (0, 1), "total_size": 4 * MiB},
        {"device": 1, "segment_pool_id": (0, 1), "total_size": 99 * MiB},
    ]
    assert pool_segment_bytes(segments, 0) == {(0, 0): 2 * MiB, (0, 1): 24 * MiB}


class _Graph:
    def __init__(self, pool):
        self._pool = pool

    def pool(self):
        return self._pool


def test_every_captured_graph_is_found_with_its_key():
    class GR:
        full_graphs = {8: _Graph((0, 1)), (4, 3): _Graph((0, 1))}
        sample_graphs = {8: _Graph((0, 1))}
        piece_graphs = {16: [_Graph((0, 1)), _Graph((0, 1))]}

    class Draft:
        graphs = {(8, 2, True, 0): _Graph((0, 2)), (8, 2, False, 3): _Graph((0, 2))}

    class Drafter:
        graphs = Draft()

    class Runner:
        graph_runner = GR()
        drafter = Drafter()

    found = list(graph_pools(Runner()))
    assert sorted(set(found)) == sorted({
        ("full:8", (0, 1)), ("full:4x3", (0, 1)), ("piecewise:16", (0, 1)),
        ("draft:8xk2:sampled", (0, 2)), ("draft:8xk2:q3", (0, 2)),
    })  # fmt: skip


def test_weights_shared_between_two_models_count_once():
    a = torch.nn.Linear(4, 4, bias=False)
    b = torch.nn.Module()
    b.shared = a.weight  # a draft model made of the target's own layers
    b.own = torch.nn.Parameter(torch.zeros(8))
    assert weight_bytes([a, b]) == (16 + 8) * 4


def test_a_cpu_runner_gets_a_note():
    class Runner:
        is_cuda = False

    assert memory_breakdown(Runner()) == {"note": CPU_NOTE}


def test_the_memory_line_names_every_part():
    line = memory_line(_figures())
    assert line == (
        "weights 16.0 GiB, KV cache 40.0 GiB, activations 3.0 GiB, graphs 600.0 MiB in 1 pool "
        "shared by 3 keys, non-torch 4.0 GiB, free 10.0 GiB of 80.0 GiB"
    )
    assert "activations not profiled" in memory_line(_figures(activation_peak=None))
    assert memory_line({"note": CPU_NOTE}) is None and memory_line(None) is None
    rows = memory_rows({"memory": _figures(), "memory_history_file": "/d/m.pickle"})
    assert [k for k, _ in rows] == ["memory", "memory history"]
    assert memory_rows({"memory": {"note": CPU_NOTE}}) == []


def _info(job) -> dict:
    with duckdb.connect(job.db_path, read_only=True) as con:
        return json.loads(con.execute("SELECT info FROM runs").fetchone()[0])


def test_a_cpu_run_stores_the_note(run_in_process):
    job, _ = run_in_process()
    assert _info(job)["memory"] == {"note": CPU_NOTE}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_pool_bytes_are_the_allocators_own(run_in_process):
    """A run with FULL and PIECEWISE graphs: each pool's bytes equal the snapshot's sum of that
    pool's segments, taken here from the same runner after start-up."""
    from mrv2_prof.probes.api import Probe
    from mrv2_prof.runner.config import ModelSpec, RunnerConfig
    from mrv2_prof.runner.engine import Engine

    config = RunnerConfig(
        device="cuda", kernels="triton", max_model_len=512, cudagraph_mode="full_and_piecewise",
        cudagraph_capture_sizes=(1, 8, 32), num_kv_blocks=256,
    )  # fmt: skip
    engine = Engine(config, ModelSpec(preset="llama-tiny"), Probe())
    m = engine.runner.info.memory
    own: dict[str, int] = {}
    for seg in torch.cuda.memory_snapshot():
        pool = ",".join(str(x) for x in seg["segment_pool_id"])
        own[pool] = own.get(pool, 0) + seg["total_size"]
    print(json.dumps({p["pool"]: p["bytes"] for p in m["graph_pools"]}), json.dumps(own))
    assert m["graph_pools"], m
    for p in m["graph_pools"]:
        assert p["bytes"] == own[p["pool"]] > 0, p
    keys = {k for p in m["graph_pools"] for k in p["keys"]}
    assert keys == {r.key for r in engine.runner.graphs.captures}
    assert m["shared_pool"] and len(m["graph_pools"]) == 1  # the runner's keys share one pool
    assert m["weights_bytes"] > 0 and m["kv_cache_bytes"] == engine.runner.info.kv_cache_bytes
    assert m["non_torch_bytes"] > 0  # the CUDA context at least
    line = memory_line(m)
    assert line is not None and "in 1 pool shared by" in line
    job, _ = run_in_process("runner.device=cuda")
    assert "graph_pools" in _info(job)["memory"]
