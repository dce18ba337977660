"""Triton launches without the JIT's per-call binding: compiled kernels cached per specialization.

``kernel[grid](*args)`` (``JITFunction.run``) binds every argument, specialises each one (a
pointer's dtype and 16-byte alignment, an integer's 1 / divisible-by-16 / 64-bit classes),
formats a cache-key string, reads several runtime knobs, runs the pre-run hooks and checks the
kernel's globals on every call: tens of µs of Python per launch, on every launch of a step. A
``Launcher`` pays that once per specialization: the first call with a new key goes through the
JIT path, which compiles (or finds) the kernel and returns the ``CompiledKernel``; later calls
with the same key call its launcher (``CompiledKernel.run``) directly on the current stream.

The key (``Launcher.key``) holds the keyword arguments (constexprs and launch options) and, for
every runtime argument, what triton specialises it on: a tensor's dtype and whether its data
pointer is 16-byte aligned (unless the kernel does not specialise that argument on alignment),
an integer's ``== 1`` / ``% 16 == 0`` (unless not specialised) and its 32/64-bit class. So two
launches with one key are two launches triton would have compiled once (the test checks this
against triton's own binder): a cached kernel never runs on arguments it was not compiled for.

Callers pass the runtime arguments positionally and the constexprs and options by keyword, the
constexprs after the runtime parameters in the kernel's signature (every kernel of the step
path is written so). The fast path is off, and every call takes the JIT path, under the
interpreter (``TRITON_INTERPRET=1``), when ``set_fast_launch(False)`` or
``MRV2_TRITON_FAST_LAUNCH=0`` turns it off, or when this triton's compiled kernel lacks the
launcher it needs; the reason is recorded once per kernel (``notes()``), never silently.
Each launcher counts its calls, hits, misses and JIT-path calls.

A miss is timed, and reported to the compile listener when one is set
(``set_compile_listener``: the engine hands its probe's ``kernel_compile`` over) with the
launcher's name and the key as a short readable string (``key_text``). On the JIT path every
call goes through triton and nothing is reported per call: a note says compiles are not
recorded there (the interpreter compiles nothing, so it is left out).

The specialization census (``specializations()``): every launcher's keys so far, by kernel
name. On the fast path they are the cache's keys (a hit adds nothing). Under the interpreter,
which specialises nothing, each call's key is computed from the parameters of a
``JITFunction`` built over the interpreted function (that compiles nothing), so a CPU run sees
the specializations a GPU run would compile; where that cannot be built the kernel has no
census, and its note says why. Calls on the JIT path otherwise are not counted in it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from time import perf_counter_ns
from typing import Any

import torch

_ENV = "MRV2_TRITON_FAST_LAUNCH"
_state: dict[str, Any] = {"enabled": os.environ.get(_ENV, "1") != "0", "listener": None}
_notes: dict[str, None] = {}  # ordered set: one line per kernel that takes the JIT path
_launchers: list[Launcher] = []  # every launcher made, for the counts (benchmarks)
_LAUNCHER_ATTRS = ("run", "function", "packed_metadata", "launch_metadata")
_I32 = range(-(2**31), 2**31)
_KEY_CHARS = 200  # a key's text is cut to this many characters
_UNRECORDED = (
    "runner.kernels: Triton compiles are not recorded for kernels that launch through the JIT"
)

# per runtime parameter: 0 = specialised, 1 = not on its value, 2 = not on alignment, 3 = neither
_FULL, _NO_VALUE, _NO_ALIGN, _NONE = 0, 1, 2, 3


def set_fast_launch(enabled: bool) -> None:
    """Turn the cached-kernel path on or off for every launcher (off: the JIT path each call)."""
    _state["enabled"] = enabled


def set_compile_listener(listener: Callable[[str, str, float], None] | None) -> None:
    """Call ``listener(kernel, key, compile_ms)`` on every cache miss from now on (None: stop):
    the kernel's launcher name, ``key_text`` of the key, and the JIT call's wall time."""
    _state["listener"] = listener


def in_launcher_miss() -> bool:
    """True while a launcher's cache miss is on triton's JIT path (its listener reports it)."""
    return _state.get("in_miss", False)


def compile_listener() -> Callable[[str, str, float], None] | None:
    """The listener ``set_compile_listener`` set, or None."""
    return _state["listener"]


def _arg_text(k: Any) -> str:
    """One runtime argument's part of a key, readably: ``int32@16`` (a tensor, 16-byte
    aligned), ``=1`` / ``%16`` / ``i32`` / ``i64`` (an integer's class)."""
    if isinstance(k, torch.dtype):
        return str(k).removeprefix("torch.")
    if isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], torch.dtype):
        return str(k[0]).removeprefix("torch.") + ("@16" if k[1] else "")
    if isinstance(k, tuple) and all(isinstance(x, bool) for x in k) and len(k) in (2, 4):
        *value, in32, u64 = k
        if value and value[0]:
            return "=1"
        if value and value[1]:
            return "%16"
        return "u64" if u64 else "i32" if in32 else "i64"
    return repr(k)


def key_text(key: tuple, cut: bool = True) -> str:
    """A launcher's key (device, runtime-argument classes, keyword arguments) as one short
    line: ``BLOCK=256; int32@16, %16, =1`` (cut to ~200 characters unless ``cut`` is off)."""
    _, arg_keys, kwargs = key
    text = ", ".join(f"{k}={v}" for k, v in kwargs)
    text += ("; " if text else "") + ", ".join(_arg_text(k) for k in arg_keys)
    return text if not cut or len(text) <= _KEY_CHARS else text[: _KEY_CHARS - 1] + "…"


def notes() -> list[str]:
    """One line per kernel whose launches took the JIT path, with the reason."""
    return list(_notes)


def launchers() -> list[Launcher]:
    """Every launcher made so far (one per kernel), with its counters."""
    return list(_launchers)


def specializations() -> dict[str, set[str]]:
    """Per kernel (launcher name), the whole ``key_text`` of every specialization launched so
    far: the compiled ones on the fast path, the ones the interpreter ran under
    ``TRITON_INTERPRET``."""
    out: dict[str, set[str]] = {}
    for launcher in _launchers:
        texts = out.setdefault(launcher.name, set())
        texts.update(key_text(k, cut=False) for k in launcher.launched())
    return out


def forget_interpreted_specializations() -> None:
    """Empty the interpreter's census (one engine's launches at a time, in tests); the fast
    path's keys stay, as they are its cache of compiled kernels."""
    for launcher in _launchers:
        if launcher._seen is not None:
            launcher._seen.clear()


def _runtime() -> tuple[Callable[[], int], Callable[[int], int], Any]:
    """The current device, the current raw stream of a device, and triton's runtime knobs."""
    from triton import knobs
    from triton.runtime.driver import driver

    active = driver.active
    return active.get_current_device, active.get_current_stream, knobs.runtime


def _param_modes(fn) -> tuple[list[int], list[str]] | str:
    """Per runtime parameter its specialisation mode, and the constexpr names after them; or
    why the kernel's signature does not allow the fast path."""
    params = getattr(fn, "params", None)
    if params is None:
        return "the kernel exposes no parameter list"
    modes, constexprs = [], []
    for p in params:
        if p.is_constexpr:
            constexprs.append(p.name)
        elif constexprs:
            return f"runtime parameter {p.name!r} follows a constexpr"
        else:
            modes.append(param_mode(p))
    return modes, constexprs


def param_mode(p) -> int:
    """A runtime parameter's specialisation mode (``arg_key``'s ``mode``), from triton's
    ``KernelParam``: specialised fully, not on its value, not on its alignment, or neither."""
    # an older triton without the alignment switch specialises every pointer on it
    no_align = getattr(p, "do_not_specialize_on_alignment", False)
    no_value = getattr(p, "do_not_specialize", False)
    return _NO_VALUE * bool(no_value) + _NO_ALIGN * bool(no_align)


def jit_of(fn):
    """The ``JITFunction`` of the kernel an interpreted function wraps, built over its source
    with its decorator's options (that compiles nothing): its parameters as triton binds them."""
    from triton.runtime.jit import JITFunction

    return JITFunction(fn.fn, **fn.kwargs)


def _interpreted_modes(fn) -> tuple[list[int], list[str]] | str:
    """``_param_modes`` of the kernel an interpreted function wraps (``jit_of``); or why its
    ``JITFunction`` cannot be built."""
    try:
        jit = jit_of(fn)
    except Exception as exc:  # a triton whose interpreter or JIT differs: no census
        return f"its JIT parameters cannot be read ({type(exc).__name__}: {exc})"
    return _param_modes(jit)


def arg_key(a: Any, mode: int) -> Any:
    """What triton specialises one runtime argument on (or finer)."""
    if isinstance(a, torch.Tensor):
        if mode & _NO_ALIGN:
            return a.dtype
        return a.dtype, not a.data_ptr() & 15
    if a is None or isinstance(a, (bool, float)):
        return a if a is None or isinstance(a, bool) else float
    if isinstance(a, int):
        if mode & _NO_VALUE:
            return a in _I32, a >= 2**63
        return a == 1, not a & 15, a in _I32, a >= 2**63
    return type(a), a  # anything else: its value (hashable or the key fails loudly)


def _key_function(modes: list[int]) -> Callable[..., tuple]:
    """``tuple(map(arg_key, args, modes))`` written out per parameter, with a tensor's and an
    int's key inline (as triton's own binder is generated): about a third of the calls' cost."""
    lo, hi, u64 = -(2**31), 2**31, 2**63
    terms = []
    for i, m in enumerate(modes):
        a = f"a{i}"
        tensor = f"{a}.dtype" if m & _NO_ALIGN else f"({a}.dtype, not {a}.data_ptr() & 15)"
        value = "" if m & _NO_VALUE else f"{a} == 1, not {a} & 15, "
        integer = f"({value}{lo} <= {a} < {hi}, {a} >= {u64})"
        terms.append(
            f"{tensor} if type({a}) is Tensor else {integer} if type({a}) is int "
            f"else arg_key({a}, {m})"
        )
    args = ", ".join(f"a{i}" for i in range(len(modes)))
    namespace = {"Tensor": torch.Tensor, "arg_key": arg_key}
    exec(f"def key({args}):\n    return ({', '.join(terms)},)\n", namespace)
    return namespace["key"]


class Launcher:
    """Launches of one ``@triton.jit`` kernel, through its compiled kernel once cached."""

    def __init__(self, fn, name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", repr(fn))
        self.calls = self.hits = self.misses = self.slow = 0
        self._cache: dict[tuple, tuple[Any, tuple]] = {}
        self._runtime: tuple | None = None
        self.fallback: str | None = None  # why the JIT path is taken, once known
        self._noted_off = False
        _launchers.append(self)
        self._interpreted = type(fn).__name__ == "InterpretedFunction"  # it compiles nothing
        self._seen: set[tuple] | None = None  # the interpreter's keys (census), when it has one
        if self._interpreted:
            shape = _interpreted_modes(fn)
            census = "" if not isinstance(shape, str) else f"; no specialization census: {shape}"
            self._fall_back(f"the Triton interpreter runs it (TRITON_INTERPRET=1){census}")
            if not isinstance(shape, str):
                self._modes, self._constexprs = shape
                self._key = _key_function(self._modes)
                self._seen = set()
            return
        shape = _param_modes(fn)
        if isinstance(shape, str):
            self._fall_back(shape)
            return
        self._modes, self._constexprs = shape
        self._key = _key_function(self._modes)

    def _fall_back(self, reason: str) -> None:
        self.fallback = reason
        self._note(reason)

    def _note(self, reason: str) -> None:
        _notes[f"runner.kernels: Triton kernel {self.name} launches through the JIT ({reason})"] = (
            None
        )

    def launched(self) -> set[tuple]:
        """Every key launched so far (with the device first, as the cache holds them)."""
        return set(self._cache) | (self._seen or set())

    def key(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple:
        """The specialization key of a launch (see the module docstring)."""
        modes = self._modes
        if len(args) != len(modes):
            raise TypeError(
                f"{self.name}: {len(args)} positional arguments, the kernel has {len(modes)} "
                "runtime parameters (constexprs and options go by keyword)"
            )
        return self._key(*args), tuple(kwargs.items())

    def __call__(self, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.fallback is not None or not _state["enabled"]:
            if self.fallback is None and not self._noted_off:
                self._noted_off = True
                self._note(f"fast launch turned off: {_ENV}=0 or set_fast_launch(False)")
            self.slow += 1
            if _state["listener"] is not None and not self._interpreted:
                _notes[_UNRECORDED] = None  # no miss to see: triton binds every call
            if self._seen is not None:  # the interpreter's census (the device is left out)
                self._seen.add((None, *self.key(args, kwargs)))
            self.fn[grid](*args, **kwargs)
            return
        if self._runtime is None:
            try:
                self._runtime = _runtime()
            except (ImportError, AttributeError) as exc:  # a triton without these entry points
                self._fall_back(f"triton's runtime lacks what the launcher reads: {exc}")
                self.slow += 1
                self.fn[grid](*args, **kwargs)
                return
        current_device, current_stream, knobs = self._runtime
        device = current_device()
        key = (device, *self.key(args, kwargs))
        entry = self._cache.get(key)
        if entry is None:
            self.misses += 1
            self.slow += 1
            t0 = perf_counter_ns()
            _state["in_miss"] = True  # triton's own compile hooks leave this compile to us
            try:
                self._fill(key, grid, args, kwargs)
            finally:
                _state["in_miss"] = False
            listener = _state["listener"]
            if listener is not None:
                listener(self.name, key_text(key), (perf_counter_ns() - t0) / 1e6)
            return
        self.hits += 1
        kernel, tail = entry
        stream = current_stream(device)
        full = (*args, *tail)
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        enter = knobs.launch_enter_hook
        meta = None if enter is None else kernel.launch_metadata(grid, stream, *full)
        kernel.run(
            grid[0],
            g1,
            g2,
            stream,
            kernel.function,
            kernel.packed_metadata,
            meta,
            enter,
            knobs.launch_exit_hook,
            *full,
        )

    def _fill(self, key: tuple, grid, args, kwargs) -> None:
        """The JIT path (it compiles or finds the kernel, and launches it); cache what it
        returns with the constexpr values that follow the runtime arguments."""
        kernel = self.fn[grid](*args, **kwargs)
        if hasattr(kernel, "result"):  # triton's asynchronous compile mode
            kernel = kernel.result()
        missing = [a for a in _LAUNCHER_ATTRS if not hasattr(kernel, a)]
        if missing:
            self._fall_back(f"its compiled kernel has no {', '.join(missing)}")
            return
        defaults = {p.name: p.default for p in self.fn.params if p.is_constexpr}
        try:
            tail = tuple(kwargs[n] if n in kwargs else defaults[n] for n in self._constexprs)
        except KeyError as exc:
            self._fall_back(f"constexpr {exc} has no value")
            return
        self._cache[key] = (kernel, tail)
