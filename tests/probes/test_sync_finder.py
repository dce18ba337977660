"""The sync-point finder: each synchronising call inside the step loop becomes a ``syncs`` row
with its step and the first ``mrv2_prof`` frame as its site.

On the CPU torch has no syncs to report, so the CPU tests plant torch's warning itself inside
the runner; the GPU test plants a real ``.item()`` and leaves the rest to torch's sync debug
mode."""

from __future__ import annotations

import inspect
import json
import warnings

import duckdb
import numpy as np
import pytest
import torch

from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.probes.sync_finder import SYNC_MESSAGE, SyncFinder
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker import model_runner


def queue_step_line() -> int:
    """The line of engine.py that calls ``queue_step``: the site a sync inside it is charged to
    when the synchronising frame itself is not in mrv2_prof."""
    from mrv2_prof.runner import engine

    lines, first = inspect.getsourcelines(engine.Engine.step)
    return first + next(i for i, text in enumerate(lines) if "self.runner.queue_step(" in text)


def test_a_planted_sync_is_found_with_its_step_and_site(monkeypatch, recwarn):
    probe = RecordingProbe()
    engine = Engine(
        RunnerConfig(
            device="cpu",
            num_kv_blocks=64,
            max_model_len=128,
            kernels="torch",
            async_scheduling=False,
            uva=False,
            cudagraph_mode="none",
        ),
        ModelSpec(),
        probe,
    )
    original = model_runner.ModelRunner.queue_step

    def queue_step(self, so, *a, **k):
        if engine.step_index == 3:  # torch's warning, as sync debug mode issues it
            warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)
        return original(self, so, *a, **k)

    monkeypatch.setattr(model_runner.ModelRunner, "queue_step", queue_step)
    engine.add_request("a", list(range(1, 9)), SamplingParams(max_tokens=6))
    with SyncFinder(probe, debug_mode=False) as finder:
        while engine.has_unfinished_requests():
            engine.step()
        warnings.warn("an unrelated warning", stacklevel=1)  # passes through untouched
    syncs = probe.drain()["syncs"]
    implicit = [i for i, kind in enumerate(syncs["kind"]) if kind == "implicit"]
    assert finder.count == 1 and len(implicit) == 1
    assert [str(w.message) for w in recwarn] == ["an unrelated warning"]
    i = implicit[0]
    assert syncs["step"][i] == 3
    assert syncs["site"][i] == f"mrv2_prof/runner/engine.py:{queue_step_line()}"
    assert syncs["blocked_ns"][i] == -1  # not measured: stored as NULL
    # the designed wait is still there, once per step, with its own kind
    assert sum(kind == "output_wait" for kind in syncs["kind"]) == 6


def plant() -> None:
    warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)


def test_the_finder_catches_every_occurrence_and_restores_warnings():
    """Outside mrv2_prof the site is the first frame that is not torch's or the finder's."""
    probe = RecordingProbe()
    before = warnings.showwarning
    with SyncFinder(probe, debug_mode=False) as finder:
        for _ in range(3):
            plant()  # the same site three times
    assert finder.count == 3  # not just the first, as the default filter would
    assert warnings.showwarning is before
    sites = set(probe.drain()["syncs"]["site"])
    assert sites == {f"{__file__}:{plant.__code__.co_firstlineno + 1}"}


def test_a_cpu_run_asking_for_the_finder_says_why_it_found_nothing(run_in_process):
    job, _ = run_in_process("probes.sync_finder=true", "workload.num_requests=2")
    with duckdb.connect(job.db_path, read_only=True) as con:
        info = json.loads(con.execute("SELECT info FROM runs").fetchone()[0])
        kinds = {k for (k,) in con.execute("SELECT DISTINCT kind FROM syncs").fetchall()}
    assert (
        "probes.sync_finder: the run is on the CPU; there are no CUDA syncs to find"
        in (info["notes"])
    )
    assert kinds == {"output_wait"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_planted_item_on_the_gpu_is_found(monkeypatch):
    probe = RecordingProbe()
    config = RunnerConfig(
        device="cuda", kernels="triton", num_kv_blocks=256, max_model_len=256,
        async_scheduling=True, uva=True, cudagraph_mode="none",
    )  # fmt: skip
    engine = Engine(config, ModelSpec(preset="llama-tiny"), probe)
    original = model_runner.ModelRunner._prepare_inputs

    def prepare_inputs(self, so):
        batch = original(self, so)
        if engine.step_index == 4:
            batch.seq_lens.max().item()  # the planted hidden sync
        return batch

    monkeypatch.setattr(model_runner.ModelRunner, "_prepare_inputs", prepare_inputs)
    for i in range(8):
        engine.add_request(f"r{i}", list(range(1 + i, 20 + i)), SamplingParams(max_tokens=8))
    with SyncFinder(probe):
        while engine.has_unfinished_requests():
            engine.step()
    syncs = probe.drain()["syncs"]
    found = [
        (int(step), site)
        for step, kind, site in zip(syncs["step"], syncs["kind"], syncs["site"], strict=True)
        if kind == "implicit"
    ]
    lines, first = inspect.getsourcelines(model_runner.ModelRunner._queue_step)
    line = first + next(i for i, t in enumerate(lines) if "self._prepare_inputs(so)" in t)
    assert found == [(4, f"mrv2_prof/runner/worker/model_runner.py:{line}")]
    assert np.sum(syncs["kind"] == "output_wait") > 0
