"""A run's stored environment (``runs.environment``, recorded by ``pipeline/run_environment.py``)
as the views show it: one line for the summary and the report (where it ran: the host, the GPU
and the other processes on it at the start, as well), and the settings in which two runs differ
for ``compare``."""

from __future__ import annotations

from typing import Any

# Keys whose difference makes two runs' numbers hard to compare (``environment_differences``).
HARDWARE_KEYS = ("cpu_model", "cpu_count", "gpu_name", "gpu_driver")
SOFTWARE_KEYS = ("torch", "cuda")
THREAD_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "torch_threads", "torch_interop_threads")


def environment_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """One line per hardware, software or thread setting in which two runs differ (a run
    stored before environments were recorded has none: nothing to say)."""
    if not a or not b:
        return []
    lines = []
    for kind, keys in (("hardware", HARDWARE_KEYS), ("software", SOFTWARE_KEYS),
                       ("threads", THREAD_KEYS)):  # fmt: skip
        for key in keys:
            if a.get(key) != b.get(key):
                lines.append(f"{kind}: {key} differs ({a.get(key)} vs {b.get(key)})")
    return lines


def environment_line(env: dict | None) -> str | None:
    """The run's environment in one line (None: not recorded)."""
    if not env:
        return None
    load = env.get("load_avg_start")
    end = env.get("load_avg_end")
    parts = [f"host {_short(str(env['host']))}"] if env.get("host") else []
    parts.append(f"{env.get('cpu_model', '?')} x{env.get('cpu_count', '?')}")
    if load:
        parts.append(f"load {load[0]:.2f}" + (f" -> {end[0]:.2f}" if end else ""))
    threads = env.get("OMP_NUM_THREADS") or "unset"
    set_by = env.get("torch_threads_set_by")
    chosen = f" ({set_by})" if set_by and not set_by.startswith(("OMP_", "torch's")) else ""
    parts.append(f"threads torch {env.get('torch_threads', '?')}{chosen}, OMP {threads}")
    cuda = env.get("cuda")
    parts.append(f"torch {env.get('torch', '?')}" + (f" / CUDA {cuda}" if cuda else ""))
    if env.get("gpu_name"):
        gpu = f"{env['gpu_name']}"
        if env.get("gpu_driver"):
            gpu += f", driver {env['gpu_driver']}"
        if env.get("gpu_sm_clock_mhz") is not None:
            gpu += f", SM {env['gpu_sm_clock_mhz']}/{env.get('gpu_max_sm_clock_mhz', '?')} MHz"
        if env.get("gpu_cotenants"):
            gpu += f", {cotenants_text(env['gpu_cotenants'])}"
        parts.append(gpu)
    return "; ".join(parts)


def cotenants_text(cotenants: list[dict[str, Any]]) -> str:
    """The other processes on a run's GPU at its start, in a few words: how many, the memory
    they held, the first names."""
    n = len(cotenants)
    mib = sum(c.get("used_mib") or 0 for c in cotenants)
    names = sorted({str(c["name"]) for c in cotenants if c.get("name")})
    named = f": {_short(', '.join(names[:3]))}" if names else ""
    return f"shared with {n} other process{'es' if n != 1 else ''} ({mib:,} MiB{named})"


def _short(text: str, width: int = 32) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
