"""The machine's peaks the per-step roofline is judged against (``analysis/roofline.py``).

* HBM read bandwidth, **measured**: ``torch.sum`` over a bf16 tensor (1 GiB, or a quarter of
  the free device memory when that is less), bytes over the best of ``REPEATS`` timed sums
  (CUDA events), as ``benchmarks/decode_roofline.py`` measures it. Once per GPU: a later run on
  the same GPU (its NVML UUID) takes the figure from the database (``cached``), and
  ``probes.hbm_gbps`` gives it instead of measuring (``given``).
* The dense 16-bit tensor-core peak, from a **table** of the GPUs NVIDIA publishes it for
  (datasheets, dense bf16/fp16, boost clock); an unknown GPU, or a run in float32, has none and
  says so: the compute roof is never guessed.

Runs in the runner process after start-up, before the first step; nothing here runs per step.
"""

from __future__ import annotations

import re
from typing import Any

# (pattern on torch.cuda.get_device_name(), dense bf16/fp16 tensor TFLOP/s); the first match wins
TENSOR_TFLOPS = (
    (r"H100.*PCIe", 756.0),
    (r"H100 NVL|H200 NVL", 835.0),
    (r"H100|H200|GH200", 989.4),
    (r"B200|GB200", 2250.0),
    (r"A100", 312.0),
    (r"L40S", 362.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
)
REPEATS = 10
MAX_BYTES = 1 << 30
MIN_BYTES = 64 << 20  # less free memory than 4x this: not measured, said


def tensor_peak(gpu_name: str | None, dtype: str) -> tuple[float | None, str]:
    """``(FLOP/s or None, how it was found)`` of the GPU's dense tensor cores for ``dtype``."""
    if not gpu_name:
        return None, "no GPU"
    if dtype not in ("bfloat16", "float16"):
        return None, f"the table holds 16-bit peaks; this run is {dtype}"
    for pattern, tflops in TENSOR_TFLOPS:
        if re.search(pattern, gpu_name):
            return tflops * 1e12, f"table: {gpu_name}, dense 16-bit, {tflops:g} TFLOP/s"
    return None, f"{gpu_name} is not in the table of tensor-core peaks"


def read_bandwidth(device: str) -> tuple[float | None, str]:
    """``(bytes/s or None, how)``: the best of ``REPEATS`` ``torch.sum`` over a bf16 tensor."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    nbytes = min(MAX_BYTES, free // 4) // 2 * 2
    if nbytes < MIN_BYTES:
        return None, f"not measured: {free / 2**20:.0f} MiB free on the device"
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    x.sum()  # the reduction kernel loaded before timing
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(REPEATS):
        start.record()
        x.sum()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del x
    torch.cuda.empty_cache()
    how = f"measured: torch.sum over {nbytes / 2**20:.0f} MiB bf16, best of {REPEATS}"
    return nbytes / best, how


def machine_peaks(
    device: str,
    environment: dict[str, Any],
    dtype: str,
    given_gbps: float,
    known: dict[str, list[Any]] | None = None,
) -> dict[str, Any]:
    """The run's peaks (``runs.info['machine_peaks']``): HBM read bytes/s and the tensor-core
    FLOP/s, each with its source. ``known``: GPU UUID -> [bytes/s, the run that measured it]
    (from the database); ``given_gbps`` > 0: ``probes.hbm_gbps`` (GB/s, no measurement)."""
    if not device.startswith("cuda"):
        return {"note": "the CPU has no device timeline"}
    uuid, name = environment.get("gpu_uuid"), environment.get("gpu_name")
    flops, flops_source = tensor_peak(name, dtype)
    cached = (known or {}).get(uuid) if uuid else None
    if given_gbps > 0:
        bandwidth, source = given_gbps * 1e9, f"given: probes.hbm_gbps = {given_gbps:g}"
    elif cached is not None:
        bandwidth, source = float(cached[0]), f"cached: measured by run {cached[1]}"
    else:
        bandwidth, source = read_bandwidth(device)
    return {
        "gpu_uuid": uuid,
        "gpu_name": name,
        "hbm_read_bytes_per_s": bandwidth,
        "hbm_source": source,
        "tensor_flops_per_s": flops,
        "tensor_source": flops_source,
    }
