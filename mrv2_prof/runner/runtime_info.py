"""What the runner derived at start-up (``RuntimeInfo``): the device and dtype it runs on, the KV
cache it sized, the seconds each start-up phase took, the graphs it captured, the roofline's
constants and the memory accounted; never written back into the config. The harness stores it
as the run's start-up facts (``pipeline/run_facts.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RuntimeInfo:
    """What the runner derived at start-up (never written back into the config)."""

    device: str = "cpu"
    dtype: str = "float32"
    num_kv_blocks: int = 0
    kv_cache_bytes: int = 0
    model_params: int = 0
    weight_load_s: float = 0.0
    profile_run_s: float = 0.0
    kv_alloc_s: float = 0.0
    warmup_s: float = 0.0  # compiling the Triton kernels before the first step
    capture_s: float = 0.0  # capturing the CUDA graphs
    graph_memory_bytes: int = 0  # reserved memory the graphs' pool grew by
    num_graphs: int = 0  # captured keys (a PIECEWISE key is one graph per segment)
    peak_activation_bytes: int = 0  # the profiling run's peak above what was allocated before
    draft_kv_cache_bytes: int = 0  # speculative draft model: its KV cache and draft probs
    draft_capture_s: float = 0.0  # capturing the draft model's fused draft graphs
    spec_drafts_on: str = ""  # speculative decoding: "device" or "host" (the drafter's choice)
    triton_key_s: float | None = None  # triton's cache key hashed on a thread (None: no thread)
    triton_key_wait_s: float = 0.0  # start-up's wait for that thread before its first launch
    step_cost: dict[str, Any] = field(default_factory=dict)  # model/step_cost.py: the roofline's
    memory: dict[str, Any] = field(default_factory=dict)  # worker/memory_breakdown.py
    notes: list[str] = field(default_factory=list)
