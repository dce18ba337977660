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
  the engine's build does not walk it either. The reference cycles the imports left (about
  7,000 objects on the quickstart) wait, frozen, for the one collection below;
* ``freeze_start_up``: after start-up, everything unfrozen, one full collection (the imports'
  cycles with the rest), then everything left frozen, so that no collection over the model and
  the compiled kernels stalls a step mid-run (one did, for hundreds of ms, before this).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_uncollected() -> Iterator[None]:
    """No collection while the block runs (the collector as it was afterwards); what it made,
    and everything before it, frozen out of later collections' walk."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
    gc.freeze()


def freeze_start_up() -> int:
    """One full collection over every object, then every object left frozen; the objects
    frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
