"""Device time of kernel launches as a model's CUDA graph runs them (shared by the kernel
benchmarks). A small decode kernel timed one Python launch at a time (``triton.testing.do_bench``)
measures the host's launch cost, tens of µs, more than the kernel: the GPU idles between
launches. Captured in a graph the launches run back to back, as in a FULL decode step.

``graph_time_us(calls)``: the calls captured once in order (warmed first, outside the capture),
the graph replayed 7 times; the median replay's device time over the number of calls.
``in_graph_us(fn)``: ``fn`` launched ``LAUNCHES`` times in one graph. A call that reads the same
data each time finds it in L2 when it is small (a batch's KV under ~50 MB on an H200), which a
model's step, reading each layer's KV once, does not: such a row is a lower bound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

LAUNCHES = 20


def graph_time_us(calls: Sequence[Callable[[], object]], repeats: int = 7) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:  # compile and warm outside the capture
            c()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return sorted(times)[len(times) // 2]


def in_graph_us(fn: Callable[[], object], launches: int = LAUNCHES) -> float:
    """µs per launch of ``fn`` run ``launches`` times back to back in one CUDA graph."""
    return graph_time_us([fn] * launches)
