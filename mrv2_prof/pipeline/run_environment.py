"""The environment a run ran in, stored with it (``runs.environment``, JSON).

Host: its name (``host``, ``platform.node()``), CPU model and count, the load average at start
and at end (a busy host slows the step loop it measures) and the seconds the run had been going
when each was read (``load_avg_start_after_s``, ``load_avg_end_after_s``), the CPU time the
hypervisor stole (``/proc/stat``'s ``steal`` and all ticks, ``[steal, total]``, at start and end:
Linux only), the thread settings (the user's ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, torch's
intra- and inter-op threads, how the runner chose them: ``torch_threads_set_by``,
``runner_threads``) and the runner processes (tensor-parallel ranks). ``host_contention`` reads
them. Software: python, torch, its CUDA and cuDNN. GPU (CUDA runs): name, driver version, SM and
memory clocks and their maxima (NVML, when the package and a driver are there; else a note says
why not), its UUID, and the other processes computing on it at the start (``gpu_cotenants``:
pid, used MiB and name from ``/proc`` when readable; the runner's own process left out).
``gpu_identity`` is the GPU's name and driver read without torch, for the parent
(``pipeline/resume.py``). ``compare`` warns when two runs differ in hardware or torch
(``views/environment.py`` says how an environment is shown and compared).
"""

from __future__ import annotations

import os
import platform
from typing import Any


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def steal_ticks() -> list[int] | None:
    """``[steal, total]`` ticks of all CPUs since boot (``/proc/stat``; None where the OS does
    not report steal time)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    try:
        ticks = [int(x) for x in fields[1:]]
    except ValueError:
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: inside user and nice]
    return [ticks[7], sum(ticks[:8])]


def run_environment(
    device: str, after_s: float | None = None, processes: int = 1, threads_set_by: str | None = None
) -> dict[str, Any]:
    """The environment at the start of a run on ``device``, ``after_s`` seconds into it;
    ``processes``: the runner's processes (tensor-parallel ranks); ``threads_set_by``: how its
    threads were chosen (``runner_threads``; None: torch's default or the caller's, in-process)."""
    import torch

    omp = os.environ.get("OMP_NUM_THREADS")
    if threads_set_by is not None and not threads_set_by.startswith("OMP_NUM_THREADS="):
        omp = None  # the runner set it for its ranks: the user did not
    env: dict[str, Any] = {
        "host": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_avg_start": load_average(),
        "load_avg_start_after_s": None if after_s is None else round(after_s, 2),
        "cpu_steal_ticks_start": steal_ticks(),
        "runner_processes": processes,
        "torch_threads_set_by": threads_set_by or "torch's default or the caller's (in-process)",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "OMP_NUM_THREADS": omp,
        "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu_name"] = torch.cuda.get_device_name()
        env.update(_nvml_facts(device))
        env.update(gpu_cotenants(device))
    return env


def _nvml_handle(pynvml, device: str):
    """The run's GPU as CUDA finds it (as ``probes.nvml_sampler`` does): the first entry of
    ``CUDA_VISIBLE_DEVICES`` (an index or a ``GPU-`` UUID) when set, else ``cuda:N``'s N."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.startswith("GPU-"):
        return pynvml.nvmlDeviceGetHandleByUUID(visible)
    index = int(visible) if visible.isdigit() else 0
    if not visible.isdigit() and ":" in device:
        index = int(device.split(":")[1])
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def _nvml_facts(device: str) -> dict[str, Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no package, no driver
        return {"gpu_note": f"NVML not available ({type(exc).__name__}): no driver or clocks"}
    try:
        h = _nvml_handle(pynvml, device)
        driver = pynvml.nvmlSystemGetDriverVersion()
        clocks = {
            "gpu_sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "gpu_mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "gpu_max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "gpu_max_mem_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
        }
        uuid = pynvml.nvmlDeviceGetUUID(h)
        return {
            "gpu_driver": driver.decode() if isinstance(driver, bytes) else driver,
            "gpu_uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
            **clocks,
        }
    except Exception as exc:
        return {"gpu_note": f"NVML query failed ({type(exc).__name__})"}
    finally:
        pynvml.nvmlShutdown()


def gpu_identity(device: str) -> dict[str, Any]:
    """The GPU a run on ``device`` would take, as NVML names it (``gpu_name``, ``gpu_driver``),
    read without torch; empty when there is no NVML or no such GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no package, no driver
        return {}
    try:
        h = _nvml_handle(pynvml, device)
        name, driver = pynvml.nvmlDeviceGetName(h), pynvml.nvmlSystemGetDriverVersion()
        return {
            "gpu_name": name.decode() if isinstance(name, bytes) else name,
            "gpu_driver": driver.decode() if isinstance(driver, bytes) else driver,
        }
    except Exception:
        return {}
    finally:
        pynvml.nvmlShutdown()


def _process_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() or None
    except OSError:  # gone, not ours to read, or a pid of another namespace
        return None


def gpu_cotenants(device: str) -> dict[str, Any]:
    """``gpu_cotenants``: the processes other than this one computing on the run's GPU now,
    each ``{"pid", "used_mib", "name"}`` (None where NVML or ``/proc`` does not tell); where
    NVML cannot list them, ``gpu_cotenants_note`` says why; nothing without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no package, no driver: _nvml_facts has said so
        return {}
    try:
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(_nvml_handle(pynvml, device))
    except Exception as exc:
        return {
            "gpu_cotenants_note": f"NVML could not list the GPU's processes ({type(exc).__name__})"
        }
    finally:
        pynvml.nvmlShutdown()
    own, found = os.getpid(), []
    for p in processes:
        if p.pid == own:
            continue
        used = getattr(p, "usedGpuMemory", None)
        mib = round(used / 2**20) if isinstance(used, int) and 0 <= used < 2**62 else None
        found.append({"pid": p.pid, "used_mib": mib, "name": _process_name(p.pid)})
    return {"gpu_cotenants": found}


def finish_environment(env: dict[str, Any], after_s: float | None = None) -> dict[str, Any]:
    """``env`` with the load average and steal ticks at the end of the run, ``after_s``
    seconds into it."""
    return {
        **env,
        "load_avg_end": load_average(),
        "load_avg_end_after_s": None if after_s is None else round(after_s, 2),
        "cpu_steal_ticks_end": steal_ticks(),
    }
