"""The scenario as it ran: the scenario as given, with what the run actually did put back in.

``runs.scenario_given_yaml`` keeps the scenario as given (the file plus ``--set``);
``runs.scenario_yaml`` the scenario as run: the database it was written to (``--db``), and every
value the runner resolved or downgraded — the device, dtype, kernel set, UVA, the decode kernel
paths (``auto`` resolved), the CUDA graph mode and capture sizes that were captured, the KV
blocks, the ``max_model_len`` ``auto`` took — and the probes that could record on
that device. Running the stored ``scenario_yaml`` again asks for exactly what ran (a round trip:
``as_run`` of it changes nothing). Auto capture sizes that the workload bounded stay ``auto``: a
list cannot say that FULL graphs stop below PIECEWISE ones, and a re-run of the same workload
bounds them alike (the captured keys are in the ``graph_captures`` rows).
"""

from __future__ import annotations

import copy
from typing import Any

FULL_AND_PIECEWISE = "full_and_piecewise"
_CUDA_PROBES = ("cuda_events", "sync_finder", "copy_audit", "kernel_trace")


def graph_mode(full_sizes: tuple[int, ...], piecewise_sizes: tuple[int, ...]) -> str:
    """The ``cudagraph_mode`` that captures exactly these sizes."""
    if full_sizes and piecewise_sizes:
        return FULL_AND_PIECEWISE
    if full_sizes:
        return "full"
    return "piecewise" if piecewise_sizes else "none"


def as_run(
    given: dict[str, Any],
    *,
    db_path: str,
    device: str,
    dtype: str,
    kernels: str,
    uva: bool,
    full_sizes: tuple[int, ...],
    piecewise_sizes: tuple[int, ...],
    num_kv_blocks: int,
    nvtx: bool,
    max_model_len: int | None = None,
    bounded_by_workload: bool = False,
    kernel_paths: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``given`` (a scenario's ``model_dump``) with what the run resolved (``max_model_len``:
    the length ``auto`` resolved to, when given; ``kernel_paths``: the decode paths taken,
    ``runner/worker/kernel_paths.resolved_paths``)."""
    s = copy.deepcopy(given)
    s.setdefault("store", {})["db"] = db_path
    runner = s.setdefault("runner", {})
    runner["device"] = "cuda" if device.startswith("cuda") else "cpu"
    runner["kernels"] = kernels
    runner["uva"] = bool(uva)
    mode = graph_mode(full_sizes, piecewise_sizes)
    runner["cudagraph_mode"] = mode
    if mode != "none" and not bounded_by_workload:
        runner["cudagraph_capture_sizes"] = sorted(set(full_sizes) | set(piecewise_sizes))
    runner["num_kv_blocks"] = int(num_kv_blocks)
    if max_model_len is not None:
        runner["max_model_len"] = int(max_model_len)
    runner.update(kernel_paths or {})
    s.setdefault("model", {})["dtype"] = dtype
    probes = s.setdefault("probes", {})
    if runner["device"] == "cpu":
        for key in _CUDA_PROBES:
            if probes.get(key):
                probes[key] = False
        if probes.get("memory_history") is not None:  # a window, not a switch: none ran
            probes["memory_history"] = None
    if probes.get("nvtx") and not nvtx:
        probes["nvtx"] = False
    return s


def engine_as_run(given: dict[str, Any], db_path: str, engine: Any, nvtx: bool) -> dict[str, Any]:
    """``as_run`` with the facts of a started ``runner.engine.Engine``."""
    runner = engine.runner
    plan = runner.graphs.plan
    info = engine.info
    return as_run(
        given,
        db_path=db_path,
        device=info.device,
        dtype=info.dtype,
        kernels=runner.kernels.name,
        uva=runner.uva,
        full_sizes=tuple(plan.full_sizes),
        piecewise_sizes=tuple(plan.piecewise_sizes),
        num_kv_blocks=info.num_kv_blocks,
        nvtx=nvtx,
        max_model_len=engine.config.max_model_len,
        bounded_by_workload=plan.bounded_by_workload,
        kernel_paths=getattr(runner, "kernel_paths", None),
    )
