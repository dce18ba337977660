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

``cache_bytecode`` is the fix, run at the runner process's first frame (``runner_entry``) and at
the command line's start (``mrv2_prof.__main__``), before anything heavy is imported: where
torch's or the project's bytecode is not cached and this process would not cache it (writing
off, or its ``__pycache__`` not writable), Python writes bytecode under ``sys.pycache_prefix``
from then on (the one the environment set, else ``<cache>/bytecode``: ``$MRV2_PROF_CACHE``,
else ``~/.cache/mrv2-prof``), so the first run compiles as before and every later run reads it
(the few modules imported before the switch stay uncached).
Nothing is written beside the installed sources. ``MRV2_PROF_BYTECODE_CACHE=off`` leaves
Python's settings as they are. What it did is the ``cache`` of the run's ``bytecode`` fact, and
a run note says it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

CACHE_SWITCH_ENV = "MRV2_PROF_BYTECODE_CACHE"  # "off": Python's bytecode settings left alone


def _cache_dir() -> Path:
    """``bytecode`` in the models' cache (``$MRV2_PROF_CACHE``, else ``~/.cache/mrv2-prof``)."""
    from mrv2_prof.runner.model.shipped import cache_dir  # no torch; only where the cache goes on

    return cache_dir() / "bytecode"


def _writable(path: str) -> bool:
    """Whether Python could write a cache at ``path``: its directory, or the nearest existing
    one above it (``__pycache__`` is made on the first write)."""
    d = os.path.dirname(path)
    while d and not os.path.exists(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return os.access(d or ".", os.W_OK)


def _uncacheable(probe: str) -> str | None:
    """Why ``probe``'s bytecode is not cached and this process would not cache it
    (``writing_off`` or ``read_only``), or None (cached, about to be, or not a source package)."""
    try:
        spec = importlib.util.find_spec(probe)  # found, not imported (its parents are)
    except (ImportError, ValueError):
        return None
    origin, cached = getattr(spec, "origin", None), getattr(spec, "cached", None)
    if not (isinstance(origin, str) and origin.endswith(".py") and isinstance(cached, str)):
        return None
    if os.path.exists(cached):
        return None
    if sys.dont_write_bytecode:
        return "writing_off"
    return None if _writable(cached) else "read_only"  # writable: cached at this import


PROBES = ("torch", "mrv2_prof.pipeline.harness")  # the runner's: imported after the switch


def cache_bytecode(probes: tuple[str, ...] = PROBES, export: bool = False) -> dict[str, str] | None:
    """Turn Python's bytecode cache on where a probe's is missing and would stay missing:
    ``{"prefix": where bytecode is written now, "was": "writing_off" | "read_only", "module":
    the probe}``, or None where nothing was changed (every probe cached or about to be, or not
    a source package, ``MRV2_PROF_BYTECODE_CACHE=off``, or no writable directory for the
    prefix). With a prefix, Python reads bytecode from there alone: the first run compiles what
    it imports once more (shipped caches beside the sources included), later runs read it.

    ``export`` (the runner process): the prefix also goes to ``PYTHONPYCACHEPREFIX`` for the
    processes it starts, so that a tensor-parallel rank, which imports torch before any code of
    ours runs in it, reads the bytecode the runner wrote (it writes none itself: Python's
    ``-B`` passes to it). The command line does not export: a runner started with the prefix
    would find torch cached there and leave writing off, so its own modules would never be
    cached."""
    if os.environ.get(CACHE_SWITCH_ENV, "").strip().lower() == "off":
        return None
    was, module = next(((w, p) for p in probes if (w := _uncacheable(p))), (None, None))
    if was is None or module is None:
        return None
    prefix = sys.pycache_prefix  # the environment's own choice, where it made one
    if prefix is None or not _writable(os.path.join(prefix, "x")):
        prefix = str(_cache_dir())
        try:
            os.makedirs(prefix, exist_ok=True)
        except OSError:
            return None
        if not os.access(prefix, os.W_OK):
            return None
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False
    if export:
        os.environ["PYTHONPYCACHEPREFIX"] = prefix
    return {"prefix": prefix, "was": was, "module": module}


def cache_note(cache: dict[str, str]) -> str:
    """The run note of what ``cache_bytecode`` did."""
    why = (
        "Python's bytecode writing was off"
        if cache.get("was") == "writing_off"
        else ("the installed packages' bytecode directories are read-only")
    )
    return (
        f"bytecode: {why} and {cache.get('module')}'s was not cached, so the runner caches "
        "Python bytecode "
        f"under {cache.get('prefix')} (the first run compiles it, later runs read it; "
        f"{CACHE_SWITCH_ENV}=off leaves Python's settings alone)"
    )


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
