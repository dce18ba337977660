"""Running a benchmark script of ``benchmarks/`` as a user does, for the benchmarks' smoke
tests: a subprocess with the repository on ``PYTHONPATH``, offline, its JSON read back."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
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


def load_benchmark(name: str, monkeypatch):
    """``benchmarks/<name>.py`` imported as a module for the test (its dataclasses look it up in
    ``sys.modules``; the benchmarks import ``bench_io`` and each other beside them)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def nvidia_tool_here(name: str) -> bool:
    """Whether Triton's NVIDIA backend and its ``name`` (ptxas, cuobjdump) are on this host: the
    sm_90 compiles on the CPU need them."""
    try:
        import triton.backends.nvidia as nvidia
    except ImportError:
        return False
    return (Path(nvidia.__file__).parent / "bin" / name).exists() or bool(shutil.which(name))
