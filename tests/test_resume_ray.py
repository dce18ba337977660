"""``run --executor ray --resume`` on a local Ray cluster of CPUs: the driver matches each cell
under the classes its nodes report, so a resumed sweep whose cells all completed on the cluster
runs nothing again. Skipped where Ray is not installed (``pip install 'mrv2-prof[ray]'``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ray = pytest.importorskip("ray")

TINY = ("runner.device=cpu", "workload.num_requests=2", "workload.output_len.value=4")


def _run(db: Path, address: str, *args: str) -> subprocess.CompletedProcess:
    sets = [arg for s in TINY for arg in ("--set", s)]
    cmd = [sys.executable, "-m", "mrv2_prof", "run", "--headless", "--db", str(db), *sets,
           "--executor", "ray", "--ray-address", address, *args]  # fmt: skip
    env = os.environ | {"MRV2_PROF_RAY_CELL_RESOURCE": "gpu_slot", "RAY_ADDRESS": ""}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_resume_after_a_ray_sweep_runs_nothing_again(tmp_path, ray_cluster):
    db = tmp_path / "runs.duckdb"
    first = _run(db, ray_cluster, "--repeats", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        ids = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY started_ns").fetchall()]
    assert len(ids) == 2

    again = _run(db, ray_cluster, "--repeats", "2", "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "skipped 2 cells (already in the database: " in again.stdout
    assert sorted(again.stdout.split("database: ")[1].split(")")[0].split(", ")) == sorted(ids)
    assert "GPU classes" not in again.stdout  # one class: the cluster is this host
    assert "cell 1/" not in again.stderr  # no task was submitted
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2


def test_each_node_says_its_class_for_resume(ray_cluster):
    from rich.console import Console

    from mrv2_prof.pipeline.executors.ray_cells import RayCells
    from mrv2_prof.pipeline.resume import code_version, environment_class

    cells = RayCells(ray_cluster, None, Console())
    cells.ray = ray
    cells._check_versions()
    # the one node is this host: its checkout and its (GPU-less, or first GPU's) class
    assert cells.node_classes == [
        {"code": code_version(), "environment": environment_class("cuda")}
    ]
