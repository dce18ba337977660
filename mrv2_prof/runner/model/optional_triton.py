"""``triton`` and ``triton.language``, or stand-ins where triton is not installed.

The fused model kernels keep their torch references in the same module, and those references
are the model's torch path (the CPU path), which must import on a torch-only install. With the
stand-ins ``@triton.jit`` leaves a function as it is, so the module imports; anything else of
triton raises ``ImportError``. The Triton kernel set is only chosen when triton itself imports
(``runner/worker/kernel_set.py``), so no kernel is ever launched through a stand-in.
"""

from __future__ import annotations

from typing import Any

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - the test environments have triton
    HAS_TRITON = False

    class _Missing:
        """``jit`` that returns the function; any other attribute says triton is missing."""

        @staticmethod
        def jit(fn: Any = None, **_: Any) -> Any:
            return fn if fn is not None else (lambda f: f)

        def __getattr__(self, name: str) -> Any:
            raise ImportError(f"triton is not installed (needed for triton.{name})")

    triton = tl = _Missing()  # type: ignore[assignment]

__all__ = ["HAS_TRITON", "tl", "triton"]
