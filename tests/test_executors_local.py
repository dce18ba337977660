"""``run --max-parallel N`` (cells side by side, one device id each) and the executor options'
bad input: one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

MATRIX = ("--set", "matrix={runner.async_scheduling: [true, false]}")
SMALL = ("--set", "workload.num_requests=4")


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        env=os.environ | (env or {}),
    )


def test_max_parallel_never_places_two_cells_on_one_device_id(tmp_path):
    db = tmp_path / "runs.duckdb"
    env = {"MRV2_PROF_DEVICE_IDS": "7,9"}
    args = ("run", "--headless", "--db", str(db), *MATRIX, *SMALL, "--repeats", "2")
    done = cli(*args, "--max-parallel", "3", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 cells at once" in done.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT run_id, status, environment FROM runs").fetchall()
        spans = con.execute("SELECT run_id, started_ns, ended_ns FROM runs").fetchall()
    assert len(rows) == 4 and {status for _, status, _ in rows} == {"completed"}
    slot = {run_id: json.loads(env)["placement"]["device_slot"] for run_id, _, env in rows}
    assert set(slot.values()) == {"7", "9"}
    # two runs on one id never overlap in time
    for a, a0, a1 in spans:
        for b, b0, b1 in spans:
            if a < b and slot[a] == slot[b]:
                assert a1 < b0 or b1 < a0, (a, b)


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (("--executor", "dask"), {}, "--executor 'dask'"),
        (("--max-parallel", "0"), {}, "--max-parallel 0"),
        (("--ray-address", "127.0.0.1:1"), {}, "--ray-address is for --executor ray"),
        (("--max-parallel", "2"), {"MRV2_PROF_DEVICE_IDS": "0,0"}, "MRV2_PROF_DEVICE_IDS"),
        (("--executor", "ray", "--ray-address", "127.0.0.1:1"), {}, "--ray-address"),
    ],
)
def test_bad_executor_options_are_one_line_and_write_nothing(tmp_path, args, env, says):
    if "ray" in args:
        pytest.importorskip("ray")
    db = tmp_path / "runs.duckdb"
    done = cli("run", "--headless", "--db", str(db), *args, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_executor_ray_without_the_extra_names_it(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None; sys.argv = ['mrv2-prof', *sys.argv[1:]]; "
        "from mrv2_prof.__main__ import main; main()"
    )
    db = str(tmp_path / "runs.duckdb")
    done = subprocess.run(
        [sys.executable, "-c", code, "run", "--db", db, "--executor", "ray"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --executor ray needs Ray: pip install 'mrv2-prof[ray]'"
    assert list(tmp_path.iterdir()) == []
