"""CudaGraphManager on the CPU: capture sizes, the plan (downgrades and strict), capture order
and accounting with a fake backend, and every dispatch branch with its reason."""

from __future__ import annotations

import numpy as np
import pytest

from mrv2_prof.runner.config import ConfigError, RunnerConfig
from mrv2_prof.runner.worker.cudagraph_manager import (
    BatchDescriptor,
    CudaGraphManager,
    GraphBackend,
)
from mrv2_prof.runner.worker.cudagraph_plan import GraphPlan, default_capture_sizes, plan_graphs


def test_default_capture_sizes_follow_vllm():
    sizes = default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512
    assert [b - a for a, b in zip(sizes[3:], sizes[4:], strict=False)] == [8] * 31 + [16] * 16
    assert len(sizes) == 3 + 31 + 17
    assert default_capture_sizes(8, 8192) == [1, 2, 4, 8, 16]  # 2 x max_num_seqs
    assert default_capture_sizes(256, 100)[-1] == 96  # the token budget
    assert default_capture_sizes(1024, 8192)[-1] == 512  # never above 512


def cfg(**kw) -> RunnerConfig:
    base = dict(max_num_seqs=16, max_num_batched_tokens=256, cudagraph_mode="full_and_piecewise")
    base.update(piecewise_capture="startup")  # every size at start-up, as vLLM captures
    base.update(kw)
    return RunnerConfig(**base)


def test_plan_full_and_piecewise_on_triton():
    plan = plan_graphs(cfg(), "triton", is_cuda=True)
    assert plan.full_sizes == (1, 2, 4, 8, 16)  # a decode batch holds at most max_num_seqs
    assert plan.piecewise_sizes == (1, 2, 4, 8, 16, 24, 32)
    assert plan.notes == ()


@pytest.mark.parametrize(
    "kw, kernels, is_cuda, full, piecewise, note",
    [
        ({"cudagraph_mode": "none"}, "triton", True, (), (), None),
        ({}, "torch", False, (), (), "CUDA graphs need a CUDA device"),
        ({"cudagraph_mode": "full"}, "torch", True, (), (), "full needs the Triton attention"),
        ({}, "torch", True, (), (1, 2, 4, 8, 16, 24, 32), "full needs the Triton attention"),
        (
            {"cudagraph_mode": "full", "cudagraph_capture_sizes": (4, 8, 64)},
            "triton",
            True,
            (4, 8),
            (),
            "[64] exceed max_num_seqs 16",
        ),
        (
            {"cudagraph_mode": "piecewise", "cudagraph_capture_sizes": (64, 8)},
            "torch",
            True,
            (),
            (8, 64),
            None,
        ),
    ],
)
def test_plan_downgrades_are_notes_and_strict_errors(kw, kernels, is_cuda, full, piecewise, note):
    plan = plan_graphs(cfg(**kw), kernels, is_cuda)
    assert (plan.full_sizes, plan.piecewise_sizes) == (full, piecewise)
    if note is None:
        assert plan.notes == ()
        plan_graphs(cfg(strict=True, **kw), kernels, is_cuda)  # nothing to refuse
        return
    assert any(note in n and n.startswith("runner.cudagraph") for n in plan.notes)
    with pytest.raises(ConfigError, match=r"runner\.cudagraph.*strict: true"):
        plan_graphs(cfg(strict=True, **kw), kernels, is_cuda)


class FakeBackend(GraphBackend):
    """Records what is captured, in order; memory grows by 1 KiB per captured token."""

    def __init__(self) -> None:
        self.order: list[tuple[str, int]] = []
        self.reserved = 0

    def capture_full(self, size: int, pool) -> None:
        self.order.append(("full", size))
        self.reserved += 1024 * size

    def capture_piecewise(self, size: int, pool) -> None:
        self.order.append(("piecewise", size))
        self.reserved += 1024 * size

    def memory_reserved(self) -> int:
        return self.reserved


def captured(plan: GraphPlan) -> tuple[CudaGraphManager, FakeBackend, list]:
    manager, backend, seen = CudaGraphManager(plan), FakeBackend(), []
    manager.capture(backend, seen.append)
    return manager, backend, seen


def test_capture_runs_largest_first_and_accounts_each_key():
    plan = plan_graphs(cfg(), "triton", is_cuda=True)
    manager, backend, seen = captured(plan)
    assert backend.order == [("full", s) for s in (16, 8, 4, 2, 1)] + [
        ("piecewise", s) for s in (32, 24, 16, 8, 4, 2, 1)
    ]
    assert [(r.key, r.mode, r.num_tokens, r.mem_bytes) for r in seen[:2]] == [
        ("full:16", "full", 16, 16 * 1024),
        ("full:8", "full", 8, 8 * 1024),
    ]
    assert all(r.capture_s >= 0 for r in seen) and manager.captures == seen
    assert manager.full_keys == [1, 2, 4, 8, 16]
    assert manager.piecewise_keys == [1, 2, 4, 8, 16, 24, 32]


def desc(*counts: int) -> BatchDescriptor:
    return BatchDescriptor.of(np.array(counts, dtype=np.int32))


def test_batch_descriptor():
    assert desc(1, 1, 1) == BatchDescriptor(3, 3, 1)
    assert desc(4, 4) == BatchDescriptor(8, 2, 4)
    assert desc(1, 5) == BatchDescriptor(6, 2, None)
    assert desc(2, 1, 3) == BatchDescriptor(6, 3, None)  # sum = n * first, still mixed


@pytest.mark.parametrize(
    "batch, mode, key, reason",
    [
        (desc(*[1] * 3), "full", 4, "uniform decode, 3 → 4"),
        (desc(*[1] * 16), "full", 16, "uniform decode, 16 → 16"),
        (desc(*[1] * 17), "piecewise", 24, "num_tokens 17 > largest FULL size 16"),
        (desc(7, 1, 1), "piecewise", 16, "mixed prefill/decode batch"),
        (desc(8, 8), "piecewise", 16, "prefill batch (query length 8)"),
        (desc(30, 1, 1), "piecewise", 32, "mixed prefill/decode batch"),
        (desc(200, 1), "none", None, "num_tokens 201 > largest capture size 32"),
    ],
)
def test_dispatch_full_then_piecewise_then_none(batch, mode, key, reason):
    manager, _, _ = captured(plan_graphs(cfg(), "triton", is_cuda=True))
    d = manager.dispatch(batch)
    assert (d.mode, d.key, d.reason) == (mode, key, reason)
    assert d.num_tokens == batch.num_tokens
    assert d.padded_tokens == (key if key is not None else batch.num_tokens)
    assert d.hit == (mode != "none") and d.requested == "full_and_piecewise"


def test_usage_counts_the_graphs_never_replayed():
    manager, _, seen = captured(plan_graphs(cfg(), "triton", is_cuda=True))
    for batch in (desc(1, 1, 1), desc(1, 1, 1), desc(7, 1, 1), desc(1)):
        manager.count_replay(manager.dispatch(batch))  # full:4 twice, piecewise:16, full:1
    usage = manager.usage()
    unused = [r for r in seen if r.key not in ("full:4", "piecewise:16", "full:1")]
    assert usage == {
        "graph_keys_captured": 12,
        "graph_keys_replayed": 3,
        "graph_replays": 4,
        "unused_capture_s": sum(r.capture_s for r in unused),
        "unused_graph_bytes": sum(r.mem_bytes for r in unused),
    }
    assert usage["unused_graph_bytes"] == 1024 * (16 + 8 + 2 + 32 + 24 + 8 + 4 + 2 + 1)


def test_a_step_that_needs_every_hidden_state_skips_full():
    manager, _, _ = captured(plan_graphs(cfg(), "triton", is_cuda=True))
    d = manager.dispatch(desc(1, 1, 1), needs_hidden=True)
    assert (d.mode, d.key, d.reason) == ("piecewise", 4, "prompt logprobs need every hidden state")
    assert manager.dispatch(desc(1, 1, 1)).mode == "full"


def test_dispatch_reasons_when_a_mode_is_missing():
    piecewise_only, _, _ = captured(plan_graphs(cfg(cudagraph_mode="piecewise"), "triton", True))
    d = piecewise_only.dispatch(desc(1, 1))
    assert (d.mode, d.key, d.reason) == ("piecewise", 2, "no FULL graphs captured")
    full_only, _, _ = captured(plan_graphs(cfg(cudagraph_mode="full"), "triton", True))
    d = full_only.dispatch(desc(5, 1))
    assert (d.mode, d.reason) == ("none", "mixed prefill/decode batch; no piecewise graphs")
    none, _, _ = captured(plan_graphs(cfg(cudagraph_mode="none"), "triton", True))
    d = none.dispatch(desc(1))
    assert (d.mode, d.reason, d.requested) == ("none", "mode none requested", "none")
    cpu, _, _ = captured(plan_graphs(cfg(), "torch", False))
    assert cpu.dispatch(desc(1)).reason == "CUDA graphs need a CUDA device; running eagerly"


def test_first_use_captures_each_piecewise_size_on_the_step_that_needs_it():
    """``runner.piecewise_capture: first_use``: start-up captures the FULL sizes only; the first
    step needing a PIECEWISE size is dispatched to it with ``capture_first`` and a reason that
    says so; after ``capture_first_use`` the same shape replays it with the plain reason, and
    a smaller shape that rounds up to the same size needs no capture either."""
    plan = plan_graphs(cfg(piecewise_capture="first_use"), "triton", is_cuda=True)
    assert plan.piecewise_on_first_use and plan.piecewise_sizes == (1, 2, 4, 8, 16, 24, 32)
    manager, backend, seen = captured(plan)
    assert backend.order == [("full", s) for s in (16, 8, 4, 2, 1)]  # no PIECEWISE at start-up
    assert manager.piecewise_keys == []
    d = manager.dispatch(desc(7, 1, 1))
    assert (d.mode, d.key, d.capture_first) == ("piecewise", 16, True)
    assert d.reason == "mixed prefill/decode batch; PIECEWISE 16 captured on first use, this step"
    record = manager.capture_first_use(backend, d)
    assert backend.order[-1] == ("piecewise", 16) and manager.piecewise_keys == [16]
    assert (record.key, record.on_first_use, record.mem_bytes) == ("piecewise:16", True, 16 * 1024)
    assert manager.captures[-1] is record and len(manager.captures) == 6
    again = manager.dispatch(desc(7, 1, 1))  # the memoised decision was forgotten
    assert (again.mode, again.key, again.capture_first) == ("piecewise", 16, False)
    assert again.reason == "mixed prefill/decode batch"
    assert not manager.dispatch(desc(5, 4, 1)).capture_first  # 10 tokens: also size 16
    assert manager.dispatch(desc(30, 1, 1)).capture_first  # 32: not yet
    beyond = manager.dispatch(desc(200, 1))
    assert (beyond.mode, beyond.reason) == ("none", "num_tokens 201 > largest capture size 32")
    assert manager.dispatch(desc(1, 1, 1)).mode == "full"  # decode batches: FULL as ever


def test_first_use_is_startup_capture_with_more_than_one_rank():
    plan = plan_graphs(cfg(piecewise_capture="first_use", tensor_parallel_size=2), "triton", True)
    assert not plan.piecewise_on_first_use
    want = "runner.piecewise_capture: first_use needs one rank"
    assert any(n.startswith(want) for n in plan.notes)
    with pytest.raises(ConfigError, match=r"runner\.piecewise_capture.*strict: true"):
        plan_graphs(
            cfg(piecewise_capture="first_use", tensor_parallel_size=2, strict=True), "triton", True
        )
    # the default (auto): first use with one rank; with two, start-up, and no note for it
    default = dict(piecewise_capture=RunnerConfig().piecewise_capture)
    assert default == {"piecewise_capture": "auto"}
    assert plan_graphs(cfg(**default), "triton", True).piecewise_on_first_use is True
    two = plan_graphs(cfg(**default, tensor_parallel_size=2, strict=True), "triton", True)
    assert not two.piecewise_on_first_use and not two.notes
