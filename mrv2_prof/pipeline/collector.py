"""Python's garbage collector around the runner's start-up.

A collection walks every object the collector tracks, and a runner process holds hundreds of
thousands of them once torch, triton and the model's modules are imported (about 316,000 on the
CPU quickstart), nearly all of them for good. Left alone, the collector runs over them again and
again while the process starts: on a 2-core CPU host, 170-240 ms of torch's and the runner's
imports (1.6-2.0 s) went to collections, and 90-100 ms of an engine's build with llama-1b's
123,257 KV blocks (one object each: ``BlockPool``) went to collections over the imported objects
(17-18 ms with them frozen). So:

* ``imports_uncollected``: the collector is off while the runner's heavy modules import, and
  what they made is frozen on the way out (``gc.freeze``: moved where no collection walks), so
  the engine's build does not walk it either (in a process that imported the module already,
  the tests', it changes nothing). The reference cycles the imports left stay, frozen,
  for the process's life: about 7,000 objects on the quickstart (a collection right after the
  imports frees them), about 0.8 MB, against the full walk (100-175 ms here) it would take to
  free them;
* ``freeze_start_up``: once the engine is built, a collection of what start-up made since (the
  model, the KV blocks, the compiled kernels' objects), then everything frozen, so that no
  collection over them stalls a step mid-run (one did, for hundreds of ms, before this). The
  harness does both before the first step, and inside the start-up it reports.
* ``thaw``: a run in the caller's process (the tests', without a runner process of its own)
  gives its objects back to the collector when it ends and collects them: frozen, an engine
  in a reference cycle, its KV cache and its CUDA graphs would outlive the run for the life of
  the process (a GPU test process ran out of memory with 78 GiB held that way). A runner
  process exits instead.

``MRV2_PROF_START_UP_COLLECTOR=on`` in the runner's environment puts the collector back as it
was before (on through the imports, one collection over everything after start-up), so that
``benchmarks/startup.py --collector`` times both ways in one invocation.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator

ENV = "MRV2_PROF_START_UP_COLLECTOR"


@contextlib.contextmanager
def imports_uncollected(module: str) -> Iterator[None]:
    """No collection while the block (``module``'s import) runs, the collector as it was
    afterwards; what it made, and everything before it, frozen out of later collections' walk.
    With ``module`` already imported (a process that started a runner before: the tests'), the
    block runs as it is, nothing frozen: it would freeze whatever garbage that process holds."""
    if module in sys.modules or _collector_left_on():
        yield
        return
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
    gc.freeze()


def freeze_start_up() -> int:
    """A collection of the objects not frozen yet, then every object left frozen; the objects
    frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _collector_left_on() -> bool:
    """``MRV2_PROF_START_UP_COLLECTOR=on``: the benchmark's other side."""
    return os.environ.get(ENV, "").strip().lower() == "on"


def thaw() -> None:
    """Everything frozen back under the collector, then a collection (an in-process run's end)."""
    gc.unfreeze()
    gc.collect()
