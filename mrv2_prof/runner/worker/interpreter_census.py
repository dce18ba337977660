"""The specialization census of the Triton kernels launched directly (``kernel[grid](...)``:
the model's norm, rotary, KV-write, attention, GEMV and activation kernels) under the
interpreter (``TRITON_INTERPRET=1``), for CPU tests.

On a GPU triton's JIT hooks see these kernels' compiles (``triton_jit_hooks``); the interpreter
compiles nothing and calls no hook, so a CPU run cannot see which specializations a GPU run
would compile. While ``recording()`` (or ``enable()``) is on, every ``kernel[grid](...)`` that
reaches ``InterpretedFunction.run`` records, under the kernel's function name, the key triton
would compile it for: the call's arguments bound to the kernel's signature, each runtime
parameter's class as triton specialises it (``triton_launch``'s: a tensor's dtype and 16-byte
alignment, an integer's ``== 1`` / ``% 16 == 0`` / 32-64-bit class, each unless the kernel
turns it off; None, a bool's value, a float), every constexpr's value (defaults included) and
the launch options passed (``num_warps``, ``num_stages``, ...). The text is ``key_text``'s:
``BLOCK=16, num_warps=4; float32@16, %16, i32``.

Kernels launched through a ``Launcher`` are left out here: its own census
(``triton_launch.specializations``) counts them, so no launch is counted twice. A kernel whose
parameters cannot be read (a triton whose JIT differs) fails its launch while recording: a
census that silently missed kernels would pass a test it should fail.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mrv2_prof.runner.worker import triton_launch

_keys: dict[str, set[str]] = {}
_state: dict[str, Any] = {"original": None}
_shapes: dict[int, tuple[Any, list[tuple[str, bool, int]]]] = {}  # id(fn) -> signature, params


def _shape(fn) -> tuple[Any, list[tuple[str, bool, int]]]:
    """The kernel's signature, and per parameter its name, whether it is a constexpr and its
    specialisation mode (read from a ``JITFunction`` built over it: that compiles nothing)."""
    shape = _shapes.get(id(fn))
    if shape is None:
        jit = triton_launch.jit_of(fn)
        params = [(p.name, bool(p.is_constexpr), triton_launch.param_mode(p)) for p in jit.params]
        shape = _shapes[id(fn)] = (inspect.signature(fn.fn), params)
    return shape


def launch_key(fn, args: tuple, kwargs: dict[str, Any]) -> str:
    """The key triton would compile ``fn[grid](*args, **kwargs)`` for, as ``key_text``."""
    signature, params = _shape(fn)
    names = {name for name, _, _ in params}
    options = sorted((k, v) for k, v in kwargs.items() if k not in names)
    bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    values = bound.arguments
    constexprs = [(name, values[name]) for name, is_constexpr, _ in params if is_constexpr]
    arg_keys = [
        triton_launch.arg_key(values[name], mode)
        for name, is_constexpr, mode in params
        if not is_constexpr
    ]
    return triton_launch.key_text((None, arg_keys, (*constexprs, *options)), cut=False)


def _launcher_kernels() -> set[int]:
    """The kernels launched through a ``Launcher`` (its own census counts them)."""
    return {id(launcher.fn) for launcher in triton_launch.launchers()}


def _run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
    if not warmup and id(self) not in _launcher_kernels():
        _keys.setdefault(self.__name__, set()).add(launch_key(self, args, kwargs))
    return _state["original"](self, *args, grid=grid, warmup=warmup, **kwargs)


def enable() -> None:
    """Record every direct launch from now on (nothing changes if already on)."""
    from triton.runtime.interpreter import InterpretedFunction

    if _state["original"] is None:
        _state["original"] = InterpretedFunction.run
        InterpretedFunction.run = _run


def disable() -> None:
    """Stop recording (the keys so far stay)."""
    from triton.runtime.interpreter import InterpretedFunction

    if _state["original"] is not None:
        InterpretedFunction.run = _state["original"]
        _state["original"] = None


@contextmanager
def recording() -> Iterator[None]:
    """Record direct launches inside the block (the census emptied first)."""
    forget()
    enable()
    try:
        yield
    finally:
        disable()


def specializations() -> dict[str, set[str]]:
    """Per kernel name, every key launched directly while recording."""
    return {name: set(keys) for name, keys in _keys.items()}


def forget() -> None:
    """Empty the census."""
    _keys.clear()
