"""Whether the runner process's Python modules were loaded from cached bytecode or compiled.

Python compiles a module's source to bytecode at its first import and caches it (a ``.pyc`` under
``__pycache__``, or under ``sys.pycache_prefix``); later imports read the cache. Where no cache
can be read (``PYTHONDONTWRITEBYTECODE`` or ``-B`` with no ``.pyc`` shipped, a read-only install
without them, an image stripped of them), every process compiles every module again: torch alone
is some 2,000 modules, compiled again at each run's start-up (``benchmarks/startup.py
--bytecode source cached`` measures what it costs).

``bytecode_facts`` takes stock once start-up is done: of the modules in ``sys.modules`` loaded
from a ``.py`` source, how many had a cache older than ``since`` (the runner process's spawn:
read, not compiled), how many were compiled in this process (no cache now, or one written since
``since``: compiled here, and cached for the next run where Python could write it), and why
nothing was cached where a compiled module has no cache now: ``writing_off`` (Python's
bytecode writing is off) or ``read_only`` (its directory is read-only). Torch's modules are
counted apart (the start-up line's ``torch`` phase). One ``os.stat`` a module: 9.6 ms for
1,040 modules on the CPU host.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _compiled(cached: str, since: float) -> tuple[bool, bool]:
    """(compiled in this process, a cache exists now) of a module whose cache path is
    ``cached``."""
    try:
        mtime = os.stat(cached).st_mtime
    except OSError:
        return True, False
    return mtime >= since, True


def bytecode_facts(since: float, modules: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"modules", "compiled", "uncached", "torch_...", "why"}`` over ``modules`` (default
    ``sys.modules``): source modules, those compiled in this process (``since``: ``time.time()``
    at the process's spawn), those compiled and still with no cache, torch's share of each, and
    why nothing was cached (None where every compiled module was)."""
    modules = sys.modules if modules is None else modules
    counts = dict.fromkeys(
        ("modules", "compiled", "uncached", "torch_modules", "torch_compiled", "torch_uncached"), 0
    )
    read_only = False
    for name, module in list(modules.items()):
        spec = getattr(module, "__spec__", None)
        origin, cached = getattr(spec, "origin", None), getattr(spec, "cached", None)
        if not (isinstance(origin, str) and origin.endswith(".py") and isinstance(cached, str)):
            continue
        compiled, exists = _compiled(cached, since)
        torch = name == "torch" or name.startswith("torch.")
        for group in ("", "torch_") if torch else ("",):  # every module's counts, torch's too
            counts[group + "modules"] += 1
            counts[group + "compiled"] += compiled
            counts[group + "uncached"] += not exists
        if not exists:
            read_only = read_only or not os.access(os.path.dirname(origin), os.W_OK)
    why = None
    if counts["uncached"]:
        why = "writing_off" if sys.dont_write_bytecode else "read_only" if read_only else "unknown"
    return {**counts, "why": why}
