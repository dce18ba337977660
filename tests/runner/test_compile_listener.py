"""Compiles seen by the launcher and the engine: the listener hears each new specialization
once (not a hit), with the launcher's name, a readable key and the JIT call's time; the
JIT path reports nothing and says so; ``strict`` fails the step after warm-up that compiled."""

from __future__ import annotations

import dataclasses
from time import perf_counter_ns

import pytest
import torch
from test_triton_launch import FakeJIT, jit_of

from mrv2_prof.probes.api import Probe
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.runner.config import ConfigError, ModelSpec, RunnerConfig
from mrv2_prof.runner.worker import triton_launch
from mrv2_prof.runner.worker.compile_watch import CompileWatch
from mrv2_prof.runner.worker.staged_write_triton import _apply_packed_writes_kernel
from mrv2_prof.runner.worker.triton_launch import Launcher, key_text


@pytest.fixture
def heard(monkeypatch):
    """Fast launch on a stand-in runtime, and what the compile listener hears."""
    from types import SimpleNamespace

    knobs = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(triton_launch, "_runtime", lambda: (lambda: 0, lambda d: 7000, knobs))
    triton_launch.set_fast_launch(True)
    calls: list[tuple[str, str, float]] = []
    triton_launch.set_compile_listener(lambda *a: calls.append(a))
    yield calls
    triton_launch.set_compile_listener(None)
    triton_launch.set_fast_launch(True)


def test_the_listener_hears_each_new_key_once_and_no_hit(heard):
    launcher = Launcher(FakeJIT(jit_of(_apply_packed_writes_kernel)), "apply_listened")
    base, buf = torch.zeros(8, 4, dtype=torch.int32), torch.zeros(32, dtype=torch.int32)
    launcher((3,), base, 4, buf, 3, BLOCK=256)
    launcher((5,), base, 4, buf, 5, BLOCK=256)  # the same classes: a hit
    assert len(heard) == 1
    name, key, ms = heard[0]
    assert name == "apply_listened" and ms >= 0
    assert key == "BLOCK=256; int32@16, i32, int32@16, i32"
    launcher((1,), base, 16, buf, 1, BLOCK=256)  # a row stride of 16: another class (n is not
    # specialised on its value)
    launcher((1,), base, 16, buf, 1, BLOCK=128)  # another constexpr
    launcher((1,), base, 16, buf, 1, BLOCK=128)
    assert [k for _, k, _ in heard[1:]] == [
        "BLOCK=256; int32@16, %16, int32@16, i32",
        "BLOCK=128; int32@16, %16, int32@16, i32",
    ]
    assert launcher.misses == 3 and launcher.hits == 2


def test_a_long_key_is_cut():
    kwargs = tuple((f"C{i}", 2**i) for i in range(60))
    text = key_text((0, (torch.float16, (torch.int64, False)), kwargs))
    assert len(text) == 200 and text.endswith("…") and text.startswith("C0=1, C1=2")
    assert key_text((0, (torch.float16, (torch.int64, False), (False, False, False, False)), ()))


def test_the_jit_path_reports_nothing_and_notes_it(heard):
    launcher = Launcher(FakeJIT(jit_of(_apply_packed_writes_kernel)), "apply_off_listened")
    base, buf = torch.zeros(8, 4, dtype=torch.int32), torch.zeros(32, dtype=torch.int32)
    triton_launch.set_fast_launch(False)
    launcher((3,), base, 4, buf, 3, BLOCK=256)
    launcher((3,), base, 4, buf, 3, BLOCK=64)
    assert heard == []
    assert any("compiles are not recorded" in n for n in triton_launch.notes())


def test_the_recording_probe_stores_a_compile_at_its_step():
    probe = RecordingProbe()
    probe.kernel_compile("triton", "_k", "BLOCK=16; int32@16", 12.5)  # start-up
    probe.step_begin(0)
    probe.step_begin(1)
    probe.kernel_compile("triton", "_k", "BLOCK=32; int32@16", 250.0)
    rows = probe.drain()["compiles"]
    assert rows["step"].tolist() == [-1, 1]
    assert rows["after_warmup"].tolist() == [False, True]
    assert rows["kernel"].tolist() == ["_k", "_k"] and rows["source"].tolist() == ["triton"] * 2
    assert rows["key"].tolist() == ["BLOCK=16; int32@16", "BLOCK=32; int32@16"]
    assert rows["compile_ms"].tolist() == [12.5, 250.0]
    assert 0 < rows["t_ns"][1] <= perf_counter_ns() - 250_000_000  # when it began
    assert len(probe.drain()["compiles"]["step"]) == 0  # drained


def test_strict_refuses_a_compile_after_warm_up_not_before():
    watch = CompileWatch(Probe(), strict=True).attach()
    try:
        assert triton_launch.compile_listener() is watch
        watch("_k", "BLOCK=16", 3.0)  # start-up: expected
        assert watch.late is None
        watch.warm()
        watch("_advance_kernel", "BLOCK=32; int64@16", 40.0)
        with pytest.raises(ConfigError, match="Triton kernel _advance_kernel compiled at step 7"):
            watch.check(7)
    finally:
        watch.detach()
    assert triton_launch.compile_listener() is None
    # neither recording nor strict: no listener
    CompileWatch(Probe(), strict=False).attach()
    assert triton_launch.compile_listener() is None


def test_a_strict_engine_fails_the_step_a_kernel_compiled_in():
    from mrv2_prof.runner.core.request import SamplingParams
    from mrv2_prof.runner.engine import Engine

    config = RunnerConfig(
        device="cpu", max_num_reqs=4, max_num_seqs=2, max_num_batched_tokens=64,
        max_model_len=64, num_kv_blocks=16, async_scheduling=False, uva=False,
        cudagraph_mode="none", kernels="torch", strict=True,
    )  # fmt: skip
    probe = RecordingProbe()
    engine = Engine(config, ModelSpec(preset="llama-tiny"), probe)
    try:
        engine.add_request("r0", list(range(3, 12)), SamplingParams(max_tokens=8, ignore_eos=True))
        engine.step()
        engine.step()
        queue_step = engine.runner.queue_step

        def compiling(so):  # a launcher's cache miss inside step 2
            triton_launch.compile_listener()("_advance_kernel", "BLOCK=64; int64@16", 90.0)
            return queue_step(so)

        engine.runner.queue_step = compiling
        with pytest.raises(ConfigError, match=r"_advance_kernel compiled at step 2, after warm-up"):
            engine.step()
    finally:
        engine.close()
    assert triton_launch.compile_listener() is None
    rows = probe.drain()["compiles"]
    assert rows["step"].tolist() == [2] and rows["after_warmup"].tolist() == [True]


def test_a_plain_engine_sets_no_listener():
    from mrv2_prof.runner.engine import Engine

    config = RunnerConfig(
        device="cpu", max_num_reqs=4, max_num_seqs=2, max_num_batched_tokens=64,
        max_model_len=64, num_kv_blocks=16, async_scheduling=False, uva=False,
        cudagraph_mode="none", kernels="torch",
    )  # fmt: skip
    engine = Engine(dataclasses.replace(config), ModelSpec(preset="llama-tiny"))
    assert triton_launch.compile_listener() is None
    engine.close()
