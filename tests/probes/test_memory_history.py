"""The memory-history window (probes/memory_history.py, ``probes.memory_history``): started
before its first step and dumped after its last, its steps and the one after them perturbed, a
note and nothing else on the CPU; on the GPU (``-m gpu``) a run's file loads with ``pickle`` and
holds what PyTorch's memory visualizer reads."""

from __future__ import annotations

import json
import pickle

import duckdb
import pytest
import torch

from mrv2_prof.probes import memory_history
from mrv2_prof.probes.memory_history import CPU_NOTE, MemoryHistory
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.probes.session import ProbeSession


@pytest.fixture
def recorded(monkeypatch):
    """The allocator's history calls, faked: what was switched and dumped, in order."""
    calls: list = []
    monkeypatch.setattr(
        torch.cuda.memory,
        "_record_memory_history",
        lambda enabled="all", **kw: calls.append(("record", enabled)),
    )

    def dump(path):
        with open(path, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[]]}, f)
        calls.append(("dump", path))

    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    monkeypatch.setattr(memory_history, "_pinned", lambda *a, **k: None)
    return calls


def test_the_window_starts_before_its_first_step_and_dumps_after_its_last(recorded, tmp_path):
    mh = MemoryHistory(3, 2, str(tmp_path / "memory_history"))
    for step in range(8):
        mh.after_step(step)
    assert [c[0] for c in recorded] == ["record", "dump", "record"]
    assert recorded[0] == ("record", "all") and recorded[-1] == ("record", None)
    assert mh.steps == [3, 4] and mh.perturbed_steps() == [3, 4, 5]
    assert mh.path is not None and mh.path.startswith(str(tmp_path / "memory_history"))
    assert mh.summary()["file"] == mh.path and mh.summary()["error"] is None


def test_a_run_stopped_inside_the_window_still_dumps(recorded, tmp_path):
    mh = MemoryHistory(0, 100, str(tmp_path))
    mh.after_step(0)
    mh.stop()
    assert [c[0] for c in recorded] == ["record", "dump", "record"]
    assert mh.steps == [0] and mh.path is not None


def test_the_probes_drive_the_window_and_marks_its_steps(recorded, tmp_path):
    probes = {"memory_history": (2, 2), "cuda_events": False}
    facts: dict = {}
    probing = ProbeSession(probes, RecordingProbe(), "cuda", [], str(tmp_path / "kernel_traces"))
    with probing.running():
        for step in range(6):
            probing.after_step(step)
    assert probing.perturbed_steps() == [2, 3, 4]
    probing.finish(facts)
    assert facts["memory_history_file"].startswith(str(tmp_path / "memory_history"))
    assert facts["memory_history"]["steps"] == [2, 3]


def test_on_the_cpu_a_note_and_nothing_else(recorded, tmp_path):
    notes: list[str] = []
    probing = ProbeSession({"memory_history": (0, 3)}, RecordingProbe(), "cpu", notes, None)
    probing.after_step(0)
    facts: dict = {}
    probing.finish(facts)
    assert notes == [CPU_NOTE] and recorded == [] and probing.perturbed_steps() == []
    assert "memory_history_file" not in facts


def test_the_default_is_off(recorded, tmp_path):
    probing = ProbeSession({"cuda_events": False}, RecordingProbe(), "cuda", [], None)
    probing.after_step(0)
    assert probing.memory_history is None and recorded == []


def _run_row(job):
    with duckdb.connect(job.db_path, read_only=True) as con:
        info = json.loads(con.execute("SELECT info FROM runs").fetchone()[0])
        perturbed = [s for (s,) in con.execute("SELECT step FROM steps WHERE perturbed").fetchall()]
    return info, sorted(perturbed)


def test_a_cpu_run_asked_for_a_window_notes_it(run_in_process):
    job, _ = run_in_process("probes.memory_history=[1, 2]")
    info, perturbed = _run_row(job)
    assert CPU_NOTE in info["notes"]
    assert "memory_history_file" not in info and perturbed == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_run_writes_a_snapshot_the_visualizer_reads(run_in_process):
    job, _ = run_in_process("runner.device=cuda", "probes.memory_history=[2, 3]")
    info, perturbed = _run_row(job)
    path = info["memory_history_file"]
    print(path, info["memory_history"])
    assert info["memory_history"]["error"] is None and info["memory_history"]["steps"] == [2, 3, 4]
    assert perturbed == [2, 3, 4, 5]
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert {"segments", "device_traces"} <= set(snapshot)
    assert snapshot["segments"] and any(snapshot["device_traces"])  # the window's events
    from torch.cuda import _memory_viz

    assert "segment" in _memory_viz.segsum(snapshot)  # PyTorch's own tools read it
    assert "snapshot.pickle" in _memory_viz.trace_plot(snapshot)  # the visualizer's page
