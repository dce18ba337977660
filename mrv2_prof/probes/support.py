"""Which scenario probes this build can record, and a note for each one it cannot.

The ``probes`` section asks for measurements (NVTX ranges, CUDA-event GPU timeline, the sync
finder, the copy audit, NVML telemetry, a kernel trace). A probe asked for but not available is
never silently skipped: it becomes a note on the run, or an error under ``runner.strict``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

# Recorded by every run regardless of the section: CPU-clock phase spans, steps, staged writes,
# graph dispatch decisions, the explicit output wait, requests and tokens. Of the switchable
# probes, these are built (each may still need a package, see ``_missing_package``):
AVAILABLE: frozenset[str] = frozenset(
    {"nvtx", "nvml_hz", "sync_finder", "cuda_events", "copy_audit", "kernel_trace"}
)
_PACKAGES = {"nvtx": ("nvtx", "nvtx"), "nvml_hz": ("pynvml", "nvidia-ml-py")}  # module, pip

_WHAT = {
    "nvtx": "NVTX ranges",
    "cuda_events": "GPU timeline, overlap and bubbles",
    "sync_finder": "implicit syncs by source site",
    "copy_audit": "the copies table",
    "nvml_hz": "NVML telemetry",
    "kernel_trace": "the kernels table",
}


# Probes that measure CUDA: on a CPU run each one asked for is this note.
_CPU_WHY = {
    "cuda_events": "there is no GPU timeline",
    "copy_audit": "no copy crosses a host-device bus",
    "sync_finder": "there are no CUDA syncs to find",
    "kernel_trace": "there are no CUDA kernels",
}


def cpu_probe_notes(probes: dict[str, Any]) -> list[str]:
    """One note per asked-for probe that needs CUDA, for a run on the CPU."""
    return [
        f"probes.{key}: the run is on the CPU; {why}"
        for key, why in _CPU_WHY.items()
        if probes.get(key)
    ]


def unavailable_probe_notes(probes: dict[str, Any]) -> list[str]:
    """One note per requested probe this build does not record."""
    notes = []
    for key, what in _WHAT.items():
        wanted = bool(probes.get(key))
        if wanted and key not in AVAILABLE:
            notes.append(f"probes.{key}: not recorded by this build ({what})")
        elif wanted and _missing_package(key):
            notes.append(f"probes.{key}: needs the {_PACKAGES[key][1]} package ({what})")
    return notes


def _missing_package(key: str) -> bool:
    package = _PACKAGES.get(key)
    return package is not None and importlib.util.find_spec(package[0]) is None
