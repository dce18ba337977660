"""Whether CUDA has a device, answered without importing torch (``inputs/cuda_devices.py``), and
the command line's preflight on a GPU host using it (no torch in the command's own process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mrv2_prof.inputs import cuda_devices
from mrv2_prof.inputs.cuda_devices import torch_cuda_build, visible_count, visible_cuda_devices


@pytest.mark.parametrize(
    ("value", "devices", "want"),
    [
        (None, 4, 4),  # unset: every device
        ("", 4, 0),  # set and empty: none
        ("0", 4, 1),
        ("2,0", 4, 2),
        ("1, 3", 4, 2),  # blanks around an entry are skipped
        ("-1", 4, 0),  # a negative entry ends the list before it starts
        ("0,-1,1", 4, 1),
        ("0,x,1", 4, 1),  # so does an unreadable one
        ("1gpu,2", 4, 2),  # read as strtoul reads: the leading digits
        ("0,0", 4, 0),  # a repeated ordinal: no device at all
        ("0,5,1", 2, 1),  # an ordinal past the machine ends the list
        ("3", 2, 0),
        (None, 0, 0),
    ],
)
def test_visible_count_narrows_the_devices_as_cuda_does(value, devices, want):
    assert visible_count(value, devices) == want


def package_with_version(tmp_path: Path, text: str) -> Path:
    package = tmp_path / "torch"
    package.mkdir()
    (package / "version.py").write_text(text)
    return package


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("__version__ = '2.9.0+cu128'\ncuda: Optional[str] = '12.8'\nhip = None\n", True),
        ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", False),  # a CPU build
        ("cuda = '11.8'\n", True),  # an older layout without annotations
        ("cuda = None\nhip = '6.2.4'\n", None),  # ROCm: only torch can say
        ("__version__ = '2.9.0'\n", None),  # no cuda field
        ("cuda = (\n", None),  # not Python
    ],
)
def test_torch_cuda_build_reads_version_py_as_text(tmp_path, text, want):
    assert torch_cuda_build(package_with_version(tmp_path, text)) is want


def test_torch_cuda_build_agrees_with_the_installed_torch():
    assert torch_cuda_build() is (torch.version.cuda is not None)


def test_visible_cuda_devices_asks_torch_where_nvml_cannot_tell(monkeypatch):
    monkeypatch.setattr(cuda_devices, "torch_cuda_build", lambda: True)
    monkeypatch.setattr(cuda_devices, "nvml_device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_cuda_devices() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,7")
    assert visible_cuda_devices() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5a1c0e2f")  # a UUID: torch maps it
    assert visible_cuda_devices() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(cuda_devices, "nvml_device_count", lambda: None)  # no NVML library
    assert visible_cuda_devices() is None
    monkeypatch.setattr(cuda_devices, "torch_cuda_build", lambda: False)  # a CPU build of torch
    assert visible_cuda_devices() == 0


# The command's process on a "GPU host" (a driver node, NVML listing one GPU, a CUDA build of
# torch) with torch made unimportable: preflight must answer from NVML alone.
GPU_HOST_PREFLIGHT = """
import sys
sys.modules["torch"] = None
from mrv2_prof.cli import preflight
from mrv2_prof.inputs import cuda_devices
from mrv2_prof.scenario.loading import load_quickstart
preflight.cuda_driver_present = lambda: True
cuda_devices.torch_cuda_build = lambda package=None: True
cuda_devices.nvml_device_count = lambda: int(sys.argv[1])
scenario = load_quickstart([f"runner.device={sys.argv[2]}"])
try:
    preflight.preflight(scenario)
    print("on the GPU:", preflight._on_gpu(scenario.runner_config()))
except Exception as exc:
    print("error:", exc)
"""


def gpu_host_preflight(devices: int, device: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run(
        [sys.executable, "-c", GPU_HOST_PREFLIGHT, str(devices), device],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]  # a torch import would be a traceback
    return done.stdout


def test_preflight_on_a_gpu_host_decides_the_device_without_importing_torch():
    """``auto`` takes the GPU NVML lists; ``cuda`` without one is the usual one-line error;
    neither imports torch (it is unimportable in that process)."""
    out = gpu_host_preflight(1, "auto")
    assert "on the GPU: True" in out and "error" not in out, out
    out = gpu_host_preflight(0, "cuda")
    assert out.startswith("error: <quickstart>: runner.device:"), out
    assert "no CUDA device is available" in out, out
    out = gpu_host_preflight(0, "auto")
    assert "on the GPU: False" in out and "error" not in out, out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_host_nvml_counts_the_devices_torch_sees():
    """The real answer on a GPU host, against torch's own (which creates no context either)."""
    assert torch_cuda_build() is True
    assert visible_cuda_devices() == torch.cuda.device_count()
