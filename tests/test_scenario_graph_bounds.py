"""The scenario fills the runner's workload bounds (``WorkloadSection.step_bounds``) that cut
its auto CUDA graph capture sizes: synthetic, dataset and trace workloads, what the scenario as
run then says, and that a scenario cannot set the bounds itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mrv2_prof.pipeline.effective_scenario import as_run
from mrv2_prof.runner.worker.cudagraph_plan import plan_graphs
from mrv2_prof.scenario import ScenarioError
from mrv2_prof.scenario.schema import Scenario
from mrv2_prof.views.downgrades import downgrades


def scenario(workload: dict[str, Any], base_dir: Path | None = None, **rest: Any) -> Scenario:
    return Scenario.from_data({"name": "x", "workload": workload, **rest}, "s.yaml", base_dir)


def bounds(s: Scenario) -> tuple[int | None, int | None]:
    c = s.runner_config()
    return c.workload_max_reqs, c.workload_max_step_tokens


def _as_run(given: dict[str, Any], plan) -> dict[str, Any]:
    """The scenario as a GPU run of ``plan`` writes it."""
    return as_run(
        given, db_path="runs.duckdb", device="cuda:0", dtype="bfloat16", kernels="triton",
        uva=True, full_sizes=plan.full_sizes, piecewise_sizes=plan.piecewise_sizes,
        num_kv_blocks=100, nvtx=True, bounded_by_workload=plan.bounded_by_workload,
    )  # fmt: skip


@pytest.mark.parametrize(
    "workload, expected",
    [
        ({}, (16, 16 * (96 + 32))),  # 16 requests, uniform 16..96, fixed 32 output
        (
            {
                "num_requests": 1,
                "prompt_len": {"dist": "fixed", "value": 128},
                "output_len": {"dist": "fixed", "value": 256},
            },
            (1, 384),
        ),
        (
            {
                "num_requests": 5,
                "prompt_len": {"dist": "lognormal", "mean": 50, "sigma": 1, "max": 300},
                "output_len": {"dist": "uniform", "min": 1, "max": 7},
            },
            (5, 5 * 307),
        ),
        (  # the prompt grows past its shared prefix of 200
            {"num_requests": 2, "shared_prefix": {"groups": 1, "len": 200}},
            (2, 2 * (201 + 32)),
        ),
        (  # an unbounded tail: the count alone
            {"num_requests": 3, "output_len": {"dist": "normal", "mean": 20, "std": 5}},
            (3, None),
        ),
    ],
)
def test_synthetic_bounds(workload, expected):
    assert bounds(scenario(workload)) == expected


def test_dataset_and_trace_bounds(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps([]))
    (tmp_path / "t.jsonl").write_text("")
    for source in ({"dataset": {"path": "d.json"}}, {"trace": "t.jsonl"}):
        assert bounds(scenario(source, tmp_path)) == (None, None)  # count known once read
        counted = scenario({**source, "num_requests": 7}, tmp_path)
        assert bounds(counted) == (7, None)  # lengths known once read


def test_one_request_plans_one_full_size_and_384_tokens():
    s = scenario(
        {
            "num_requests": 1,
            "prompt_len": {"dist": "fixed", "value": 128},
            "output_len": {"dist": "fixed", "value": 256},
        }
    )
    plan = plan_graphs(s.runner_config(), "triton", is_cuda=True)
    assert plan.full_sizes == (1,)
    assert plan.piecewise_sizes[-3:] == (352, 368, 384)
    assert plan.bounded_by_workload
    # the scenario as run keeps "auto" (a list of sizes cannot say FULL stops at 1 while
    # PIECEWISE goes to 384); no downgrade against it, and running it again plans the same
    given = s.model_dump(mode="json")
    ran = _as_run(given, plan)
    assert ran["runner"]["cudagraph_capture_sizes"] == given["runner"]["cudagraph_capture_sizes"]
    assert ran["runner"]["cudagraph_mode"] == "full_and_piecewise"
    assert downgrades(given, ran) == []
    again = plan_graphs(Scenario.from_data(ran, "as-run.yaml").runner_config(), "triton", True)
    assert (again.full_sizes, again.piecewise_sizes) == (plan.full_sizes, plan.piecewise_sizes)


def test_an_unbounded_auto_plan_is_written_as_its_sizes_and_runs_again_alike():
    s = scenario({"num_requests": 512, "prompt_len": {"dist": "fixed", "value": 600}})
    plan = plan_graphs(s.runner_config(), "triton", is_cuda=True)
    assert not plan.bounded_by_workload  # 512 requests reach every size of the ladder
    given = s.model_dump(mode="json")
    ran = _as_run(given, plan)
    assert ran["runner"]["cudagraph_capture_sizes"] == list(plan.piecewise_sizes)
    again = plan_graphs(Scenario.from_data(ran, "as-run.yaml").runner_config(), "triton", True)
    assert (again.full_sizes, again.piecewise_sizes) == (plan.full_sizes, plan.piecewise_sizes)


def test_the_bounds_are_no_scenario_keys():
    for key in ("workload_max_reqs", "workload_max_step_tokens"):
        with pytest.raises(ScenarioError, match=key):
            Scenario.from_data({"name": "x", "runner": {key: 3}}, "s.yaml")
