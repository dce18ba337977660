"""A headless run prints each of its notes once: on the start line, not again in the summary
(the dashboard's screen is gone when it ends, so there the summary prints them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"


def test_a_headless_run_prints_each_note_once(tmp_path):
    db = tmp_path / "runs.duckdb"
    # uva without the Triton kernels is a note on every machine (the quickstart runs torch)
    sets = ["--set", "runner.uva=true", "--set", "workload.num_requests=2"]
    proc = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", str(QUICKSTART), "--db", str(db),
         "--headless", *sets],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        (info,) = con.execute("SELECT info FROM runs").fetchone()
    notes = json.loads(info)["notes"]
    assert any(n.startswith("runner.uva") for n in notes)
    printed = proc.stdout + proc.stderr
    for note in notes:
        assert printed.count(note) == 1, note
    assert "findings" in proc.stdout  # the summary still came, opening with the findings
