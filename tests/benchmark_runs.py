"""Running a benchmark script of ``benchmarks/`` as a user does, for the benchmarks' smoke
tests: a subprocess with the repository on ``PYTHONPATH``, offline, its JSON read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@dataclass
class BenchmarkRun:
    data: dict  # the JSON it wrote
    stdout: str  # what it printed (its markdown tables)

    @property
    def results(self) -> list[dict]:
        return self.data["results"]


def run_benchmark(script: str, out: Path, *args: str, timeout: int) -> BenchmarkRun:
    """``python benchmarks/<script> --out OUT ARGS...``: exit 0 (else its stderr's tail is the
    failure), the JSON it wrote and what it printed."""
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return BenchmarkRun(json.loads(out.read_text()), proc.stdout)
