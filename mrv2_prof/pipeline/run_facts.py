"""The run's facts (``runs.info``) the runner process writes: the software it ran with
(``versions``), what start-up derived (``startup_facts``, from the engine's ``RuntimeInfo``, with
the start-up's seconds and the notes) and what the step loop left (``loop_facts``: CPU use and
the resources still held).
"""

from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np

from mrv2_prof import __version__


def versions() -> dict[str, str]:
    import duckdb
    import torch

    v = {
        "mrv2_prof": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "duckdb": duckdb.__version__,
    }
    if torch.cuda.is_available():
        v["cuda"] = str(torch.version.cuda)
        v["gpu"] = torch.cuda.get_device_name()
    return v


def startup_facts(info, startup_s: float, num_requests: int, notes: list[str]) -> dict[str, Any]:
    """The run's start-up facts (``runs.info``) from the engine's ``RuntimeInfo``."""
    return {
        "device": info.device,
        "dtype": info.dtype,
        "model_params": info.model_params,
        "num_kv_blocks": info.num_kv_blocks,
        "kv_cache_bytes": info.kv_cache_bytes,
        "weight_load_s": info.weight_load_s,
        "profile_run_s": info.profile_run_s,
        "kv_alloc_s": info.kv_alloc_s,
        "kernel_warmup_s": info.warmup_s,
        "capture_s": info.capture_s,
        "graph_memory_bytes": info.graph_memory_bytes,
        "num_graphs": info.num_graphs,
        "draft_kv_cache_bytes": info.draft_kv_cache_bytes,  # spec_decode draft_model
        "draft_capture_s": info.draft_capture_s,
        "spec_drafts_on": info.spec_drafts_on,  # spec_decode: where drafts are made and kept
        "triton_key_s": info.triton_key_s,  # worker/triton_key_prefetch.py: hashed on a thread
        "triton_key_wait_s": info.triton_key_wait_s,  # ... and waited for (in "other")
        "step_cost": info.step_cost,  # the per-step roofline's constants (model/step_cost.py)
        "memory": info.memory,  # device memory at start-up (worker/memory_breakdown.py)
        "startup_s": startup_s,
        "num_requests": num_requests,
        "notes": list(info.notes) + notes,
    }


def loop_facts(facts: dict[str, Any], engine, cpu0: float, wall0: float) -> None:
    """After the step loop: the runner process's CPU time over the loop's wall time (cores
    busy, all its threads) and the slots and KV blocks still held (``leaks``: 0 and 0 when
    every request was finished or aborted and freed what it held)."""
    wall = time.perf_counter() - wall0
    if wall > 0:
        facts["runner_cpu_util"] = (time.process_time() - cpu0) / wall
    facts["leaks"] = {**engine.held_resources(), "unfinished": len(engine.unfinished_requests())}
