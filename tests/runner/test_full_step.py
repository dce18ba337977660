"""The FULL decode step with its input build and sampling on the graph side (``full_step.py``).

On the CPU the Triton kernels run in the interpreter and the "graphs" are their bodies called
eagerly at replay (a stand-in for ``torch.cuda.graph``): a run through the full-step path, with
its padded static step buffer, padding rows that write nothing and the eager fallback for top-k
rows, gives the same tokens as the same engine without graphs. The kernels' new variants are
compared with their torch references on seeded inputs.
"""

from __future__ import annotations

import pytest
import torch
from test_triton_launch import interpreted_triton_engine

from mrv2_prof.runner.worker.input_batch import pad_decode_rows_ref, prepare_inputs_ref
from mrv2_prof.runner.worker.step_advance import advance_state_ref

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the interpreter runs only without CUDA"
)


def test_padded_input_build_equals_the_reference_with_padding_rows():
    from mrv2_prof.runner.worker.input_batch_triton import prepare_inputs_triton

    g = torch.Generator().manual_seed(3)
    slots, size, n, bs, max_len, blocks = 8, 8, 5, 4, 32, 8
    idx = torch.zeros(size, dtype=torch.int32)
    idx[:n] = torch.randperm(slots, generator=g)[:n].to(torch.int32)
    counts = torch.zeros(size, dtype=torch.int32)
    counts[:n] = 1
    computed = torch.randint(0, 20, (slots,), generator=g, dtype=torch.int32)
    prefill = torch.randint(0, 24, (slots,), generator=g, dtype=torch.int32)
    prompt = torch.randint(0, 1000, (slots, max_len), generator=g, dtype=torch.int32)
    last = torch.randint(0, 1000, (slots,), generator=g, dtype=torch.int64)
    table = torch.randint(0, 50, (slots, blocks), generator=g, dtype=torch.int32)

    def out():
        return {
            "input_ids": torch.full((size,), 7, dtype=torch.int64),
            "positions": torch.full((size,), 7, dtype=torch.int64),
            "slot_mapping": torch.full((size,), 7, dtype=torch.int64),
            "query_start_loc": torch.zeros(size + 1, dtype=torch.int32),
            "seq_lens": torch.zeros(size, dtype=torch.int32),
            "logits_indices": torch.zeros(size, dtype=torch.int64),
            "block_table": torch.zeros((size, blocks), dtype=torch.int32),
        }

    args = (computed, prefill, prompt, last, table, bs)
    got = prepare_inputs_triton(idx, counts, size, *args, out=out(), pad_empty=True)
    want = out()
    views = {k: v[:n] if k in ("input_ids", "positions", "slot_mapping") else v
             for k, v in want.items()}  # fmt: skip
    prepare_inputs_ref(idx, counts, n, *args, out=views)  # the n real tokens
    pad_decode_rows_ref(want, counts)
    for name in ("input_ids", "positions", "slot_mapping", "seq_lens", "block_table"):
        assert torch.equal(got[name], want[name]), name
    # the padding by hand: no KV slot, one-token context, rows after the real ones
    assert got["slot_mapping"][n:].tolist() == [-1] * (size - n)
    assert got["seq_lens"][n:].tolist() == [1] * (size - n)
    assert got["input_ids"][n:].tolist() == [0] * (size - n)
    assert (got["slot_mapping"][:n] >= 0).all()


@pytest.mark.parametrize("with_advance", [True, False])
def test_advance_skips_padding_rows_like_the_reference(with_advance):
    from mrv2_prof.runner.worker.step_advance_triton import advance_state_triton

    g = torch.Generator().manual_seed(5)
    slots, size, n = 10, 8, 3
    idx = torch.zeros(size, dtype=torch.int32)  # padding rows all point at slot 0
    idx[:n] = torch.tensor([4, 0, 7], dtype=torch.int32)
    counts = torch.zeros(size, dtype=torch.int32)
    counts[:n] = 1
    sampled = torch.randint(0, 1000, (size,), generator=g, dtype=torch.int64)
    last0 = torch.randint(0, 1000, (slots,), generator=g, dtype=torch.int64)
    done0 = torch.randint(0, 50, (slots,), generator=g, dtype=torch.int32)
    results = []
    for fn in (advance_state_triton, advance_state_ref):
        last, done = last0.clone(), done0.clone()
        fn(
            last,
            done if with_advance else None,
            idx,
            sampled,
            counts if with_advance else None,
            counts,
        )
        results.append((last, done))
    (last_t, done_t), (last_r, done_r) = results
    assert torch.equal(last_t, last_r) and torch.equal(done_t, done_r)
    want_last, want_done = last0.clone(), done0.clone()  # by hand: only the three real rows
    for row, slot in enumerate([4, 0, 7]):
        want_last[slot] = sampled[row]
        want_done[slot] += 1 if with_advance else 0
    assert torch.equal(last_t, want_last) and torch.equal(done_t, want_done)


class _EagerGraph:
    """A captured graph's stand-in on the CPU: replay calls the body."""

    def __init__(self, body):
        self.replay = body


def _engine(monkeypatch, graphs: bool, full_step: bool, async_scheduling: bool):
    import mrv2_prof.runner.worker.model_runner as model_runner
    from mrv2_prof.runner.worker import cudagraph_runner
    from mrv2_prof.runner.worker.cudagraph_plan import GraphPlan

    if graphs:
        plan = GraphPlan("full", full_sizes=(1, 4))
        monkeypatch.setattr(model_runner, "plan_graphs", lambda *a: plan)
        monkeypatch.setattr(cudagraph_runner, "_capture", lambda body, pool: _EagerGraph(body))
        for name, value in (("new_pool", None), ("memory_reserved", 0), ("synchronize", None)):
            monkeypatch.setattr(cudagraph_runner.GraphRunner, name, lambda self, v=value: v)
    return interpreted_triton_engine(
        monkeypatch,
        num_kv_blocks=24,
        block_size=4,  # decode steps cross into new KV blocks: the graph writes the table
        async_scheduling=async_scheduling,
        full_step_graph=full_step,
    )


def _run(engine) -> dict[str, list[int]]:
    from mrv2_prof.runner.core.request import SamplingParams

    params = [  # greedy, sampled, top-k (eager sampling after the graph), different lengths
        SamplingParams(max_tokens=6),
        SamplingParams(max_tokens=4, temperature=0.8, seed=11),
        SamplingParams(max_tokens=3, temperature=1.0, seed=12),
        SamplingParams(max_tokens=2, temperature=0.9, top_k=5, seed=13),
    ]
    requests = [
        engine.add_request(f"r{i}", list(range(3 + i, 12 + 2 * i)), p) for i, p in enumerate(params)
    ]
    while engine.has_unfinished_requests():
        engine.step()
    return {r.request_id: list(r.output_token_ids) for r in requests}


@pytest.mark.parametrize("async_scheduling", [True])
def test_full_step_path_gives_the_tokens_of_the_eager_engine(monkeypatch, async_scheduling):
    eager = _run(_engine(monkeypatch, False, False, async_scheduling))
    monkeypatch.undo()
    engine = _engine(monkeypatch, True, True, async_scheduling)
    fs = engine.runner.graph_runner.full_step
    assert fs is not None and sorted(engine.runner.graph_runner.sample_graphs) == [1, 4]
    replays = []
    sample = engine.runner.graph_runner.replay_sample
    engine.runner.graph_runner.replay_sample = lambda size, n: (
        replays.append((size, n)) or sample(size, n)
    )
    got = _run(engine)
    assert got == eager
    assert {len(t) for t in got.values()} == {6, 4, 3, 2}
    # the sample graph ran with padding (3 requests in the size-4 graph, once the top-k request
    # is out) and was skipped while the top-k request ran (its steps sample eagerly)
    assert (4, 3) in replays
    assert fs.steps_with_appends > 0  # block-table entries written by the inputs graph
    full_4 = engine.runner.graphs.replays.get(("full", 4), 0)
    assert full_4 > sum(1 for size, _ in replays if size == 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_cuda_full_step_graphs_give_the_tokens_of_plain_full_graphs(async_scheduling):
    """Real graphs, UVA parameters (their pinned buffers rotate as requests arrive): plain
    seeded and greedy requests arriving over the run, then a top-k one, give the same tokens
    with the input build and sampling in the graphs as without; the sample graphs replay."""
    from mrv2_prof.runner.config import ModelSpec, RunnerConfig
    from mrv2_prof.runner.core.request import SamplingParams
    from mrv2_prof.runner.engine import Engine

    outs = []
    for full_step in (False, True):
        config = RunnerConfig(
            device="cuda", kernels="triton", cudagraph_mode="full_and_piecewise",
            max_num_seqs=16, max_num_batched_tokens=256, max_model_len=256, num_kv_blocks=512,
            async_scheduling=async_scheduling, uva=True, full_step_graph=full_step,
        )  # fmt: skip
        engine = Engine(config, ModelSpec(preset="llama-tiny", dtype="float32"))
        gr = engine.runner.graph_runner
        assert (gr.full_step is not None) == full_step
        requests, step = [], 0
        while step < 400 and (step < 40 or engine.has_unfinished_requests()):
            if step % 4 == 0 and step < 40:  # arrivals: batch sizes 1..10 (padding), new params
                i = len(requests)
                temp = 0.0 if i % 3 == 0 else 0.7 + 0.05 * i
                top_k = 5 if i == 7 else 0  # one request leaves the sample graph for a while
                params = SamplingParams(max_tokens=12 + 3 * i, temperature=temp, top_k=top_k,
                                        seed=100 + i)  # fmt: skip
                requests.append(engine.add_request(f"r{i}", list(range(5 + i, 20 + 2 * i)), params))
            engine.step()
            step += 1
        outs.append({r.request_id: list(r.output_token_ids) for r in requests})
        if full_step:
            fs = gr.full_step
            assert sum(engine.runner.graphs.replays.values()) > 20
            assert gr.sample_replays > 20
            assert fs.params_seen > 0  # the parameter copies followed the arrivals
            assert fs.steps_with_appends > 0  # new KV blocks entered by the inputs graph
    assert outs[0] == outs[1]
