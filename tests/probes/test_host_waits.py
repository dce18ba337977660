"""The host-wait catcher: explicit synchronize calls and copies that make the host wait, each a
``syncs`` row with its kind, step, site and blocked time.

A CPU build cannot synchronize a device or copy from one, so the CPU tests stand a fake in for
what needs CUDA (a synchronize that sleeps, a ``.cpu()`` / ``.item()`` of a ``meta`` tensor) before
the catcher wraps it; a copy into a ``meta`` tensor is a real host->"device" copy. The GPU tests
(tests/probes/test_measurements_gpu.py) plant the real calls in the runner."""

from __future__ import annotations

import inspect
import threading
import time
import warnings

import pytest
import torch

from mrv2_prof.probes import host_waits as hw
from mrv2_prof.probes.host_waits import HostWaits, copy_wait_kind
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.probes.sync_finder import SYNC_MESSAGE, SyncFinder
from mrv2_prof.probes.sync_site import wait_deliberately
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker import model_runner
from mrv2_prof.runner.worker.copy_audit import CopyAudit

META = torch.device("meta")
SLEEP_S = 0.002


def _sleep(*args, **kwargs) -> None:
    time.sleep(SLEEP_S)


@pytest.fixture
def fake_device(monkeypatch):
    """Synchronize calls that sleep, and reads of a meta tensor that sleep and return host data."""
    monkeypatch.setattr(torch.cuda, "synchronize", _sleep)
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", _sleep)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", _sleep)
    cpu, item, tolist = torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.tolist

    def on_meta(original, make):
        def call(t, *a, **k):
            if t.device.type != "meta":
                return original(t, *a, **k)
            time.sleep(SLEEP_S)
            return make(t)

        return call

    monkeypatch.setattr(torch.Tensor, "cpu", on_meta(cpu, lambda t: torch.zeros(t.shape)))
    monkeypatch.setattr(torch.Tensor, "item", on_meta(item, lambda t: 0))
    monkeypatch.setattr(torch.Tensor, "tolist", on_meta(tolist, lambda t: [0] * t.numel()))


def rows(probe: RecordingProbe) -> list[tuple[int, str, str, int]]:
    s = probe.drain()["syncs"]
    return [
        (int(step), str(kind), str(site), int(b))
        for step, kind, site, b in zip(
            s["step"], s["kind"], s["site"], s["blocked_ns"], strict=True
        )
    ]


def test_every_kind_planted_at_consecutive_lines_is_found_at_its_line(fake_device):
    probe = RecordingProbe()
    probe.step_begin(5)
    dev = torch.zeros(4, device=META)
    pageable, strided = torch.ones(4), torch.ones(4, 2).t()
    with HostWaits(probe) as waits:
        first = inspect.currentframe().f_lineno + 1
        torch.cuda.synchronize()
        torch.cuda.Stream.synchronize(object())
        torch.cuda.Event.synchronize(object())
        dev.cpu()
        dev.item()
        dev.tolist()
        pageable.to(META)
        dev.copy_(pageable, non_blocking=True)
        torch.zeros(2, 4, device=META).copy_(strided, non_blocking=True)
        pageable.to(META, non_blocking=True)
        pageable.to(torch.float64)  # host to host: no wait
        dev.to(META)  # device to device: no wait
    found = rows(probe)
    kinds = ["device_sync", "stream_sync", "event_sync", "d2h_copy", "implicit", "implicit",
             "h2d_copy", "copy", "copy", "copy"]  # fmt: skip
    assert [k for _, k, _, _ in found] == kinds
    assert [site for _, _, site, _ in found] == [f"{__file__}:{first + i}" for i in range(10)]
    assert {step for step, _, _, _ in found} == {5}
    assert all(b >= SLEEP_S * 1e9 for _, _, _, b in found[:6])  # the waits that slept
    assert all(b >= 0 for _, _, _, b in found)
    assert waits.count == 10


def test_the_wrapped_entry_points_are_restored(fake_device):
    before = {n: torch.Tensor.__dict__.get(n) for n in ("item", "to", "copy_", "cpu", "cuda")}
    sync, stream_sync = torch.cuda.synchronize, torch.cuda.Stream.synchronize
    with HostWaits(RecordingProbe()):
        assert torch.cuda.synchronize is not sync
        assert "to" in torch.Tensor.__dict__
    assert {n: torch.Tensor.__dict__.get(n) for n in before} == before
    assert torch.cuda.synchronize is sync and torch.cuda.Stream.synchronize is stream_sync


def test_deliberate_waits_and_other_threads_pass_unrecorded(fake_device):
    probe = RecordingProbe()
    with HostWaits(probe) as waits:
        wait_deliberately(torch.cuda.synchronize)
        wait_deliberately(lambda: torch.cuda.Event.synchronize(object()))
        t = threading.Thread(target=torch.cuda.synchronize)
        t.start()
        t.join()
        torch.cuda.synchronize()  # the one to record
    assert waits.count == 1
    assert [k for _, k, _, _ in rows(probe)] == ["device_sync"]


def test_a_sync_the_debug_mode_reports_inside_a_caught_call_is_counted_once(monkeypatch):
    def cpu_that_warns(t, *a, **k):
        warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)
        return torch.zeros(t.shape)

    monkeypatch.setattr(torch.Tensor, "cpu", cpu_that_warns)
    probe = RecordingProbe()
    with SyncFinder(probe, debug_mode=False) as finder, HostWaits(probe):
        torch.zeros(3, device=META).cpu()
        warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)  # outside a caught call
    assert finder.count == 1
    assert sorted(k for _, k, _, _ in rows(probe)) == ["d2h_copy", "implicit"]


def test_a_copy_through_the_runners_helper_is_one_row_charged_to_its_caller():
    probe = RecordingProbe()
    probe.audits_copies = True
    copies = CopyAudit(probe)
    with HostWaits(probe):
        line = inspect.currentframe().f_lineno + 1
        copies.copy_(torch.empty(4, device=META), torch.ones(4), non_blocking=True)
    out = probe.drain()
    assert out["copies"]["direction"].tolist() == ["h2d"]  # the audit's row is still there
    assert out["syncs"]["kind"].tolist() == ["copy"]
    assert out["syncs"]["site"].tolist() == [f"{__file__}:{line}"]


def test_planted_waits_in_the_runner_carry_their_step(fake_device, monkeypatch):
    """The planted calls run inside ``queue_step``; the site is the runner's line that called
    the planted code (the first frame inside mrv2_prof)."""
    probe = RecordingProbe()
    config = RunnerConfig(
        device="cpu", num_kv_blocks=64, max_model_len=128, kernels="torch",
        async_scheduling=False, uva=False, cudagraph_mode="none",
    )  # fmt: skip
    engine = Engine(config, ModelSpec(), probe)
    original = model_runner.ModelRunner.queue_step

    def queue_step(self, so, *a, **k):
        if engine.step_index == 2:
            torch.cuda.synchronize()
        if engine.step_index == 4:
            torch.empty(8, device=META).copy_(torch.ones(8), non_blocking=True)
        return original(self, so, *a, **k)

    monkeypatch.setattr(model_runner.ModelRunner, "queue_step", queue_step)
    engine.add_request("a", list(range(1, 9)), SamplingParams(max_tokens=6))
    with HostWaits(probe):
        while engine.has_unfinished_requests():
            engine.step()
    from mrv2_prof.runner import engine as engine_module

    lines, first = inspect.getsourcelines(engine_module.Engine.step)
    line = first + next(i for i, text in enumerate(lines) if "self.runner.queue_step(" in text)
    site = f"mrv2_prof/runner/engine.py:{line}"
    found = [(s, k, site_) for s, k, site_, _ in rows(probe) if k != "output_wait"]
    assert found == [(2, "device_sync", site), (4, "copy", site)]


@pytest.mark.parametrize(
    ("src_host", "dst_host", "pinned", "contiguous", "non_blocking", "kind"),
    [
        (True, False, True, True, True, None),  # pinned, contiguous, async: no wait
        (True, False, False, True, True, hw.PAGEABLE_COPY),
        (True, False, True, False, True, hw.PAGEABLE_COPY),  # strided
        (False, True, False, True, True, hw.PAGEABLE_COPY),  # into pageable: waits for the copy
        (False, True, True, True, True, None),
        (False, True, True, True, False, hw.D2H_COPY),
        (True, False, True, True, False, hw.H2D_COPY),
        (False, False, False, False, False, None),  # device to device
        (True, True, False, False, False, None),  # host to host
    ],
)
def test_the_copy_rule(src_host, dst_host, pinned, contiguous, non_blocking, kind):
    assert copy_wait_kind(src_host, dst_host, pinned, contiguous, non_blocking) == kind


def two_waits(dev: torch.Tensor) -> None:
    dev.item()
    torch.cuda.synchronize()


def test_the_site_cache_keeps_two_lines_of_one_function_apart(fake_device):
    """Sites are cached per code object: two waits at different lines of one function are two
    sites, and the same line met twice is two rows; the finder's implicit sites likewise."""
    probe = RecordingProbe()
    dev = torch.zeros(2, device=META)
    with SyncFinder(probe, debug_mode=False) as finder, HostWaits(probe) as waits:
        for _ in range(2):
            two_waits(dev)
        for _ in range(2):
            warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)  # one line, twice
        warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)  # the next line
        here = inspect.currentframe().f_lineno
    first = two_waits.__code__.co_firstlineno
    assert waits.count == 4 and finder.count == 3
    got = [(k, site) for _, k, site, _ in rows(probe)]
    caught = [("implicit", f"{__file__}:{first + 1}"), ("device_sync", f"{__file__}:{first + 2}")]
    implicit = [("implicit", f"{__file__}:{here - 2}")] * 2 + [
        ("implicit", f"{__file__}:{here - 1}")
    ]
    assert got == caught * 2 + implicit
