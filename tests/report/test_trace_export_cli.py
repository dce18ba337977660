"""The trace export's command line: ``--steps`` parsed as a Python slice, the default output
file and ``-o``, one-line errors, and the export's imports (no textual, no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_trace_export import (  # noqa: F401 (fixture_db: the fixture)
    REPO_ROOT,
    RUN,
    fixture_db,
    validate,
    x_events,
)
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.report.trace_export import ExportError, parse_steps


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10:20", slice(10, 20)),
        (":5", slice(None, 5)),
        ("-3:", slice(-3, None)),
        (":", slice(None)),
    ],
)
def test_parse_steps(text: str, expected: slice) -> None:
    assert parse_steps(text) == expected


@pytest.mark.parametrize("text", ["5", "1:2:3", "a:b", "", "1-2", "1.5:3"])
def test_parse_steps_rejects_other_forms(text: str) -> None:
    with pytest.raises(ExportError, match="expected A:B") as err:
        parse_steps(text)
    assert "\n" not in str(err.value)


def test_cli_export_writes_the_default_file(fixture_db: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["export", "abc", "--db", str(fixture_db)])
    assert result.exit_code == 0, result.output
    path = tmp_path / f"{RUN}.trace.json"
    doc = json.loads(path.read_text())
    validate(doc)
    assert f"{RUN}.trace.json" in result.stdout
    assert f"{len(doc['traceEvents']):,} events" in result.stdout


def test_cli_export_steps_and_output(fixture_db: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "w.json"
    args = ["export", "latest", "--steps", "0:1", "-o", str(out), "--db", str(fixture_db)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [e["args"]["step"] for e in x_events(doc, 1, "step")] == [0]
    assert "steps 0..0" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "nope"], "no run 'nope'"),
        (["export", RUN, "--steps", "1-2"], "--steps '1-2'"),
        (["export", RUN, "--steps", "1:2:3"], "expected A:B"),
        (["export", RUN, "--steps", "5:9"], "selects no steps: run abc123 has 3 steps (0..2)"),
    ],
)
def test_cli_export_errors_are_one_line(fixture_db: Path, tmp_path: Path, args, message) -> None:  # noqa: F811
    out = tmp_path / "t.json"
    result = CliRunner().invoke(app, [*args, "-o", str(out), "--db", str(fixture_db)])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_export_core_imports_neither_textual_nor_torch() -> None:
    code = (
        "import sys, mrv2_prof.report.trace_export; "
        "bad = [m for m in ('textual', 'torch', 'mrv2_prof.runner') if m in sys.modules]; "
        "assert not bad, bad"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
