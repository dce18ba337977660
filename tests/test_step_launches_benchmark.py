"""``benchmarks/step_launches.py --quick`` on the CPU: the decode step's inventory shows one
Triton launch each for input prep (block-table gather included), sampling (the reduction in the
scan's launch) and the state advance, and none of the torch ops they replaced; the binding part
times the JIT path's binding and the cached launcher's key."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.benchmark_runs import BENCHMARKS, run_benchmark


def test_step_launches_quick(tmp_path):
    out = tmp_path / "step_launches.json"
    results = run_benchmark("step_launches.py", out, "--quick", timeout=600).results
    (inv,) = [r for r in results if r["part"] == "inventory"]
    per_step = inv["per_step"]
    assert per_step["prepare"]["triton _prepare_inputs_kernel"] == 1.0
    assert per_step["sample"]["triton _gumbel_argmax_kernel"] == 1.0
    assert per_step["advance"]["triton _advance_kernel"] == 1.0
    launched = {k for phase in per_step.values() for k in phase if k.startswith("triton ")}
    assert "triton _reduce_splits_kernel" not in launched
    replaced = {"op index_select", "op index_put_", "op index_add_", "op _to_copy"}
    for phase in ("prepare", "sample", "advance"):
        assert not replaced & set(per_step[phase]), (phase, per_step[phase])
    assert inv["totals"]["advance"]["ops"] == 0
    binding = {r["kernel"]: r for r in results if r["part"] == "binding"}
    assert set(binding) == {"prepare_inputs", "gumbel_argmax", "advance_state"}
    assert all(r["jit_bind_key_us"] > 0 and r["launcher_key_us"] > 0 for r in binding.values())


def test_step_launches_refuses_bad_batches(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "step_launches.py"), "--batches", "1,x"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)},
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "--batches, --steps, --warm, --iters: positive integers expected"
    ]
