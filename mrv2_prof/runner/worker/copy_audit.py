"""The copy audit: the one door every host<->device copy of the runner goes through.

``CopyAudit.copy_(dst, src)`` makes the copy and, when the probe audits copies, reports its
direction, bytes, whether the host side was pinned, whether both sides were contiguous, whether
it was ``non_blocking`` and the host time the call took. A ``non_blocking`` copy whose host side
is pageable or strided is a hidden sync: CUDA stages it through a bounce buffer and the call
returns only when the data has moved, and ``torch.cuda.set_sync_debug_mode`` does not report it.
Such a copy is also recorded as a sync (kind ``copy``) with the site the sync finder gives its
syncs: the first ``mrv2_prof`` frame outside this module (``probes.api.sync_site``), unless the
host-wait catcher is active (``probes.api.host_waits_active``): it catches every copy of the
runner, this door's included, and records the sync itself.

``to_device(host)`` is the "no async barrier" pattern of MRV2: the host tensor is snapshotted
into fresh pinned memory and sent with a non-blocking copy, so the CPU may rewrite the source at
once. With the audit off, each call costs one attribute check.
"""

from __future__ import annotations

import sys
from time import perf_counter_ns

import torch

from mrv2_prof.probes.api import Probe, host_waits_active, sync_site

H2D, D2H, D2D, H2H = "h2d", "d2h", "d2d", "h2h"
COPY_SYNC_KIND = "copy"


def direction(dst: torch.Tensor, src: torch.Tensor) -> str:
    src_host, dst_host = src.device.type == "cpu", dst.device.type == "cpu"
    if src_host:
        return H2H if dst_host else H2D
    return D2H if dst_host else D2D


class CopyAudit:
    def __init__(self, probe: Probe | None = None) -> None:
        self.probe = probe if probe is not None else Probe()

    def copy_(self, dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = True) -> None:
        """``dst.copy_(src, non_blocking=...)``, reported to the probe when it audits copies."""
        p = self.probe
        if not p.audits_copies:
            dst.copy_(src, non_blocking=non_blocking)
            return
        t0 = perf_counter_ns()
        dst.copy_(src, non_blocking=non_blocking)
        host_ns = perf_counter_ns() - t0
        d = direction(dst, src)
        if d == H2H:
            return  # CPU-only run: nothing crosses a bus
        host = src if d == H2D else dst
        pinned = host.is_pinned() if d != D2D else True
        contiguous = src.is_contiguous() and dst.is_contiguous()
        p.copy(d, src.numel() * src.element_size(), pinned, contiguous, non_blocking, host_ns)
        if non_blocking and not (pinned and contiguous) and not host_waits_active():
            p.sync(COPY_SYNC_KIND, sync_site(sys._getframe(1), __file__), host_ns)

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A host tensor on ``device`` from a fresh pinned snapshot (no barrier needed)."""
        if device.type == "cpu":
            return host
        out = torch.empty(host.shape, dtype=host.dtype, device=device)
        self.copy_(out, host.pin_memory())
        return out
