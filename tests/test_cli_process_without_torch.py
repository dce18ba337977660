"""The CLI's own process does not load torch for a run of a preset or for the commands that read
runs: only the spawned runner process needs it (1.5-2 s of imports that every command paid)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# torch made unimportable in the CLI's process; the spawned runner is a fresh interpreter
NO_TORCH = (
    "import sys; sys.modules['torch'] = None; sys.argv = ['mrv2-prof', *sys.argv[1:]]; "
    "from mrv2_prof.__main__ import main; main()"
)


def cli_without_torch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env_debug = {"MRV2_PROF_DEBUG": "1"}  # a torch import would show as a traceback
    command = [sys.executable, "-c", NO_TORCH, *args]
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=240, env=os.environ | env_debug
    )


def test_a_preset_run_and_the_reading_commands_run_without_torch_in_the_cli(tmp_path):
    db = str(tmp_path / "runs.duckdb")
    run = cli_without_torch("run", "--headless", "--db", db, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "status           completed" in run.stdout
    for args in (["show", "latest"], ["runs"], ["compare", "latest", "latest"]):
        done = cli_without_torch(*args, "--db", db, cwd=tmp_path)
        assert done.returncode == 0, (args, done.stderr[-3000:])
        assert "torch" not in done.stderr


def test_the_check_does_fail_when_torch_is_imported(tmp_path):
    """The harness of the test above: a command that imports torch fails under it."""
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH.replace("from mrv2_prof", "import torch; from mrv2_prof")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "torch" in done.stderr
