"""Device memory accounted at start-up (vLLM logs the same breakdown after its profiling run):
the device's total and free memory, the weights, the KV cache, the profiling run's activation
peak, the CUDA graphs' memory pools, the rest of torch's reserved memory and what is outside
torch (the CUDA context, cuBLAS and NCCL workspaces, other processes), into ``runs.info['memory']``.

The graph memory is the allocator's own accounting: the bytes of the segments in
``torch.cuda.memory_snapshot()`` whose ``segment_pool_id`` is a captured graph's pool
(``CUDAGraph.pool()``). The runner's graphs share one pool (and a draft model's fused graphs
another), so a key has no segments of its own: a shared pool is given whole with its keys, and
each key's growth of the reserved memory while it was captured (``CaptureRecord.mem_bytes``)
beside it. ``account`` is the arithmetic, a pure function; ``memory_breakdown`` reads the
figures from a started runner.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

CPU_NOTE = "no device memory accounting on the CPU"

Pool = tuple[int, ...]


def account(
    *,
    total: int,
    free: int,
    torch_reserved: int,
    weights: int,
    kv_cache: int,
    activation_peak: int | None,
    pools: dict[Pool, tuple[list[str], int]],
    key_growth: dict[str, int] | None = None,
    pinned_host: int | None = None,
) -> dict[str, Any]:
    """The breakdown from the device's figures: ``pools`` maps a graph pool to its keys and the
    bytes of its segments. Other torch memory is the reserved bytes less weights, KV cache and
    graph pools (input buffers, the sampler's and staged writes' tensors, the allocator's cache);
    non-torch memory is what the device uses beyond torch's reserved bytes. The activation peak
    was freed after the profiling run: a figure, not a part of the reserved bytes."""
    graph_pools = [
        {"pool": ",".join(str(p) for p in pool), "keys": list(keys), "bytes": int(size)}
        for pool, (keys, size) in sorted(pools.items(), key=lambda kv: -kv[1][1])
    ]
    graph_bytes = sum(p["bytes"] for p in graph_pools)
    return {
        "total_bytes": int(total),
        "free_bytes": int(free),
        "torch_reserved_bytes": int(torch_reserved),
        "weights_bytes": int(weights),
        "kv_cache_bytes": int(kv_cache),
        "activation_peak_bytes": None if activation_peak is None else int(activation_peak),
        "graph_bytes": graph_bytes,
        "graph_pools": graph_pools,
        "shared_pool": any(len(p["keys"]) > 1 for p in graph_pools),
        "key_growth_bytes": dict(key_growth or {}),
        "other_torch_bytes": int(torch_reserved) - int(weights) - int(kv_cache) - graph_bytes,
        "non_torch_bytes": (int(total) - int(free)) - int(torch_reserved),
        "pinned_host_bytes": pinned_host,
    }


def pool_segment_bytes(segments: Iterable[dict], device: int) -> dict[Pool, int]:
    """Bytes of the allocator's segments per pool id on ``device`` (a snapshot's segments)."""
    out: dict[Pool, int] = {}
    for seg in segments:
        if seg.get("device", device) != device:
            continue
        pool = tuple(int(x) for x in seg.get("segment_pool_id") or ())
        out[pool] = out.get(pool, 0) + int(seg["total_size"])
    return out


def graph_pools(runner) -> Iterator[tuple[str, Pool]]:
    """(key, pool id) of every captured graph: the runner's FULL (and their sampling graphs),
    FULL verify and PIECEWISE keys, and a draft model's fused draft graphs."""
    gr = getattr(runner, "graph_runner", None)
    if gr is not None:
        for size, graph in (*gr.full_graphs.items(), *gr.sample_graphs.items()):
            key = f"full:{size}" if isinstance(size, int) else f"full:{size[0]}x{size[1]}"
            yield key, _pool(graph)
        for size, graphs in gr.piece_graphs.items():
            for graph in graphs:
                yield f"piecewise:{size}", _pool(graph)
    drafter = getattr(runner, "drafter", None)
    draft = getattr(drafter, "graphs", None) if drafter is not None else None
    for (size, k, sampled, q), graph in (getattr(draft, "graphs", None) or {}).items():
        key = f"draft:{size}xk{k}" + (":sampled" if sampled else "") + (f":q{q}" if q else "")
        yield key, _pool(graph)


def _pool(graph) -> Pool:
    return tuple(int(x) for x in graph.pool())


def weight_bytes(modules: Iterable) -> int:
    """Bytes of the modules' parameters, a storage shared between them (a draft model made of
    the target's first layers) counted once."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        for p in module.parameters():
            ptr = p.untyped_storage().data_ptr()
            if ptr in seen:
                continue
            seen.add(ptr)
            total += p.untyped_storage().nbytes()
    return total


def memory_breakdown(runner) -> dict[str, Any]:
    """The start-up breakdown of a started runner (after ``startup.start_up``)."""
    if not runner.is_cuda:
        return {"note": CPU_NOTE}
    import torch

    device = torch.device(runner.device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    segments = pool_segment_bytes(torch.cuda.memory_snapshot(), index)
    pools: dict[Pool, tuple[list[str], int]] = {}
    for key, pool in graph_pools(runner):
        keys = pools.setdefault(pool, ([], segments.get(pool, 0)))[0]
        if key not in keys:
            keys.append(key)
    drafter = getattr(runner, "drafter", None)
    draft_model = getattr(getattr(drafter, "state", None), "model", None)
    info = runner.info
    return account(
        total=total,
        free=free,
        torch_reserved=torch.cuda.memory_reserved(device),
        weights=weight_bytes([runner.model, *([draft_model] if draft_model is not None else [])]),
        kv_cache=info.kv_cache_bytes + info.draft_kv_cache_bytes,
        activation_peak=info.peak_activation_bytes if info.profile_run_s else None,
        pools=pools,
        key_growth={r.key: r.mem_bytes for r in runner.graphs.captures},
        pinned_host=_pinned_host_bytes(torch),
    )


def _pinned_host_bytes(torch) -> int | None:
    """Pinned host memory the caching host allocator holds (None where torch does not say)."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    try:
        return int(stats()["allocated_bytes.current"]) if stats is not None else None
    except (KeyError, RuntimeError):
        return None
