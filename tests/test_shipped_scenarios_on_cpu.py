"""Every shipped scenario runs on a CPU machine with two overrides, the device and the tiny model
(the GPU-only switches become recorded notes, ``num_kv_blocks: auto`` sizes the cache for the
CPU), and here two more, fewer requests and shorter answers: the file, its downgrades and its run
end to end are what is checked, in a share of the CI's time its full traffic would take. A
scenario of a shipped real model keeps its model (its text workload needs the tokenizer) and runs
shorter answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from mrv2_prof.runner.model.shipped import SHIPPED

NUM_REQUESTS = 6
SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_a_shipped_scenario_runs_on_cpu_with_two_overrides(scenario, tmp_path):
    db = tmp_path / "runs.duckdb"
    model = (yaml.safe_load(scenario.read_text()).get("model") or {}).get("preset")
    if model in SHIPPED:
        smaller = ["--set", "workload.num_requests=2", "--set",
                   "workload.output_len={dist: fixed, value: 8}"]  # fmt: skip
    else:
        smaller = ["--set", "model.preset=llama-tiny",
                   "--set", f"workload.num_requests={NUM_REQUESTS}",
                   "--set", "workload.output_len={dist: fixed, value: 16}"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", str(scenario), "--headless", "--db", str(db),
         "--set", "runner.device=cpu", *smaller],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    with duckdb.connect(str(db), read_only=True) as con:
        statuses = [s for (s,) in con.execute("SELECT status FROM runs").fetchall()]
    assert statuses and set(statuses) == {"completed"}, statuses
