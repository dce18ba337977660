"""GPU telemetry from NVML, sampled by a thread of the parent process (never the runner's).

At ``hz`` samples per second: GPU utilisation (%), memory used (bytes), power (W), SM clock
(MHz) and the total energy counter (mJ since the driver loaded) of the GPU the run uses, each
stamped with ``perf_counter_ns`` (the same monotonic clock as the runner process's records on
this machine). Only device-wide queries: per-process ones are slow. A quantity this GPU does not
report is NaN (the energy counter, an integer column: masked, NULL in the store, and one
``energy_note``); NVML itself missing (no driver, a CPU machine, the package not installed) is
one note, not an error.

The GPU is found like CUDA finds it: the first entry of ``CUDA_VISIBLE_DEVICES`` (an index or a
``GPU-…`` UUID) when set, else the device index of the run (``cuda:N``).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from time import perf_counter_ns
from typing import Any

import numpy as np

from mrv2_prof.probes.columns import from_rows

_NO_ENERGY = -1  # the energy counter not reported (a counter in mJ is never negative)
ENERGY_NOTE = "probes.nvml_hz: this GPU does not report NVML's energy counter; no energy per token"


class NvmlSampler:
    def __init__(self, hz: float, device: str, nvml: Any | None = None) -> None:
        self.hz = hz
        self.device = device  # the run's torch device, e.g. "cuda:0"
        self._nvml = nvml  # the pynvml module (tests pass a fake)
        self._handle = None
        self._rows: list[tuple[int, float, int, float, float, int]] = []  # gpu_samples columns
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.note: str | None = None  # why nothing is sampled
        self.energy_note: str | None = None  # why the energy counter is not (set at the start)

    def start(self) -> bool:
        """Open NVML and start sampling; False (with ``note`` set) when that is impossible."""
        if not self.device.startswith("cuda"):
            self.note = "probes.nvml_hz: the run is on the CPU; no GPU telemetry"
            return False
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            self._handle = self._device_handle()
        except Exception as exc:  # ImportError, NVMLError_*: reported, never raised
            why = _one_line(exc)
            self.note = f"probes.nvml_hz: NVML is not available ({why}); no GPU telemetry"
            return False
        self.sample()  # one sample at once, so even a short run has one
        if self._rows[-1][-1] == _NO_ENERGY:
            self.energy_note = ENERGY_NOTE
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()
        return True

    def _device_handle(self):
        nvml = self._nvml
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        index = int(self.device.split(":")[1]) if ":" in self.device else 0
        if visible.startswith("GPU-"):
            return nvml.nvmlDeviceGetHandleByUUID(visible)
        if visible.isdigit():
            index = int(visible)
        return nvml.nvmlDeviceGetHandleByIndex(index)

    def _loop(self) -> None:
        period = 1.0 / self.hz
        while not self._stop.wait(period):
            self.sample()

    def sample(self) -> None:
        nvml, h = self._nvml, self._handle
        row = (
            perf_counter_ns(),
            _read(lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)),
            int(_read(lambda: nvml.nvmlDeviceGetMemoryInfo(h).used, -1)),
            _read(lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
            _read(lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))),
            int(_read(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h), _NO_ENERGY)),
        )
        with self._lock:
            self._rows.append(row)

    def latest(self) -> tuple[int, float, int, float, float] | None:
        """The newest sample's telemetry (time, utilisation, memory, power, SM clock)."""
        with self._lock:
            return self._rows[-1][:5] if self._rows else None

    def stop(self) -> dict[str, np.ndarray]:
        """Stop sampling; the samples as the ``gpu_samples`` columns (without ``run_id``), the
        energy counter masked where the GPU did not report it (NULL in the store)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._handle is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._handle = None
        with self._lock:
            rows, self._rows = self._rows, []
        cols = from_rows("gpu_samples", rows)
        cols["energy_mj"] = np.ma.masked_equal(cols["energy_mj"], _NO_ENERGY)
        return cols


def _read(fn, missing: float = math.nan):
    """One NVML query; a quantity this GPU does not report is ``missing``."""
    try:
        return fn()
    except Exception:
        return missing


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
