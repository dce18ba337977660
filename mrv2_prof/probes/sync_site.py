"""Where a host-device sync happened, and the waits that are not hidden syncs.

``sync_site`` names the line of code a sync is charged to (the sync finder's, the host-wait
catcher's and the copy audit's ``site``). ``wait_deliberately`` wraps a wait the code means to
make (the runner's output wait, a GPU clock anchor) so that neither the sync finder's debug mode
nor the host-wait catcher (``probes.host_waits``) reports it. ``host_waits_active`` tells the
copy audit that the catcher records the copy syncs itself. All three are re-exported by
``probes.api``, the one instrumentation module the runner imports.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

T = TypeVar("T")


class WaitState:
    """What the host-wait catcher needs to know from here: whether it is catching, and how many
    deliberate waits are open (module state: one step loop per process)."""

    catching = False
    deliberate = 0
    inside = 0  # a caught call is running (the sync finder leaves its warning to the catcher)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../mrv2_prof
_ROOT = os.path.dirname(_PACKAGE_DIR)


def sync_site(frame: FrameType | None, *skip_files: str) -> str:
    """A sync's ``site``: ``path:line`` of the first frame inside ``mrv2_prof`` other than
    ``skip_files`` (the module that noticed the sync, a door such as the copy helper), walking
    outwards from ``frame``; else of the first frame outside torch, the warnings module and
    ``skip_files``."""
    skip = {os.path.abspath(f) for f in skip_files}
    fallback = None
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path not in skip:
            if path.startswith(_PACKAGE_DIR + os.sep):
                return f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno}"
            if fallback is None and not _is_library(path):
                fallback = f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "<unknown>"


def _is_library(path: str) -> bool:
    return f"{os.sep}torch{os.sep}" in path or path.endswith("warnings.py")


def host_waits_active() -> bool:
    """True while the host-wait catcher records every copy that makes the host wait (the copy
    audit then leaves the ``copy`` sync to it, so a copy is not counted twice)."""
    return WaitState.catching


def wait_deliberately(wait: Callable[[], T]) -> T:
    """Call ``wait``, a wait the code means to make (the runner's output wait, a clock anchor),
    with a sync debug mode (the sync finder's) lifted around it and the host-wait catcher told
    to let it pass, so it is not reported as a hidden sync."""
    import torch

    mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_initialized() else 0
    if mode:
        torch.cuda.set_sync_debug_mode(0)
    WaitState.deliberate += 1
    try:
        return wait()
    finally:
        WaitState.deliberate -= 1
        if mode:
            torch.cuda.set_sync_debug_mode(mode)
