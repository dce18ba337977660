"""Helpers of the run-database tests: a child process with the repository importable, a run row
begun with typical fields, a store error's one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrv2_prof.store import Store, StoreError

REPO_ROOT = Path(__file__).resolve().parents[2]


def child(code: str, *args: str, **popen: object) -> subprocess.Popen:
    """A python child process running ``code`` with the repo importable."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=env, text=True, **popen
    )


def begin(store: Store, run_id: str, started_ns: int = 1_000, **overrides: object) -> None:
    fields = dict(
        scenario_name="decode-heavy",
        label="decode-heavy[runner.async_scheduling=false]",
        matrix_combo={"runner.async_scheduling": False},
        scenario_yaml="name: decode-heavy\n",
        device="cpu",
        versions={"mrv2_prof": "0.1.0"},
        started_ns=started_ns,
    )
    fields.update(overrides)
    store.begin_run(run_id, **fields)


def one_line(err: pytest.ExceptionInfo[StoreError]) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg
