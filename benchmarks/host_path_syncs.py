"""Part (f) of ``host_path.py``: the sync finder's host cost per decode step.

The torch calls one async FULL-graph decode step makes through the entry points the host-wait
catcher wraps (``probes.host_waits``) are replayed, alone, with the sync finder and the catcher
around them (``--probe-sets``' ``+sync_finder``) and without: the step inputs' and a staged
write's non-blocking host -> device copies, the sampler's index conversion, the sampled tokens'
non-blocking copy back, the output wait (``wait_deliberately`` around the ready event's
``synchronize``) and the ``tolist`` of the pinned result. Sides alternate in blocks of steps;
the cost is the median per-step difference.

On a GPU the tensors are real (pinned host, device), the event is a CUDA event and torch's sync
debug mode is on (the output wait lifts it). On the CPU every tensor is a host tensor, the event
is a stand-in whose ``synchronize`` returns at once and the debug mode is not set (a CPU build
has none): what is timed is the wrappers' own path for calls that make no wait; the copies'
pinned-memory check and the debug-mode switch around the output wait act only on CUDA.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

BLOCK_STEPS = 200  # steps per side before switching


class _HostEvent:
    """The CPU's stand-in for the ready event (``synchronize`` returns at once)."""

    def synchronize(self) -> None:
        return None


def _step_calls(batch: int, cuda: bool):
    """The replayed step: a function making one decode step's wrapped torch calls."""
    import torch

    from mrv2_prof.probes.api import wait_deliberately

    dev = torch.device("cuda" if cuda else "cpu")

    def host(n: int, dtype=torch.int64):
        t = torch.zeros(n, dtype=dtype)
        return t.pin_memory() if cuda else t

    step_host, step_dev = host(2 * batch), torch.zeros(2 * batch, dtype=torch.int64, device=dev)
    staged_host, staged_dev = host(64), torch.zeros(64, dtype=torch.int64, device=dev)
    idx = torch.zeros(batch, dtype=torch.int32, device=dev)
    sampled_dev, sampled_host = torch.zeros(batch, dtype=torch.int64, device=dev), host(batch)
    event = torch.cuda.Event() if cuda else _HostEvent()

    def step() -> Any:
        step_dev.copy_(step_host, non_blocking=True)
        staged_dev.copy_(staged_host, non_blocking=True)
        idx.to(torch.int64)
        sampled_host.copy_(sampled_dev, non_blocking=True)
        if cuda:
            event.record()
        wait_deliberately(event.synchronize)
        return sampled_host.tolist()

    return step


def part_syncfinder(args) -> list[dict]:
    """Median host time of the replayed step with the sync finder and the catcher on and off."""
    import torch

    from mrv2_prof.probes.host_waits import HostWaits
    from mrv2_prof.probes.recording import RecordingProbe
    from mrv2_prof.probes.sync_finder import SyncFinder

    cuda = not args.quick and torch.cuda.is_available()
    results = []
    for batch in args.batches:
        step = _step_calls(batch, cuda)
        per_side: dict[str, list[int]] = {"off": [], "on": []}
        for block in range(2 * max(args.repeats, 1) * 5):
            side = ("off", "on")[block % 2]
            probe = RecordingProbe()
            with contextlib.ExitStack() as stack:
                if side == "on":
                    finder = stack.enter_context(SyncFinder(probe, debug_mode=cuda))
                    waits = stack.enter_context(HostWaits(probe))
                for _ in range(BLOCK_STEPS):
                    t0 = time.perf_counter_ns()
                    step()
                    per_side[side].append(time.perf_counter_ns() - t0)
            found = waits.count + finder.count if side == "on" else 0
            if found:  # a steady decode step makes no hidden wait: the replay must not either
                raise SystemExit(f"host_path syncfinder: the replayed step made {found} waits")
        off = statistics.median(per_side["off"][BLOCK_STEPS:]) / 1e3
        on = statistics.median(per_side["on"][BLOCK_STEPS:]) / 1e3
        results.append(
            {"part": "syncfinder", "batch": batch, "device": "cuda" if cuda else "cpu",
             "off_us": off, "on_us": on, "cost_us": on - off}
        )  # fmt: skip
        print(f"  syncfinder batch {batch}: done", flush=True)
    return results


def markdown_syncfinder(results: list[dict]) -> list[str]:
    rows = [r for r in results if r["part"] == "syncfinder"]
    if not rows:
        return []
    return [
        "Sync finder + host-wait catcher, one replayed decode step's wrapped calls (median µs,"
        f" {rows[0]['device']}): "
        + ", ".join(
            f"batch {r['batch']}: off {r['off_us']:.2f}, on {r['on_us']:.2f}"
            f" (cost {r['cost_us']:+.2f})"
            for r in rows
        ),
        "",
    ]
