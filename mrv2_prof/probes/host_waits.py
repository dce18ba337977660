"""Every explicit host wait and every copy that makes the host wait, caught at torch's entry
points with its site, step and blocked time.

torch's sync debug mode (the sync finder) reports ``.item()``, ``.tolist()`` and blocking copies
but not an explicit ``torch.cuda.synchronize()``, ``Stream.synchronize()`` or
``Event.synchronize()``, nor a ``non_blocking`` copy from or into pageable or strided host memory
(CUDA stages it through a bounce buffer and the call returns only when the data has moved). While
``HostWaits`` is active (around the step loop, with ``probes.sync_finder``) it wraps these entry
points of torch, times each call that crosses the host-device boundary or waits, and records it
as a ``syncs`` row: the step, the site (the first ``mrv2_prof`` frame outside this module and
the runner's copy helper, ``probes.sync_site``), the host time the call took as ``blocked_ns``.

=================================  ===========  ================================================
entry point                        kind         when
=================================  ===========  ================================================
``torch.cuda.synchronize``         device_sync  always
``torch.cuda.Stream.synchronize``  stream_sync  always
``torch.cuda.Event.synchronize``   event_sync   always
``Tensor.item`` / ``.tolist``      implicit     on a device tensor
``Tensor.cpu/.to/.copy_/.cuda``    d2h_copy     device -> host, blocking
                                   h2d_copy     host -> device, blocking (torch waits for the
                                                stream after the copy)
                                   copy         ``non_blocking`` with a pageable or strided host
                                                side
=================================  ===========  ================================================

A call that cannot wait (a copy between two tensors on one side, ``.to(dtype)``, ``.cpu()`` of a
host tensor, a read of a host tensor) returns at once after a few attribute checks: the steady
step pays one Python call per wrapped call it makes, no clock read, and the stack is walked only
for a wait that is recorded.

Waits the code means to make (``probes.sync_site.wait_deliberately``: the output wait, the
clock anchors) pass through unrecorded. A sync torch's debug mode reports inside a caught call
is the caught call's (the sync finder leaves it), so nothing is counted twice. Waits made below
these entry points (inside a C++ op, a library) are still the debug mode's ``implicit`` rows
without a time, and inside a kernel-trace window the CUDA runtime's own records of them
(``probes.kernel_trace``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from threading import get_ident
from time import perf_counter_ns
from typing import Any

import torch

from mrv2_prof.probes.sync_site import WaitState, sync_site

DEVICE_SYNC, STREAM_SYNC, EVENT_SYNC = "device_sync", "stream_sync", "event_sync"
D2H_COPY, H2D_COPY, PAGEABLE_COPY, IMPLICIT = "d2h_copy", "h2d_copy", "copy", "implicit"
WAIT_KINDS = (DEVICE_SYNC, STREAM_SYNC, EVENT_SYNC, D2H_COPY, H2D_COPY, PAGEABLE_COPY, IMPLICIT)
# The runner's copy helper is a door, not a site: its caller is charged.
_COPY_HELPER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runner", "worker", "copy_audit.py"
)
_MISSING = object()


def copy_wait_kind(
    src_on_host: bool, dst_on_host: bool, host_pinned: bool, contiguous: bool, non_blocking: bool
) -> str | None:
    """The wait kind of one copy (None: the host does not wait for it)."""
    if src_on_host == dst_on_host:
        return None  # host to host, or device to device
    if not non_blocking:
        return H2D_COPY if src_on_host else D2H_COPY
    return None if host_pinned and contiguous else PAGEABLE_COPY


def _copy_kind(src: torch.Tensor, dst: Any, non_blocking: bool) -> str | None:
    if not isinstance(dst, torch.Tensor) or dst is src:
        return None
    src_host, dst_host = src.is_cpu, dst.is_cpu  # bools: no ``torch.device`` made per call
    if src_host == dst_host:
        return None
    contiguous = src.is_contiguous() and dst.is_contiguous()
    # pinned matters only to a non-blocking contiguous copy; asked last (it asks the driver)
    pinned = non_blocking and contiguous and (src if src_host else dst).is_pinned()
    return copy_wait_kind(src_host, dst_host, pinned, contiguous, non_blocking)


def _non_blocking_of_to(args: tuple, kwargs: dict) -> bool:
    """``non_blocking`` of a ``Tensor.to`` call: the keyword, else the first positional bool."""
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return next((a for a in args if isinstance(a, bool)), False)


class HostWaits:
    """A context manager around the step loop; every caught wait goes to ``probe.sync``."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.count = 0
        self._saved: list[tuple[Any, str, Any]] = []
        self._thread = -1

    # ---- installing the wrappers ---------------------------------------------------------------
    def __enter__(self) -> HostWaits:
        self._thread = get_ident()
        self._wrap(torch.cuda, "synchronize", self._sync_wrapper(DEVICE_SYNC))
        self._wrap(torch.cuda.Stream, "synchronize", self._sync_wrapper(STREAM_SYNC))
        self._wrap(torch.cuda.Event, "synchronize", self._sync_wrapper(EVENT_SYNC))
        for name in ("item", "tolist"):
            self._wrap(torch.Tensor, name, self._read_wrapper)
        self._wrap(torch.Tensor, "cpu", self._copy_wrapper(lambda a, k: False, _stays_cpu))
        cuda = self._copy_wrapper(self._non_blocking_of_cuda, _stays_cuda)
        self._wrap(torch.Tensor, "cuda", cuda)
        self._wrap(torch.Tensor, "to", self._copy_wrapper(_non_blocking_of_to, _stays_to))
        self._wrap(torch.Tensor, "copy_", self._copy_into_wrapper)
        WaitState.catching = True
        return self

    def __exit__(self, *exc: object) -> None:
        WaitState.catching = False
        for owner, name, before in reversed(self._saved):
            if before is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, before)
        self._saved.clear()

    def _wrap(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        wrapper = make(original)
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)

    # ---- the wrappers --------------------------------------------------------------------------
    # The steady step calls these for copies and reads that make no wait (a dtype conversion, a
    # pinned non-blocking copy, a read of a host tensor): those take the first return, with no
    # clock read, no closure and no site; the stack is walked only for a wait that is recorded.
    def _passes(self) -> bool:
        """A call not to record: a deliberate wait, one inside a caught call, another thread."""
        return WaitState.deliberate > 0 or WaitState.inside > 0 or get_ident() != self._thread

    def _timed(self, kind: str, call: Callable, *args: Any, **kwargs: Any) -> Any:
        WaitState.inside += 1
        t0 = perf_counter_ns()
        try:
            return call(*args, **kwargs)
        finally:
            blocked = perf_counter_ns() - t0
            WaitState.inside -= 1
            self._record(kind, blocked, t0)

    def _record(self, kind: str, blocked: int, t0: int) -> None:
        self.count += 1
        site = sync_site(sys._getframe(1), __file__, _COPY_HELPER)
        self.probe.sync(kind, site, blocked, t0)

    def _sync_wrapper(self, kind: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def synchronize(*args: Any, **kwargs: Any) -> Any:
                if self._passes():
                    return original(*args, **kwargs)
                return self._timed(kind, original, *args, **kwargs)

            return synchronize

        return make

    def _read_wrapper(self, original: Callable) -> Callable:
        def read(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if t.is_cpu or self._passes():
                return original(t, *args, **kwargs)
            return self._timed(IMPLICIT, original, t, *args, **kwargs)

        return read

    @staticmethod
    def _non_blocking_of_cuda(args: tuple, kwargs: dict) -> bool:
        if "non_blocking" in kwargs:
            return bool(kwargs["non_blocking"])
        return bool(args[1]) if len(args) > 1 else False

    def _copy_wrapper(
        self,
        non_blocking_of: Callable[[tuple, dict], bool],
        stays: Callable[[torch.Tensor, tuple, dict], bool],
    ) -> Callable:
        """``cpu``/``cuda``/``to``: the kind is known once the result's device is. ``stays`` tells
        from the call alone that the result is on the tensor's side (no crossing, nothing to
        time)."""

        def make(original: Callable) -> Callable:
            def convert(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if stays(t, args, kwargs) or self._passes():
                    return original(t, *args, **kwargs)
                WaitState.inside += 1
                t0 = perf_counter_ns()
                try:
                    out = original(t, *args, **kwargs)
                finally:
                    WaitState.inside -= 1
                blocked = perf_counter_ns() - t0
                if out is t:
                    return out
                kind = _copy_kind(t, out, non_blocking_of(args, kwargs))
                if kind is not None:
                    self._record(kind, blocked, t0)
                return out

            return convert

        return make

    def _copy_into_wrapper(self, original: Callable) -> Callable:
        def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> Any:
            if dst.is_cpu == getattr(src, "is_cpu", dst.is_cpu) or self._passes():
                return original(dst, src, non_blocking)  # same side: no crossing
            kind = _copy_kind(src, dst, non_blocking)
            if kind is None:
                return original(dst, src, non_blocking)
            return self._timed(kind, original, dst, src, non_blocking)

        return copy_


def _stays_cpu(t: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    return t.is_cpu  # ``.cpu()`` of a host tensor


def _stays_cuda(t: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    return not t.is_cpu  # ``.cuda()`` of a device tensor (device to device is no host wait)


def _stays_to(t: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """``.to(dtype)``, the common call on the step path: it cannot cross devices."""
    return not kwargs and len(args) == 1 and type(args[0]) is torch.dtype
