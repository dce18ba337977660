"""The host sampler: samples land in the phase where a planted sleep sits, with its function
name; with sampling off nothing is recorded and no thread runs."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from mrv2_prof.probes import api
from mrv2_prof.probes.host_sampler import IDLE, STARTUP, HostSampler, frame_label
from mrv2_prof.probes.recording import RecordingProbe


def planted_sleep(seconds: float) -> None:
    time.sleep(seconds)


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_samples_land_in_the_phase_of_the_planted_sleep_with_its_name():
    probe = RecordingProbe()
    probe.step_begin(3)  # before the first sample: on a loaded host one can come at once
    sampler = HostSampler(500, probe).start()
    try:
        probe.begin(api.SCHEDULE)
        busy(0.05)
        probe.end(api.SCHEDULE)
        probe.begin(api.UPDATE)
        planted_sleep(0.3)
        probe.end(api.UPDATE)
        busy(0.05)  # in the step, outside its phases
        probe.step_end(1, 1, 0, 0, 1, 1, 0, 0, "none")
        busy(0.05)  # outside the step
    finally:
        sampler.stop()
    assert not sampler.running
    rows = sampler.drain()
    phases, stacks = list(rows["phase"]), list(rows["stack"])
    leaf = [s.split(";")[-1] for s in stacks]
    in_sleep = [p for p, f in zip(phases, leaf, strict=True) if f.startswith("planted_sleep ")]
    assert len(in_sleep) >= 20, f"{len(in_sleep)} samples in the sleep of 0.3 s at 500 Hz"
    assert set(in_sleep) == {"update"}
    in_busy = {p for p, f in zip(phases, leaf, strict=True) if f.startswith("busy ")}
    assert in_busy == {"schedule", "step", IDLE}  # in schedule, in the step, after it
    assert set(rows["step"]) == {3}
    # root first: the test function calls the planted one
    s = next(s for s, f in zip(stacks, leaf, strict=True) if f.startswith("planted_sleep "))
    frames = s.split(";")
    assert frames[-2].startswith("test_samples_land_in_the_phase_of_the_planted_sleep")
    assert list(rows["depth"]) == [len(x.split(";")) for x in stacks]
    assert sampler.facts()["host_samples"] == sampler.num_samples == len(phases)


def test_without_a_probe_samples_are_start_up_until_it_follows_one():
    """Started before the run's probe exists (the harness's start-up), a sampler stamps its
    samples ``startup`` and step -1; after ``follow`` they carry the probe's step and phase."""
    sampler = HostSampler(500).start()
    try:
        planted_sleep(0.1)
        probe = RecordingProbe()
        probe.step_begin(4)
        probe.begin(api.UPDATE)
        sampler.follow(probe)
        busy(0.1)
        probe.end(api.UPDATE)
    finally:
        sampler.stop()
    rows = sampler.drain()
    leaf = [s.split(";")[-1] for s in rows["stack"]]
    stamps = list(zip(rows["step"], rows["phase"], leaf, strict=True))
    asleep = {(int(step), p) for step, p, f in stamps if f.startswith("planted_sleep ")}
    working = {(int(step), p) for step, p, f in stamps if f.startswith("busy ")}
    assert asleep == {(-1, STARTUP)} and working == {(4, "update")}
    assert sum(f.startswith("planted_sleep ") for f in leaf) >= 10


def test_frame_label_names_the_function_and_its_file():
    assert frame_label(planted_sleep.__code__) == "planted_sleep (probes/test_host_sampler.py)"
    assert frame_label(HostSampler.sample.__code__) == (
        "HostSampler.sample (mrv2_prof/probes/host_sampler.py)"
    )


def test_a_rate_of_zero_is_not_a_sampler():
    with pytest.raises(ValueError, match="host_sampling_hz"):
        HostSampler(0, RecordingProbe())


def _samples(job) -> list[tuple]:
    con = duckdb.connect(job.db_path, read_only=True)
    try:
        return con.execute("SELECT step, phase, stack FROM host_samples").fetchall()
    finally:
        con.close()


def test_the_harness_stores_samples_in_the_phase_of_a_planted_sleep(run_in_process, monkeypatch):
    from mrv2_prof.runner.core.scheduler import Scheduler

    update = Scheduler.update_from_output

    def slow_update(self, *args, **kwargs):
        planted_sleep(0.004)
        return update(self, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "update_from_output", slow_update)
    job, messages = run_in_process("probes.host_sampling_hz=400")
    assert messages[-1][1].status == "completed"
    rows = _samples(job)
    in_sleep = [(step, phase) for step, phase, s in rows if "planted_sleep (" in s.split(";")[-1]]
    assert len(in_sleep) >= 20
    assert {phase for _, phase in in_sleep} == {"update"}
    assert all(step >= 0 for step, _ in in_sleep)
    assert messages[-1][1].facts["host_samples"] == len(rows)


def test_the_harness_samples_the_runner_s_start_up(run_in_process, monkeypatch):
    """With the sampler on, the engine's start-up is sampled too: a sleep planted in it lands in
    ``startup`` samples at step -1, every one before the first served sample."""
    import mrv2_prof.runner.engine as engine

    start_up = engine.start_up

    def slow_start_up(runner):
        planted_sleep(0.15)
        return start_up(runner)

    monkeypatch.setattr(engine, "start_up", slow_start_up)
    job, messages = run_in_process("probes.host_sampling_hz=400")
    assert messages[-1][1].status == "completed"
    con = duckdb.connect(job.db_path, read_only=True)
    try:
        rows = con.execute("SELECT step, t_ns, phase, stack FROM host_samples").fetchall()
    finally:
        con.close()
    asleep = [(step, phase) for step, _, phase, s in rows if "planted_sleep (" in s]
    assert len(asleep) >= 10 and set(asleep) == {(-1, "startup")}
    assert all("slow_start_up" in s for _, _, _, s in rows if "planted_sleep (" in s)
    last_start = max(t for _, t, phase, _ in rows if phase == "startup")
    served = [t for _, t, phase, _ in rows if phase != "startup"]
    assert served and min(served) > last_start
    facts = messages[-1][1].facts  # the start-up samples' own time, for the start-up line
    assert 0 < facts["startup_sampler_s"] < facts["startup_s"]


def test_with_sampling_off_nothing_is_recorded_and_no_thread_runs(run_in_process, monkeypatch):
    started = []
    real_start = threading.Thread.start

    def start(self):
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    job, messages = run_in_process()  # the default: probes.host_sampling_hz 0
    assert messages[-1][1].status == "completed"
    assert "mrv2-host-sampler" not in started
    assert "mrv2-store-writer" in started  # the check sees the harness's threads
    assert _samples(job) == []
    assert "host_samples" not in messages[-1][1].facts
