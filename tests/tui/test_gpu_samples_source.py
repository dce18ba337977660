"""RunnerProcess as the dashboard's source of NVML samples (no process is started)."""

from __future__ import annotations

from mrv2_prof.pipeline.launcher import GPU_SAMPLE_WINDOW, RunnerProcess


class FakeSampler:
    """Stands in for NvmlSampler: ``latest()`` is the newest row, as the sampler thread keeps it."""

    def __init__(self) -> None:
        self.row: tuple[int, float, int, float, float] | None = None

    def latest(self):
        return self.row


def test_each_new_sample_is_kept_once_in_order_up_to_the_window(quickstart_job) -> None:
    runner = RunnerProcess(quickstart_job())
    assert runner.gpu_samples() == ([], None)  # before the runner started: nothing, no note
    runner.nvml = sampler = FakeSampler()
    assert runner.gpu_samples() == ([], None)  # no sample taken yet
    sampler.row = (100, 50.0, 2**30, 200.0, 1500.0)
    runner.gpu_samples()
    assert runner.gpu_samples() == ([(100, 50.0, 2**30, 200.0, 1500.0)], None)  # not twice
    for t in range(1, GPU_SAMPLE_WINDOW + 5):
        sampler.row = (100 + t, 1.0 * t, 2**30, 200.0, 1500.0)
        samples, _ = runner.gpu_samples()
    assert len(samples) == GPU_SAMPLE_WINDOW
    assert [row[0] for row in samples] == list(range(105, 105 + GPU_SAMPLE_WINDOW))


def test_a_cpu_run_gets_the_samplers_note(quickstart_job) -> None:
    runner = RunnerProcess(quickstart_job("probes.nvml_hz=10"))
    runner._handle("started", {"device": "cpu", "notes": []})  # the runner's start message
    samples, note = runner.gpu_samples()
    assert samples == []
    assert note == "probes.nvml_hz: the run is on the CPU; no GPU telemetry"
