"""``run --executor ray`` on a local Ray cluster of CPUs, a custom resource standing in for a
GPU per cell: one completed run per cell with its placement and the same tokens as a local run
of the same seeded cells; a cell whose task is killed (and its one retry) is stored failed while
the others complete. Skipped where Ray is not installed (``pip install 'mrv2-prof[ray]'``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

ray = pytest.importorskip("ray")

SMALL = ("--set", "workload.num_requests=4")
TOKENS = (
    "SELECT r.label, list(t.token_id ORDER BY t.req_id, t.idx) FROM tokens t "
    "JOIN runs r USING (run_id) GROUP BY r.label ORDER BY r.label"
)


def cli(*args: str, cwd: Path, address: str) -> list[str]:
    env = os.environ | {"MRV2_PROF_RAY_CELL_RESOURCE": "gpu_slot", "RAY_ADDRESS": ""}
    return [sys.executable, "-m", "mrv2_prof", *args, "--ray-address", address], env


def test_a_matrix_on_ray_stores_each_cell_as_a_local_run_does(tmp_path, ray_cluster):
    matrix = ("--set", "matrix={runner.async_scheduling: [true, false]}")
    db, local_db = tmp_path / "ray.duckdb", tmp_path / "local.duckdb"
    command, env = cli("run", "--headless", "--db", str(db), "--executor", "ray", *matrix, *SMALL,
                       cwd=tmp_path, address=ray_cluster)  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cell 2/2 completed on" in done.stderr
    local = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", "--headless", "--db", str(local_db), *matrix,
         *SMALL],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT status, environment FROM runs").fetchall()
        on_ray = con.execute(TOKENS).fetchall()
    with duckdb.connect(str(local_db), read_only=True) as con:
        assert con.execute(TOKENS).fetchall() == on_ray
    assert [status for status, _ in rows] == ["completed", "completed"]
    for _, env_json in rows:
        placement = json.loads(env_json)["placement"]
        assert placement["executor"] == "ray" and placement["host"]
        assert placement["resources"] == {"gpu_slot": 1.0}
    assert not (tmp_path / "ray.duckdb.live").exists()


def _kill_task(name: str) -> bool:
    """SIGKILL the Ray worker running task ``name`` (its process title is ``ray::NAME``)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if title.startswith(f"ray::{name}"):
            os.kill(int(pid), signal.SIGKILL)
            return True
    return False


def test_a_cell_whose_worker_dies_is_failed_and_the_others_complete(tmp_path, ray_cluster):
    matrix = ("--set", "matrix={workload.num_requests: [4, 3000]}")
    db = tmp_path / "runs.duckdb"
    command, env = cli("run", "--headless", "--db", str(db), "--executor", "ray", *matrix,
                       cwd=tmp_path, address=ray_cluster)  # fmt: skip
    proc = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=env)
    kills, deadline = 0, time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        # the long cell, and Ray's one retry of it
        kills += _kill_task("mrv2-prof cell 1 quickstart[workload.num_requests=3000]")
        time.sleep(0.5)
    _, stderr = proc.communicate(timeout=60)
    assert kills == 2, stderr[-3000:]
    assert proc.returncode == 1, stderr[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT label, status, error FROM runs ORDER BY label").fetchall()
    assert [(label, status) for label, status, _ in rows] == [
        ("quickstart[workload.num_requests=3000]", "failed"),
        ("quickstart[workload.num_requests=4]", "completed"),
    ]
    assert rows[0][2].startswith("ray task failed")
