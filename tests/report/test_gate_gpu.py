"""The gate on a GPU: two groups of repeats of the quickstart on the same GPU are comparable
(the SM clock at the start, which an idle GPU lowers, does not refuse), their greedy tokens
agree, no note fails the static stage, and the load verdict is decided or inconclusive, never
bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_two_groups_on_one_gpu_gate_through_every_stage(tmp_path):
    db = str(tmp_path / "gpu.duckdb")
    sets = ["--set", "runner.device=cuda", "--set", "workload.num_requests=32"]
    for name in ("main", "pr"):
        proc = cli("run", str(QUICKSTART), "--repeats", "3", "--headless", "--db", db, *sets)
        assert proc.returncode == 0, proc.stderr
        assert cli("baseline", "set", name, "group:latest", "--db", db).returncode == 0
    gate = cli(
        "gate", "--baseline", "baseline:main", "--candidate", "baseline:pr", "--db", db,
        "--max-regression", "tok_throughput=10%", "--only", "tok_throughput", "--all-stages",
        "--format", "json",
    )  # fmt: skip
    assert gate.returncode in (0, 1, 3), gate.stderr
    data = json.loads(gate.stdout)
    stages = {s["name"]: s for s in data["stages"]}
    assert stages["static"]["status"] == "pass", stages["static"]
    assert stages["output contract"]["status"] == "pass", stages["output contract"]
    assert any(x.startswith("greedy tokens:") for x in stages["output contract"]["lines"])
    assert data["comparability"]["comparable"] is True
    (result,) = data["results"]
    assert len(data["baseline"]["runs"]) == len(data["candidate"]["runs"]) == 3
    assert result["test"].endswith("over runs") and result["interval"] is not None
    env = data["comparability"]
    print(json.dumps({"result": result, "differences": env["differences"]}, indent=1))
