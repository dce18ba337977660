"""NVML telemetry in the parent: samples from a fake NVML at the asked rate, the GPU picked as
CUDA picks it, a missing NVML as one note, the energy counter (NULL and one note where the GPU
does not report it), and the samples of a real run in ``gpu_samples``."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import duckdb
import numpy as np
import pytest

from mrv2_prof.pipeline import launcher
from mrv2_prof.probes.nvml_sampler import ENERGY_NOTE, NvmlSampler

COLUMNS = ("t_ns", "gpu_util", "mem_used_bytes", "power_w", "sm_clock_mhz", "energy_mj")


class NotSupported(Exception):
    pass


class FakeNvml:
    NVML_CLOCK_SM = 1

    def __init__(self, power_supported: bool = True, energy_supported: bool = True) -> None:
        self.power_supported = power_supported
        self.energy_supported = energy_supported
        self.opened = None
        self.shut = False
        self.reads = 0
        self.energy_mj = 5_000_000  # mJ since the driver loaded

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, i):
        self.opened = ("index", i)
        return "h"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.opened = ("uuid", uuid)
        return "h"

    def nvmlDeviceGetUtilizationRates(self, h):
        self.reads += 1
        return SimpleNamespace(gpu=37, memory=5)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=12 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        if not self.power_supported:
            raise NotSupported("power readings are not supported")
        return 412_500  # mW

    def nvmlDeviceGetClockInfo(self, h, clock):
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.energy_supported:
            raise NotSupported("energy readings are not supported")
        self.energy_mj += 7  # 7 mJ more at each read
        return self.energy_mj


def test_samples_at_the_asked_rate_with_the_gpu_values(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNvml()
    s = NvmlSampler(100, "cuda:1", nvml=nvml)
    assert s.start() and s.note is None
    time.sleep(0.3)
    cols = s.stop()
    assert nvml.opened == ("index", 1) and nvml.shut
    n = len(cols["t_ns"])
    assert 10 <= n <= 40  # ~30 at 100 Hz over 0.3 s, with slack for a busy machine
    assert list(cols) == list(COLUMNS)
    assert np.all(np.diff(cols["t_ns"]) > 0)
    assert set(cols["gpu_util"]) == {37.0} and set(cols["sm_clock_mhz"]) == {1980.0}
    assert set(cols["mem_used_bytes"]) == {12 * 2**30} and set(cols["power_w"]) == {412.5}
    assert cols["energy_mj"].tolist() == list(range(5_000_007, 5_000_007 + 7 * n, 7))
    assert cols["energy_mj"].dtype == np.int64 and s.energy_note is None
    time.sleep(0.05)
    assert nvml.reads == n  # stopped: no more reads


def test_a_quantity_the_gpu_does_not_report_is_nan():
    s = NvmlSampler(50, "cuda:0", nvml=FakeNvml(power_supported=False))
    assert s.start()
    cols = s.stop()
    assert len(cols["t_ns"]) >= 1 and np.isnan(cols["power_w"]).all()
    assert (cols["gpu_util"] == 37).all()


def test_an_energy_counter_the_gpu_does_not_report_is_null_and_one_note(tmp_path):
    from mrv2_prof.store import Store

    s = NvmlSampler(200, "cuda:0", nvml=FakeNvml(energy_supported=False))
    assert s.start() and s.note is None
    time.sleep(0.05)
    cols = s.stop()
    assert len(cols["t_ns"]) >= 2 and cols["energy_mj"].mask.all()
    assert s.energy_note == (
        "probes.nvml_hz: this GPU does not report NVML's energy counter; no energy per token"
    )
    with Store.open(tmp_path / "runs.duckdb") as store:
        store.begin_run(
            "r1", scenario_name="s", label=None, matrix_combo=None, scenario_yaml="name: s\n",
            device="cuda:0", versions={}, started_ns=0,
        )  # fmt: skip
        store.append("r1", "gpu_samples", cols)
        nulls, n = store.connection.execute(
            "SELECT count(*) FILTER (WHERE energy_mj IS NULL), count(*) FROM gpu_samples"
        ).fetchone()
    assert nulls == n == len(cols["t_ns"])


@pytest.mark.parametrize(
    "visible, device, opened",
    [("3", "cuda:0", ("index", 3)), ("GPU-5e1d", "cuda:0", ("uuid", "GPU-5e1d")),
     (None, "cuda:2", ("index", 2)), ("", "cuda", ("index", 0))],
)  # fmt: skip
def test_the_gpu_is_found_as_cuda_finds_it(monkeypatch, visible, device, opened):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = FakeNvml()
    s = NvmlSampler(10, device, nvml=nvml)
    assert s.start()
    s.stop()
    assert nvml.opened == opened


def test_no_nvml_or_no_gpu_is_one_note():
    cpu = NvmlSampler(20, "cpu")
    assert not cpu.start() and cpu.note == "probes.nvml_hz: the run is on the CPU; no GPU telemetry"

    class Broken(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    s = NvmlSampler(20, "cuda:0", nvml=Broken())
    assert not s.start()
    assert s.note == (
        "probes.nvml_hz: NVML is not available (NVML Shared Library Not Found); no GPU telemetry"
    )
    assert {k: len(v) for k, v in s.stop().items()} == dict.fromkeys(COLUMNS, 0)


def _run_on_a_fake_gpu(quickstart_job, monkeypatch, fake: FakeNvml, requests: int):
    """A quickstart in a real runner process while the parent samples ``fake`` at 50 Hz."""
    monkeypatch.setattr(
        launcher, "NvmlSampler", lambda hz, device: NvmlSampler(hz, "cuda:0", nvml=fake)
    )
    job = quickstart_job("probes.nvml_hz=50", f"workload.num_requests={requests}")
    runner = launcher.RunnerProcess(job)
    runner.start()
    outcome = runner.join()
    assert outcome.status == "completed"
    return job, outcome


def test_a_run_stores_its_samples_or_the_note(quickstart_job, monkeypatch):
    """A real runner process; the parent samples a fake GPU while it runs."""
    job, outcome = _run_on_a_fake_gpu(quickstart_job, monkeypatch, FakeNvml(), 64)
    with duckdb.connect(job.db_path, read_only=True) as con:
        n, lo, hi, util = con.execute(
            "SELECT count(*), min(t_ns), max(t_ns), avg(gpu_util) FROM gpu_samples "
            "WHERE run_id = ?",
            [outcome.run_id],
        ).fetchone()
        first_step, last_step = con.execute(
            "SELECT min(cpu_start_ns), max(cpu_end_ns) FROM steps"
        ).fetchone()
        (energy,) = con.execute(
            "SELECT count(energy_mj) FROM gpu_samples WHERE run_id = ?", [outcome.run_id]
        ).fetchone()
    assert n >= 1 and util == 37.0 and energy == n
    assert lo <= last_step and hi >= first_step  # the same clock as the runner's records

    monkeypatch.undo()  # the real sampler: this run is on the CPU
    job = quickstart_job("probes.nvml_hz=20", "workload.num_requests=2")
    runner = launcher.RunnerProcess(job)
    runner.start()
    outcome = runner.join()
    with duckdb.connect(job.db_path, read_only=True) as con:
        (info,) = con.execute("SELECT info FROM runs WHERE run_id = ?", [outcome.run_id]).fetchone()
        (n,) = con.execute(
            "SELECT count(*) FROM gpu_samples WHERE run_id = ?", [outcome.run_id]
        ).fetchone()
    assert n == 0
    assert "probes.nvml_hz: the run is on the CPU; no GPU telemetry" in json.loads(info)["notes"]


def test_nvml_off_samples_nothing_and_says_nothing(quickstart_job, monkeypatch):
    made = []
    monkeypatch.setattr(launcher, "NvmlSampler", lambda *a: made.append(a))
    job = quickstart_job("probes.nvml_hz=0", "workload.num_requests=2")
    runner = launcher.RunnerProcess(job)
    runner.start()
    outcome = runner.join()
    with duckdb.connect(job.db_path, read_only=True) as con:
        (info,) = con.execute("SELECT info FROM runs").fetchone()
        (n,) = con.execute("SELECT count(*) FROM gpu_samples").fetchone()
    assert outcome.status == "completed" and made == [] and n == 0
    assert not any("nvml" in note for note in json.loads(info)["notes"])


def test_a_gpu_without_the_energy_counter_leaves_its_note_on_the_run(quickstart_job, monkeypatch):
    fake = FakeNvml(energy_supported=False)
    job, outcome = _run_on_a_fake_gpu(quickstart_job, monkeypatch, fake, 8)
    with duckdb.connect(job.db_path, read_only=True) as con:
        (info,) = con.execute("SELECT info FROM runs WHERE run_id = ?", [outcome.run_id]).fetchone()
    notes = json.loads(info)["notes"]
    assert [n for n in notes if "energy" in n] == [ENERGY_NOTE]
