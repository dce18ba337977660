"""The host sampler: samples land in the phase where a planted sleep sits, with its function
name; with sampling off nothing is recorded and no thread runs."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from mrv2_prof.probes import api
from mrv2_prof.probes.host_sampler import IDLE, HostSampler, frame_label
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
