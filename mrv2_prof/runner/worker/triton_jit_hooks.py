"""Triton's own compiles, from its JIT hooks: the kernels launched directly (``kernel[grid]``:
the model's attention, norm, rotary, GEMV and activation kernels) are compiled by triton's JIT
without a launcher to see the miss.

triton calls ``knobs.runtime.jit_cache_hook`` before it compiles a kernel it has not in its
in-memory cache (a truthy return would skip the compile: ours returns False) and
``jit_post_compile_hook`` after; the time between them is the compile's wall time (a load from
triton's disk cache included: a few ms). A compile inside a launcher's miss is left to the
launcher's listener, which names it by the launcher and its key (``triton_launch``); the others
are reported here with the kernel's name and triton's description of the specialization. Hooks
set before ours are kept and called first. A triton without ``knobs.runtime`` (older than 3.4)
gives a note instead.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from mrv2_prof.runner.worker import triton_launch

Report = Callable[[str, str, float], None]  # (kernel, key, compile ms)
UNAVAILABLE = (
    "Triton compiles of kernels launched directly (not through a launcher) are not recorded: "
    "this triton has no JIT compile hooks (triton.knobs.runtime, triton >= 3.4)"
)
KEY_CHARS = 200


class JitHooks:
    def __init__(self, report: Report) -> None:
        self.report = report
        self._pending: dict[str, int] = {}  # triton's key -> when its compile began
        self._saved: tuple[Any, Any] | None = None
        self._runtime: Any = None

    def install(self) -> str | None:
        """Set the hooks; a note when this triton has none."""
        try:
            from triton import knobs

            runtime = knobs.runtime
            saved = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
        except (ImportError, AttributeError):
            return UNAVAILABLE
        self._runtime, self._saved = runtime, saved
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = self.before, self.after
        return None

    def uninstall(self) -> None:
        if self._runtime is not None and self._runtime.jit_cache_hook == self.before:
            self._runtime.jit_cache_hook, self._runtime.jit_post_compile_hook = self._saved
        self._runtime = None

    def before(self, *args: Any, **kwargs: Any) -> bool:
        earlier = self._saved[0] if self._saved else None
        if earlier is not None and earlier(*args, **kwargs):
            return True  # an earlier hook asked triton to skip this compile
        self._pending[str(kwargs.get("key"))] = perf_counter_ns()
        return False

    def after(self, *args: Any, **kwargs: Any) -> None:
        later = self._saved[1] if self._saved else None
        if later is not None:
            later(*args, **kwargs)
        t0 = self._pending.pop(str(kwargs.get("key")), None)
        if triton_launch.in_launcher_miss():
            return  # the launcher's listener reports it, by the launcher's name and key
        ms = (perf_counter_ns() - t0) / 1e6 if t0 is not None else float("nan")
        self.report(kernel_name(kwargs.get("fn")), key_of(kwargs), ms)


def kernel_name(fn: Any) -> str:
    """The kernel's function name from triton's ``JitFunctionInfo`` (or what it has)."""
    name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or str(fn)
    return str(name).rsplit(".", 1)[-1]


def key_of(kwargs: dict[str, Any]) -> str:
    """triton's description of the specialization (``repr``: name, options, argument types),
    or its key, cut to ``KEY_CHARS``."""
    text = str(kwargs.get("repr") or kwargs.get("key"))
    return text if len(text) <= KEY_CHARS else text[: KEY_CHARS - 1] + "…"
