"""``report --window A:B`` and ``export --steps A:B`` read A:B by one rule (a python slice of
the run's steps: A included, B excluded), and a window with no step of the run is bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.cli.views import _window_of
from mrv2_prof.report.trace_export import parse_steps
from mrv2_prof.store import Store

cli = CliRunner()


@pytest.fixture
def ten_steps(tmp_path: Path) -> Path:
    db = tmp_path / "runs.duckdb"
    with Store.open(db) as store:
        store.begin_run("c0ffee", scenario_name="w", label="w", matrix_combo=None,
                        scenario_yaml="", device="cpu", versions={}, started_ns=0)  # fmt: skip
        store.append("c0ffee", "steps", {"step": list(range(10))})
        store.finish_run("c0ffee", "completed", ended_ns=1)
    return db


@pytest.mark.parametrize(
    ("text", "first_last"),
    [("3:6", (3, 5)), ("7:", (7, 9)), (":2", (0, 1)), ("-3:", (7, 9)), ("8:20", (8, 9))],
)
def test_the_window_is_the_slice_export_takes(ten_steps, text, first_last):
    with Store.open(ten_steps, read_only=True) as store:
        assert _window_of(store, "c0ffee", text, parse_steps(text)) == first_last
        ids = list(store.step_ids("c0ffee")[parse_steps(text)])  # what export --steps takes
    assert (ids[0], ids[-1]) == first_last


@pytest.mark.parametrize("command", ["report", "export"])
@pytest.mark.parametrize("text", ["20:30", "5:5", "9:3"])
def test_a_window_beyond_the_run_is_one_line_exit_2(ten_steps, tmp_path, command, text):
    flag = "--window" if command == "report" else "--steps"
    out = tmp_path / "out.file"
    result = cli.invoke(
        app, [command, "c0ffee", flag, text, "--db", str(ten_steps), "-o", str(out)]
    )
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "selects no steps: run c0ffee has" in line and "10" in line, line
    assert not out.exists()
