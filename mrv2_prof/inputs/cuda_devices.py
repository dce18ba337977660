"""Whether CUDA will see a device, answered without importing torch.

``run`` checks a scenario's ``runner.device`` before it spawns the runner, in a process that never
uses CUDA itself. Asking ``torch.cuda.is_available()`` there imports torch: 1-3 s of every run
on a GPU host, spent before the runner's own start-up begins. ``visible_cuda_devices`` answers
from what torch's answer rests on, in milliseconds:

* the installed torch is a CUDA build: its ``torch/version.py`` names a CUDA version (read as
  text; importing ``torch.version`` would import torch);
* the devices NVML lists, narrowed by ``CUDA_VISIBLE_DEVICES`` as CUDA narrows them
  (``visible_count``): ordinals up to the first that is negative or not a number, none at all
  where an ordinal repeats, and the list cut at the first ordinal past the machine's devices.

Where it cannot answer (no torch installed, a ROCm build, no ``pynvml`` or NVML library, device
UUIDs or MIG instances in ``CUDA_VISIBLE_DEVICES``) it returns None and the caller asks torch.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
# Device nodes of an NVIDIA driver (Linux; WSL's GPU node). Without one, CUDA is unavailable and
# nothing (torch's 1-2 s of imports, NVML) is asked.
DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")


def cuda_driver_present() -> bool:
    """Whether this host has an NVIDIA driver's device node (always True off Linux)."""
    return not sys.platform.startswith("linux") or any(map(os.path.exists, DRIVER_NODES))


def _leading_int(text: str) -> int:
    """The integer ``text`` starts with (as ``strtoul`` reads it), or -1."""
    match = re.match(r"[+-]?\d+", text)
    return int(match.group()) if match else -1


def visible_count(value: str | None, devices: int) -> int:
    """How many of ``devices`` ordinals ``CUDA_VISIBLE_DEVICES=value`` leaves visible (ordinal
    entries only; ``value`` None: all of them)."""
    if value is None:
        return devices
    ordinals: list[int] = []
    for entry in value.split(","):
        n = _leading_int(entry.strip())
        if n in ordinals:  # a repeated ordinal: CUDA sees no device at all
            return 0
        if n < 0:  # a negative or unreadable entry ends the list
            break
        ordinals.append(n)
    for i, n in enumerate(ordinals):
        if n >= devices:  # an ordinal past the machine's devices ends it too
            return i
    return len(ordinals)


def torch_dir() -> Path | None:
    """The installed torch package's directory, found without running its ``__init__``."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def torch_cuda_build(package: Path | None = None) -> bool | None:
    """Whether the torch at ``package`` (default: the installed one) was built with CUDA, from
    its ``version.py`` read as text; None where that cannot be told (no torch, no such file, a
    ROCm build, another layout)."""
    package = package or torch_dir()
    if package is None:
        return None
    path = package / "version.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    values: dict[str, object] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            values[target.id] = node.value.value
    if "cuda" not in values or values.get("hip") is not None:  # ROCm: torch.cuda is HIP
        return None
    return isinstance(values["cuda"], str)


def nvml_device_count() -> int | None:
    """The GPUs NVML lists, or None where NVML cannot be asked."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded...
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def visible_cuda_devices() -> int | None:
    """How many CUDA devices the runner will see, or None where only torch can say."""
    build = torch_cuda_build()
    if build is None:
        return None
    if not build:  # a CPU build of torch sees no device, whatever the machine has
        return 0
    value = os.environ.get(VISIBLE_ENV)
    if value is not None and value.strip().startswith(("GPU-", "MIG-")):
        return None
    count = nvml_device_count()
    return None if count is None else visible_count(value, count)
