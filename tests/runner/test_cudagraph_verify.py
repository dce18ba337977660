"""FULL verify graphs for speculative decoding (CPU, a fake backend): every (batch size, 1 + k)
that ``dynamic_k`` can choose is planned and captured, and a verify step replays one exactly
when every request verifies the same k; each reason names k."""

from __future__ import annotations

import numpy as np
from test_cudagraph_manager import FakeBackend

from mrv2_prof.runner.config import RunnerConfig, SpecDecodeConfig
from mrv2_prof.runner.worker.cudagraph_manager import BatchDescriptor, CudaGraphManager
from mrv2_prof.runner.worker.cudagraph_plan import plan_graphs


class VerifyBackend(FakeBackend):
    def capture_verify(self, size: int, query_len: int, pool) -> None:
        self.order.append((f"verify{query_len}", size))
        self.reserved += 1024 * size * query_len


def cfg(dynamic_k=((2, 3), (8, 1)), **kw) -> RunnerConfig:
    spec = SpecDecodeConfig(method="ngram", num_speculative_tokens=3, dynamic_k=dynamic_k)
    base = dict(max_num_seqs=16, max_num_batched_tokens=40, cudagraph_mode="full_and_piecewise")
    base.update(piecewise_capture="startup")  # every PIECEWISE size at start-up: reasons stay bare
    return RunnerConfig(**{**base, **kw}, spec_decode=spec)


def test_every_choosable_k_is_planned_at_the_sizes_its_tokens_fit():
    plan = plan_graphs(cfg(), "triton", is_cuda=True)
    assert plan.full_sizes == (1, 2, 4, 8, 16)
    # k = 3 (batches of 1-2), k = 1 (3-8), 0 above 8: query lengths 4 and 2; 40 tokens at most
    assert plan.verify_shapes == (
        (1, 2),
        (2, 2),
        (4, 2),
        (8, 2),
        (16, 2),
        (1, 4),
        (2, 4),
        (4, 4),
        (8, 4),
    )
    fixed = plan_graphs(cfg(dynamic_k=None), "triton", is_cuda=True)
    assert {q for _, q in fixed.verify_shapes} == {4}
    off = plan_graphs(RunnerConfig(max_num_seqs=16), "triton", is_cuda=True)
    assert off.verify_shapes == ()
    torch_plan = plan_graphs(cfg(), "torch", is_cuda=True)  # no FULL graphs: no verify graphs
    assert torch_plan.verify_shapes == ()


def test_verify_graphs_are_captured_and_replayed_by_shape():
    manager = CudaGraphManager(plan_graphs(cfg(), "triton", is_cuda=True))
    backend = VerifyBackend()
    manager.capture(backend)
    assert ("verify4", 8) in backend.order and ("verify2", 16) in backend.order
    assert manager.verify_keys == {2: [1, 2, 4, 8, 16], 4: [1, 2, 4, 8]}
    keys = {r.key for r in manager.captures}
    assert {"full:8x4", "full:16x2", "full:16"} <= keys

    d = manager.dispatch(BatchDescriptor.of(np.full(3, 4)), verify=True)
    assert (d.mode, d.key, d.query_len, d.num_tokens, d.padded_tokens) == ("full", 4, 4, 12, 16)
    assert d.reason == "uniform verify k=3, 3 → 4"
    manager.count_replay(d)
    assert manager.replays == {("full", (4, 4)): 1}
    usage = manager.usage()
    assert usage["graph_keys_replayed"] == 1 and usage["graph_replays"] == 1

    mixed = manager.dispatch(BatchDescriptor.of(np.array([4, 1, 4])), verify=True)
    assert mixed.mode == "piecewise" and "different k" in mixed.reason
    no_graph = manager.dispatch(BatchDescriptor.of(np.full(2, 3)), verify=True)  # k = 2
    assert no_graph.mode == "piecewise"
    assert no_graph.reason == "verify k=2: no FULL graph captured for query length 3"
    too_many = manager.dispatch(BatchDescriptor.of(np.full(9, 4)), verify=True)
    assert (too_many.mode, too_many.reason) == ("none", "num_tokens 36 > largest capture size 32")
    manager.verify_keys[4] = [1, 2]  # as if only two sizes fit
    manager.forget_decisions()
    over = manager.dispatch(BatchDescriptor.of(np.full(3, 4)), verify=True)
    assert (over.mode, over.reason) == ("piecewise", "verify k=3: 3 requests > largest FULL size 2")
    hidden = manager.dispatch(BatchDescriptor.of(np.full(3, 2)), needs_hidden=True, verify=True)
    assert hidden.mode == "piecewise" and hidden.reason == "prompt logprobs need every hidden state"
    plain = manager.dispatch(BatchDescriptor.of(np.ones(3, dtype=np.int64)))  # a decode step
    assert (plain.mode, plain.key, plain.query_len) == ("full", 4, 1)
    assert manager.dispatch(BatchDescriptor.of(np.ones(3, dtype=np.int64), 3)) is plain  # memoised


def test_padded_verify_reasons_count_the_placeholder_slots():
    """A verify padded to one k: its FULL reason names k and the padded slots; a padded step
    that still cannot replay FULL says so after its reason. ``verify_capacity`` is what the
    scheduler pads to: each captured k and the most requests its graphs hold."""
    manager = CudaGraphManager(plan_graphs(cfg(), "triton", is_cuda=True))
    manager.capture(VerifyBackend())
    assert manager.verify_capacity() == {1: 16, 3: 8}
    d = manager.dispatch(BatchDescriptor.of(np.full(3, 4)), verify=True, padded=5)
    assert (d.mode, d.key, d.query_len) == ("full", 4, 4)
    assert d.reason == "uniform verify k=3, 3 → 4, 5 of 9 draft slots padded"
    mixed = manager.dispatch(BatchDescriptor.of(np.array([4, 4, 7])), verify=True, padded=2)
    assert mixed.mode == "piecewise"
    assert mixed.reason == (
        "verify batch with different k per request (or decodes without drafts); "
        "2 draft slots padded"
    )
    unpadded = manager.dispatch(BatchDescriptor.of(np.full(3, 4)), verify=True)
    assert unpadded.reason == "uniform verify k=3, 3 → 4"
    assert CudaGraphManager(plan_graphs(cfg(), "torch", is_cuda=True)).verify_capacity() == {}
