"""The command-line surface: entry points and the embedded default."""

import subprocess
import sys

import duckdb
from typer.testing import CliRunner

from mrv2_prof.cli import app

runner = CliRunner()


def test_python_dash_m_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0
    assert "quickstart" in proc.stdout


def test_no_arguments_prints_help():
    result = runner.invoke(app, [])
    assert "run" in result.output and "runs" in result.output and "show" in result.output


def test_embedded_quickstart_runs_without_a_file(tmp_path, monkeypatch):
    """`mrv2-prof run` with no file: the README's first command, in a fresh directory."""
    monkeypatch.chdir(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", "--headless"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "runs.duckdb").is_file()
    assert "quickstart" in proc.stdout and "16 completed" in proc.stdout


def test_the_embedded_quickstart_takes_set_and_strict(tmp_path, monkeypatch):
    """`mrv2-prof run --strict --set ...` with no file: the quickstart with the overrides (it
    honours every switch it asks for, so strict passes), stored as given."""
    monkeypatch.chdir(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", "--headless", "--strict",
         "--set", "workload.num_requests=3", "--set", "runner.device=cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "3 completed" in proc.stdout
    with duckdb.connect(str(tmp_path / "runs.duckdb"), read_only=True) as con:
        given = con.execute("SELECT scenario_given_yaml FROM runs").fetchone()[0]
    assert "num_requests: 3" in given and "strict: true" in given
