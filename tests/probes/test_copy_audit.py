"""The copy audit: every host<->device copy reported with its facts; a non-blocking copy from
pageable or strided host memory flagged as a hidden sync at the caller's line.

On a CPU machine the "device" side is a ``meta`` tensor: the audit only looks at devices,
pinning and layout, and a copy into ``meta`` runs without a GPU. The GPU test makes real copies.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.runner.worker.copy_audit import CopyAudit, direction

META = torch.device("meta")


def audited() -> tuple[RecordingProbe, CopyAudit]:
    probe = RecordingProbe()
    probe.audits_copies = True
    probe.step_begin(7)
    return probe, CopyAudit(probe)


def line_of_next_statement() -> int:
    return inspect.currentframe().f_back.f_lineno + 1


def test_a_planted_pageable_non_blocking_copy_is_flagged_at_its_line():
    probe, copies = audited()
    src = torch.arange(256, dtype=torch.int32)  # pageable
    line = line_of_next_statement()
    copies.copy_(torch.empty(256, dtype=torch.int32, device=META), src, non_blocking=True)
    out = probe.drain()
    c = out["copies"]
    assert c["step"].tolist() == [7]
    assert c["direction"].tolist() == ["h2d"]
    assert c["bytes"].tolist() == [256 * 4]
    assert c["pinned"].tolist() == [False]
    assert c["contiguous"].tolist() == [True]
    assert c["non_blocking"].tolist() == [True]
    assert c["host_ns"][0] >= 0
    s = out["syncs"]
    assert s["kind"].tolist() == ["copy"]
    # the caller, not the audit; outside mrv2_prof the full path, as the sync finder gives it
    assert s["site"].tolist() == [f"{__file__}:{line}"]
    assert s["blocked_ns"].tolist() == c["host_ns"].tolist()


def test_a_strided_source_is_flagged_and_a_blocking_copy_is_not():
    probe, copies = audited()
    strided = torch.arange(64, dtype=torch.float32).view(8, 8).t()  # not contiguous
    copies.copy_(torch.empty(8, 8, device=META), strided, non_blocking=True)
    copies.copy_(torch.empty(8, 8, device=META), strided, non_blocking=False)  # meant to wait
    out = probe.drain()
    assert out["copies"]["contiguous"].tolist() == [False, False]
    assert out["copies"]["non_blocking"].tolist() == [True, False]
    assert out["syncs"]["kind"].tolist() == ["copy"]  # only the non-blocking one


def test_directions_and_host_to_host_is_not_a_bus_copy():
    host, dev = torch.empty(1), torch.empty(1, device=META)
    assert [direction(dev, host), direction(host, dev), direction(dev, dev)] == [
        "h2d",
        "d2h",
        "d2d",
    ]
    probe, copies = audited()
    copies.copy_(torch.empty(4), torch.arange(4.0))  # a CPU run: nothing crosses a bus
    assert len(probe.drain()["copies"]["step"]) == 0


def test_with_the_audit_off_the_copy_happens_and_nothing_is_recorded():
    probe = RecordingProbe()  # audits_copies is False unless the scenario asks
    dst = torch.zeros(4)
    CopyAudit(probe).copy_(dst, torch.arange(4.0), non_blocking=True)
    assert dst.tolist() == [0.0, 1.0, 2.0, 3.0]
    out = probe.drain()
    assert len(out["copies"]["step"]) == 0 and len(out["syncs"]["step"]) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_copies_on_the_gpu_pinned_is_clean_pageable_is_flagged():
    probe, copies = audited()
    dev = torch.device("cuda")
    n = 1 << 20
    copies.copy_(torch.empty(n, device=dev), torch.ones(n).pin_memory())
    copies.copy_(torch.empty(n, device=dev), torch.ones(n))  # pageable, non_blocking
    back = torch.empty(n, pin_memory=True)
    copies.copy_(back, torch.full((n,), 2.0, device=dev))
    torch.cuda.synchronize()
    assert back[0].item() == 2.0
    out = probe.drain()
    c = out["copies"]
    assert c["direction"].tolist() == ["h2d", "h2d", "d2h"]
    assert c["pinned"].tolist() == [True, False, True]
    assert c["bytes"].tolist() == [4 * n] * 3
    assert len(out["syncs"]["kind"]) == 1  # the pageable one
