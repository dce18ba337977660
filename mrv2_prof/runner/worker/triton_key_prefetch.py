"""Triton's own cache key, computed on a thread while the runner process starts.

Triton looks up every kernel it compiles in its disk cache under a key that includes
``triton_key()``: the SHA-256 of triton's compiler sources and of ``libtriton.so`` (about
500 MB), computed once per process (``functools.lru_cache``), at the first kernel a process
compiles or loads. The first is the profiling run's first norm, so the key's hashing sat on the
start-up's path: 87 of the 107 start-up samples under that launch on the H100 host (about 0.5 s
of the profile run), 0.9 s on the 2-core CPU host. ``hashlib`` releases the GIL while it hashes
a buffer, so a thread computes it beside the main thread's work at no cost to it.

``start`` runs ``triton_key`` on a daemon thread, where the run will compile Triton kernels (a
CUDA device, triton installed, not the interpreter); the harness calls it right after torch's
import, so the key is hashed while the engine's modules import and the weights load. ``wait``
joins that thread; start-up (``startup.start_up``) calls it before the first launch, so the
main thread finds the key in the cache instead of hashing it a second time beside the thread.
A tensor-parallel rank's process starts its own before its weights load
(``startup.rank_runner``). Without ``start`` (the tests, a CPU run) ``wait`` returns at once.
A failure on the thread is left for the main thread's own call of ``triton_key`` to raise, in
the compile that needs it, as it would have without the thread.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time

_thread: threading.Thread | None = None
_took: list[float] = []  # the thread's seconds, once it is done


def will_compile(device: str = "auto") -> bool:
    """Whether a run on ``device`` (``runner.device``) will launch compiled Triton kernels: a
    CUDA device and triton, not triton's interpreter (which compiles nothing)."""
    if device.startswith("cpu") or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    import torch

    # found, not imported: the thread imports it, beside the main thread's imports
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


def start(device: str = "auto") -> bool:
    """The key's hashing on a thread, once per process, where a run on ``device`` will
    compile; whether a thread was started."""
    global _thread
    if _thread is not None or not will_compile(device):
        return False
    _thread = threading.Thread(target=_compute, name="mrv2-triton-key", daemon=True)
    _thread.start()
    return True


def wait() -> float | None:
    """Until the thread started by ``start`` is done; the seconds it hashed (None: no thread)."""
    if _thread is None:
        return None
    _thread.join()
    return _took[0] if _took else None


def triton_key_function():
    """triton's ``triton_key`` (``triton.runtime.cache`` from triton 3.5, before it
    ``triton.compiler.compiler``)."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # triton 3.3 and 3.4
        from triton.compiler.compiler import triton_key
    return triton_key


def _compute() -> None:
    t0 = time.perf_counter()
    try:
        triton_key_function()()
    except Exception:  # noqa: BLE001 - the compile that needs the key raises it itself
        return
    _took.append(time.perf_counter() - t0)
