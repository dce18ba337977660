"""``mrv2-prof tui [--db PATH]``: bad databases end with one line and exit 2 before any UI."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from mrv2_prof.cli import app

runner = CliRunner()


def test_a_missing_database_is_one_line_and_exit_2(tmp_path: Path) -> None:
    db = tmp_path / "nope.duckdb"
    result = runner.invoke(app, ["tui", "--db", str(db)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error:") and str(db) in lines[0]
    assert "no such run database" in lines[0]
    assert not db.exists()  # nothing was created


def test_a_file_that_is_not_a_database_is_one_line_and_exit_2(tmp_path: Path) -> None:
    db = tmp_path / "notes.txt"
    db.write_text("hello\n")
    result = runner.invoke(app, ["tui", "--db", str(db)])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "not a DuckDB database" in result.output


def test_a_good_database_starts_the_browser_on_it(runs_db: Path, monkeypatch) -> None:
    started = []
    monkeypatch.setattr("mrv2_prof.cli.views._on_a_terminal", lambda: True)
    monkeypatch.setattr(
        "mrv2_prof.tui.browser.BrowserApp.run", lambda self: started.append(self.db_path)
    )
    result = runner.invoke(app, ["tui", "--db", str(runs_db)])
    assert result.exit_code == 0, result.output
    assert started == [runs_db]


def test_the_default_database_is_runs_duckdb_in_the_working_directory(
    runs_db: Path, monkeypatch
) -> None:
    monkeypatch.chdir(runs_db.parent)
    started = []
    monkeypatch.setattr("mrv2_prof.cli.views._on_a_terminal", lambda: True)
    monkeypatch.setattr(
        "mrv2_prof.tui.browser.BrowserApp.run", lambda self: started.append(self.db_path)
    )
    assert runner.invoke(app, ["tui"]).exit_code == 0
    assert started == [Path("runs.duckdb")]
