"""Kernel compiles seen by the engine: each Triton launcher cache miss to the probe, and under
``strict`` a compile after warm-up refused.

``CompileWatch`` is the listener the engine sets on ``triton_launch`` (``attach``), and on
triton's own JIT hooks for kernels launched directly (``triton_jit_hooks``), before the runner
starts up, so start-up's compiles (warm-up, capture) reach the probe too, at step -1. Once
the engine is warm (``warm``), a compile is one a request paid for: under ``strict`` the step it
happened in ends with a ``ConfigError`` naming the kernel, the step and the key (``check``).
torch.compile is not used by the runner, so there is no torch recompile to watch.
"""

from __future__ import annotations

from mrv2_prof.probes.api import Probe
from mrv2_prof.runner.config import ConfigError
from mrv2_prof.runner.worker import triton_launch
from mrv2_prof.runner.worker.triton_jit_hooks import JitHooks


class CompileWatch:
    """The compile listener of one engine (``triton_launch.set_compile_listener``)."""

    def __init__(self, probe: Probe, strict: bool) -> None:
        self.probe, self.strict = probe, strict
        self.is_warm = False
        self.late: tuple[str, str] | None = None  # (kernel, key) of the first late compile
        self.jit_hooks = JitHooks(self)  # kernels launched directly: triton's own hooks
        self.note: str | None = None  # why direct launches' compiles are not seen

    def attach(self) -> CompileWatch:
        """Listen when there is something to do with a compile (a recording probe, strict);
        else no listener (an earlier engine's stops)."""
        listens = self.probe.enabled or self.strict
        triton_launch.set_compile_listener(self if listens else None)
        if listens:
            self.note = self.jit_hooks.install()
        return self

    def detach(self) -> None:
        if triton_launch.compile_listener() is self:
            triton_launch.set_compile_listener(None)
        self.jit_hooks.uninstall()

    def warm(self) -> None:
        """Start-up is over: compiles from now on are after warm-up."""
        self.is_warm = True

    def __call__(self, kernel: str, key: str, compile_ms: float) -> None:
        self.probe.kernel_compile("triton", kernel, key, compile_ms)
        if self.is_warm and self.strict and self.late is None:
            self.late = (kernel, key)

    def check(self, step: int) -> None:
        """Under ``strict``, after the step: a compile after warm-up fails the run."""
        if self.late is not None:
            kernel, key = self.late
            raise ConfigError(
                f"runner.strict: Triton kernel {kernel} compiled at step {step}, after warm-up "
                f"(key {key}) (strict: true)"
            )
