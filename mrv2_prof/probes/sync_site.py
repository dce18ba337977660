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
from types import CodeType, FrameType
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


# What a frame's file is to ``sync_site``, per code object (its file never changes): the
# normalised path, and the site prefix ("mrv2_prof/..." inside the package, the path for a file
# outside it that is not a library's, None for torch and the warnings module). The line is read
# live from each frame, so the cache cannot merge two lines of one function.
_CODE_FILES: dict[CodeType, tuple[str, str | None, bool]] = {}
_SKIP_SETS: dict[tuple[str, ...], frozenset[str]] = {}


def _code_file(code: CodeType) -> tuple[str, str | None, bool]:
    """``(path, prefix, in_package)`` of a code object's file, computed once per code object."""
    known = _CODE_FILES.get(code)
    if known is None:
        path = os.path.abspath(code.co_filename)
        if path.startswith(_PACKAGE_DIR + os.sep):
            known = (path, os.path.relpath(path, _ROOT), True)
        else:
            known = (path, None if _is_library(path) else path, False)
        _CODE_FILES[code] = known
    return known


def sync_site(frame: FrameType | None, *skip_files: str) -> str:
    """A sync's ``site``: ``path:line`` of the first frame inside ``mrv2_prof`` other than
    ``skip_files`` (the module that noticed the sync, a door such as the copy helper), walking
    outwards from ``frame``; else of the first frame outside torch, the warnings module and
    ``skip_files``. Called only for a sync that is recorded."""
    skip = _SKIP_SETS.get(skip_files)
    if skip is None:
        skip = _SKIP_SETS[skip_files] = frozenset(os.path.abspath(f) for f in skip_files)
    fallback = None
    while frame is not None:
        path, prefix, in_package = _code_file(frame.f_code)
        if path not in skip:
            if in_package:
                return f"{prefix}:{frame.f_lineno}"
            if fallback is None and prefix is not None:
                fallback = f"{prefix}:{frame.f_lineno}"
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
