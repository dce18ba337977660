"""plan_graphs with auto capture sizes bounded by the workload (``RunnerConfig.workload_*``):
FULL up to the smallest ladder size holding every request, PIECEWISE up to the smallest holding
the most tokens a step can schedule, a note that is no downgrade, explicit sizes untouched."""

from __future__ import annotations

import pytest

from mrv2_prof.runner.config import RunnerConfig, SpecDecodeConfig
from mrv2_prof.runner.worker.cudagraph_plan import plan_graphs

# vLLM's ladder written out for max_num_seqs 256 and 8192 batched tokens (limit 512)
LADDER = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
FULL_256 = [s for s in LADDER if s <= 256]  # 35 sizes
NOTE = "runner.cudagraph_capture_sizes: auto, bounded by the workload: "


def cfg(reqs=None, tokens=None, **kw) -> RunnerConfig:
    base = dict(max_num_seqs=256, max_num_batched_tokens=8192)
    base.update(kw)
    return RunnerConfig(**base, workload_max_reqs=reqs, workload_max_step_tokens=tokens)


def test_the_ladder_written_out_is_the_unbounded_plan():
    plan = plan_graphs(cfg(), "triton", is_cuda=True)
    assert list(plan.full_sizes) == FULL_256 and list(plan.piecewise_sizes) == LADDER
    assert len(FULL_256) + len(LADDER) == 86 and plan.notes == ()


def test_32_requests_bound_full_to_32():
    plan = plan_graphs(cfg(reqs=32), "triton", is_cuda=True)
    assert plan.full_sizes == (1, 2, 4, 8, 16, 24, 32)
    assert list(plan.piecewise_sizes) == LADDER  # no known lengths: no token bound
    assert plan.notes == (
        NOTE + "FULL up to 32 (32 requests), PIECEWISE up to 512; 58 keys instead of 86",
    )


def test_one_request_of_128_plus_256_tokens():
    plan = plan_graphs(cfg(reqs=1, tokens=128 + 256), "triton", is_cuda=True)
    assert plan.full_sizes == (1,)
    piecewise = [1, 2, 4, *range(8, 256, 8), 256, 272, 288, 304, 320, 336, 352, 368, 384]
    assert list(plan.piecewise_sizes) == piecewise and len(piecewise) == 43
    assert plan.notes == (
        NOTE + "FULL up to 1 (1 request), PIECEWISE up to 384 (at most 384 tokens in a step); "
        "44 keys instead of 86",
    )


@pytest.mark.parametrize(
    "reqs, tokens, full_top, piecewise_top",
    [
        (3, None, 4, 512),  # the smallest ladder size >= 3
        (17, 100, 24, 104),  # between ladder sizes: the next one up
        (300, None, 256, 512),  # more requests than max_num_seqs: max_num_seqs bounds FULL
        (5, 600, 8, 512),  # more tokens than the ladder's top: no piecewise cut
    ],
)
def test_bounds_round_up_to_the_ladder(reqs, tokens, full_top, piecewise_top):
    plan = plan_graphs(cfg(reqs=reqs, tokens=tokens), "triton", is_cuda=True)
    assert list(plan.full_sizes) == [s for s in LADDER if s <= full_top]
    assert list(plan.piecewise_sizes) == [s for s in LADDER if s <= piecewise_top]


def test_no_note_when_the_workload_cuts_nothing():
    plan = plan_graphs(cfg(reqs=256, tokens=10**6), "triton", is_cuda=True)
    assert list(plan.full_sizes) == FULL_256 and list(plan.piecewise_sizes) == LADDER
    assert plan.notes == ()


def test_unknown_request_count_is_no_bound_at_all():
    plan = plan_graphs(cfg(reqs=None, tokens=8), "triton", is_cuda=True)
    assert list(plan.full_sizes) == FULL_256 and list(plan.piecewise_sizes) == LADDER


def test_explicit_sizes_are_untouched():
    sizes = (1, 8, 64, 200)
    plan = plan_graphs(cfg(reqs=1, tokens=2, cudagraph_capture_sizes=sizes), "triton", True)
    assert plan.full_sizes == sizes and plan.piecewise_sizes == sizes and plan.notes == ()


def test_the_bound_is_no_downgrade_under_strict():
    plan = plan_graphs(cfg(reqs=2, tokens=10, strict=True), "triton", is_cuda=True)
    assert plan.full_sizes == (1, 2) and plan.piecewise_sizes == (1, 2, 4, 8, 16)
    assert plan.notes == (
        NOTE + "FULL up to 2 (2 requests), PIECEWISE up to 16 (at most 10 tokens in a step); "
        "7 keys instead of 86",
    )


def test_piecewise_only_and_torch_kernels_name_piecewise_alone():
    for kw, kernels in (({"cudagraph_mode": "piecewise"}, "triton"), ({}, "torch")):
        plan = plan_graphs(cfg(reqs=1, tokens=20, **kw), kernels, is_cuda=True)
        assert plan.full_sizes == () and plan.piecewise_sizes == (1, 2, 4, 8, 16, 24)
        bound = [n for n in plan.notes if n.startswith(NOTE)]
        assert bound == [NOTE + "PIECEWISE up to 24 (at most 20 tokens in a step); "
                         "6 keys instead of 51"]  # fmt: skip


def test_no_bound_note_on_the_cpu():
    plan = plan_graphs(cfg(reqs=1, tokens=2), "torch", is_cuda=False)
    assert plan.full_sizes == plan.piecewise_sizes == ()
    assert not any(n.startswith(NOTE) for n in plan.notes)


def test_verify_steps_raise_the_token_bound_and_follow_full():
    """4 requests of 1 + 1 tokens verify 1 + 4 slots each: 20 tokens, not 8."""
    spec = SpecDecodeConfig(method="ngram", num_speculative_tokens=4)
    plan = plan_graphs(cfg(reqs=4, tokens=8, spec_decode=spec), "triton", is_cuda=True)
    assert plan.full_sizes == (1, 2, 4)
    assert plan.piecewise_sizes == (1, 2, 4, 8, 16, 24)
    assert plan.verify_shapes == ((1, 5), (2, 5), (4, 5))
    # before: 35 FULL + 51 PIECEWISE + 35 verify shapes; after: 3 + 6 + 3
    assert plan.notes[-1].endswith("; 12 keys instead of 121")
