"""The command line as a user types it: the quickstart runs; bad input is one line and exit 2."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from mrv2_prof.cli import app

runner = CliRunner()


def test_quickstart_runs_and_reports(tmp_path):
    out = tmp_path / "summary.json"
    result = runner.invoke(
        app,
        ["run", "--device", "cpu", "--num-requests", "5", "--output-len", "7", "--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert summary["output_tokens"] == 5 * 7
    assert summary["num_requests"] == 5
    assert summary["steps"] >= 7
    assert "output tokens/s" in result.output


def test_python_dash_m_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0
    assert "quickstart" in proc.stdout


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_bad_checkpoint_directory_is_one_line_exit_2(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    line = one_line_error(runner.invoke(app, ["run", "--model-path", str(tmp_path)]))
    assert "GPT2LMHeadModel" in line and str(tmp_path) in line


def test_missing_checkpoint_directory(tmp_path):
    line = one_line_error(runner.invoke(app, ["run", "--model-path", str(tmp_path / "nope")]))
    assert "does not exist" in line


def test_unknown_preset_and_bad_sizes():
    assert "model.preset" in one_line_error(runner.invoke(app, ["run", "--preset", "gpt-5"]))
    line = one_line_error(runner.invoke(app, ["run", "--device", "cpu", "--num-kv-blocks", "2"]))
    assert "runner.num_kv_blocks" in line
    assert "--prompt-len" in one_line_error(runner.invoke(app, ["run", "--prompt-len", "9:3"]))
