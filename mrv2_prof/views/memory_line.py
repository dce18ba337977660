"""The memory row of the summary and the report: the device memory a run accounted at start-up
(``runs.info['memory']``, runner/worker/memory_breakdown.py) on one line, and the memory-history
file of a ``probes.memory_history`` window (``runs.info['memory_history_file']``).

A run stored before the breakdown existed, and a CPU run (whose breakdown is only a note), have
no memory row.
"""

from __future__ import annotations

from typing import Any

from mrv2_prof.views.format import format_bytes


def _bytes(value: Any) -> str:
    if not isinstance(value, int) or isinstance(value, bool):
        return "?"
    return "-" + format_bytes(-value) if value < 0 else format_bytes(value)


def memory_line(memory: Any) -> str | None:
    """``weights X, KV cache Y, activations Z, graphs W in N pools, non-torch V, free U of T``;
    None without a device breakdown."""
    if not isinstance(memory, dict) or "total_bytes" not in memory:
        return None
    pools = memory.get("graph_pools")
    pools = pools if isinstance(pools, list) else []
    peak = memory.get("activation_peak_bytes")
    activations = "not profiled" if peak is None else _bytes(peak)
    graphs = f"graphs {_bytes(memory.get('graph_bytes'))} in {len(pools)} "
    graphs += "pool" if len(pools) == 1 else "pools"
    keys = sum(len(p.get("keys") or []) for p in pools if isinstance(p, dict))
    if memory.get("shared_pool"):
        graphs += f" shared by {keys} keys"
    return (
        f"weights {_bytes(memory.get('weights_bytes'))}, "
        f"KV cache {_bytes(memory.get('kv_cache_bytes'))}, activations {activations}, {graphs}, "
        f"non-torch {_bytes(memory.get('non_torch_bytes'))}, "
        f"free {_bytes(memory.get('free_bytes'))} of {_bytes(memory.get('total_bytes'))}"
    )


def memory_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """The run's ``memory`` row and its ``memory history`` file, each where the run has one."""
    rows = []
    line = memory_line(info.get("memory"))
    if line is not None:
        rows.append(("memory", line))
    path = info.get("memory_history_file")
    if isinstance(path, str) and path:
        rows.append(("memory history", path))
    return rows
