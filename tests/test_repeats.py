"""``mrv2-prof run --repeats N`` and ``repeats:``: each combination N times, interleaved across
the matrix (A B A B), each combination's runs one group; checked in the store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml
from rich.console import Console

from mrv2_prof.analysis.summary import render_runs
from mrv2_prof.cli.repeats import repeated
from mrv2_prof.scenario import ScenarioError, expand_matrix, load_scenario
from mrv2_prof.store import Store
from mrv2_prof.store.run_refs import runs_with_groups

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
TINY = ("runner.device=cpu", "workload.num_requests=2", "workload.output_len.value=4")


def _scenario(tmp_path: Path, **extra) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["matrix"] = {"runner.staged_writes": [True, False]}
    data.update(extra)
    path = tmp_path / "ab.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_order_is_interleaved_and_each_combination_is_one_group(tmp_path):
    combos = expand_matrix(load_scenario(_scenario(tmp_path), TINY))
    runs = repeated(combos, 3, "ab.yaml")
    labels = [label for label, _, _, _ in runs]
    a, b = (label for label, _ in combos)
    assert labels == [a, b, a, b, a, b]
    groups = {label: {g for lab, _, g, _ in runs if lab == label} for label in (a, b)}
    assert all(len(g) == 1 for g in groups.values()) and groups[a] != groups[b]
    assert [i for _, _, _, i in runs] == [0, 0, 1, 1, 2, 2]
    assert all(g is None and i is None for _, _, g, i in repeated(combos, 1, "ab.yaml"))


def test_too_many_runs_or_a_bad_count_is_bad_input(tmp_path):
    combos = expand_matrix(load_scenario(_scenario(tmp_path), TINY))
    with pytest.raises(ScenarioError, match="2 combinations x 501 repeats = 1,002 runs"):
        repeated(combos, 501, "ab.yaml")
    with pytest.raises(ScenarioError, match="--repeats: 0: expected a whole number"):
        repeated(combos, 0, "ab.yaml")
    with pytest.raises(ScenarioError, match="repeats: must be >= 1, got 0"):
        load_scenario(_scenario(tmp_path, repeats=0), TINY)


def test_run_repeats_stores_the_interleaved_groups(tmp_path):
    db = tmp_path / "runs.duckdb"
    sets = [arg for s in TINY for arg in ("--set", s)]
    cmd = [sys.executable, "-m", "mrv2_prof", "run", str(_scenario(tmp_path, repeats=2))]
    proc = subprocess.run(
        [*cmd, "--db", str(db), "--headless", *sets], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT label, run_group, repeat_index FROM runs ORDER BY started_ns"
        ).fetchall()
    a, b = "quickstart[runner.staged_writes=true]", "quickstart[runner.staged_writes=false]"
    assert [r[0] for r in rows] == [a, b, a, b]  # A B A B, not A A B B
    assert [r[2] for r in rows] == [0, 0, 1, 1]
    assert rows[0][1] == rows[2][1] != rows[1][1] == rows[3][1]
    for group in (rows[0][1], rows[1][1]):
        assert f"group:{group}  2 runs" in proc.stdout
    console = Console(width=300, record=True)  # the runs view (mrv2-prof runs) at any width
    with Store.open(db, read_only=True) as store:
        console.print(render_runs(runs_with_groups(store), str(db)))
    assert f"{a}  group:{rows[0][1]} #2" in console.export_text()
