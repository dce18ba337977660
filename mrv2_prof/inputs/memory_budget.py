"""Memory a run will need, checked before it starts against what the machine has free.

A KV cache, the persistent request state and the workload are allocated once, at start-up;
sizes a scenario asks for that cannot fit would fail there, after the run row exists, with an
allocator's traceback. ``shortfall`` compares a computed need with the free memory of the host
(``MemAvailable``) or of the GPU (NVML, device 0 of ``CUDA_VISIBLE_DEVICES``; no CUDA context is
created in this process) and words the problem with both numbers.
"""

from __future__ import annotations

import os

from mrv2_prof.views.format import format_bytes


def available_host_bytes() -> int | None:
    """Memory the host can give without swapping (``MemAvailable``); None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def available_device_bytes() -> int | None:
    """Free memory of the GPU the runner will use (its device 0), from NVML; None when NVML
    cannot say (no driver, no pynvml)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_*: nothing to check against
        return None
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        if visible.startswith(("GPU-", "MIG-")):
            handle = pynvml.nvmlDeviceGetHandleByUUID(visible)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def shortfall(need_bytes: int, what: str, *, on_device: bool) -> str | None:
    """The problem when ``need_bytes`` for ``what`` exceed the free memory, else None."""
    free = available_device_bytes() if on_device else available_host_bytes()
    if free is None or need_bytes <= free:
        return None
    where = "the GPU" if on_device else "the host"
    return (
        f"{what} needs {format_bytes(need_bytes)}, more than the {format_bytes(free)} "
        f"free on {where}"
    )
