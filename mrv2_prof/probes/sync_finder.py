"""Where the host waits for the GPU without meaning to: the sync-point finder.

While a run's step loop runs, ``torch.cuda.set_sync_debug_mode('warn')`` makes every
synchronising CUDA call (``.item()``, ``.tolist()`` or ``.cpu()`` of a device tensor, a blocking
copy, ``torch.cuda.synchronize``) issue a warning. The finder catches each one and records it as
a ``syncs`` row of kind ``implicit``: the step it happened in, and its site, the first stack frame
inside ``mrv2_prof`` (``mrv2_prof/runner/worker/sampler.py:123``), or the first outside torch
when no project frame is on the stack. The runner's one designed wait lifts the debug mode around
itself (``ModelRunner.wait_output``) and is recorded separately with its wait time (kind
``output_wait``). The blocked time of an implicit sync is not known: ``blocked_ns`` is NULL.

Sync debug mode cannot see everything: an explicit ``synchronize`` of the device, a stream or an
event, a non-blocking copy from pageable memory. ``probes.host_waits`` catches those at torch's
entry points, with their blocked time; a sync the debug mode reports while such a caught call
runs is that call's row, not a second ``implicit`` one.
"""

from __future__ import annotations

import sys
import warnings
from time import perf_counter_ns
from typing import Any

from mrv2_prof.probes.sync_site import WaitState, sync_site

SYNC_MESSAGE = "called a synchronizing CUDA operation"


class SyncFinder:
    """A context manager around the step loop; ``probe.sync`` receives every implicit sync.

    ``debug_mode=False`` leaves torch's setting alone and only catches the warnings (tests)."""

    def __init__(self, probe: Any, debug_mode: bool = True) -> None:
        self.probe = probe
        self.debug_mode = debug_mode
        self.count = 0

    def __enter__(self) -> SyncFinder:
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("always", message=SYNC_MESSAGE)  # every occurrence, not the first
        self._show = warnings.showwarning
        warnings.showwarning = self._on_warning
        if self.debug_mode:
            import torch

            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.debug_mode:
            import torch

            torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = self._show
        self._catch.__exit__(*exc)

    def _on_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        if SYNC_MESSAGE not in str(message):
            self._show(message, category, filename, lineno, file, line)
            return
        if WaitState.inside:
            return  # a caught call (probes.host_waits) records this sync with its time
        self.count += 1
        self.probe.sync("implicit", sync_site(sys._getframe(1), __file__), -1, perf_counter_ns())
