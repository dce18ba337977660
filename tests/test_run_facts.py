"""What a run stores about itself: the clock its arrivals count from, the scenario as given and
as run, and the environment it ran in."""

from __future__ import annotations

import json
import os

import duckdb
import yaml

from mrv2_prof.pipeline.effective_scenario import as_run, graph_mode
from mrv2_prof.scenario import Scenario
from mrv2_prof.views.environment import environment_differences


def _row(job, sql: str):
    with duckdb.connect(job.db_path, read_only=True) as con:
        return con.execute(sql).fetchone()


def test_the_first_step_starts_within_1_ms_of_the_first_arrival_in_the_quickstart(run_in_process):
    job, _ = run_in_process()
    first_arrival, first_step = _row(
        job,
        "SELECT (SELECT min(arrival_ns) FROM requests), (SELECT min(cpu_start_ns) FROM steps)",
    )
    gap_ns = first_step - first_arrival
    print(f"first step began {gap_ns / 1e3:.1f} µs after the first arrival")
    assert 0 <= gap_ns < 1_000_000


def test_the_scenario_as_run_says_what_ran_and_round_trips(run_in_process):
    job, _ = run_in_process(
        "runner.kernels=triton", "runner.cudagraph_mode=full", "runner.uva=true",
        "probes.cuda_events=true",
    )  # fmt: skip
    given_yaml, ran_yaml = _row(job, "SELECT scenario_given_yaml, scenario_yaml FROM runs")
    given, ran = yaml.safe_load(given_yaml), yaml.safe_load(ran_yaml)
    assert given["runner"]["kernels"] == "triton" and given["runner"]["cudagraph_mode"] == "full"
    assert given["store"]["db"] == "runs.duckdb"  # the file's, though --db sent it elsewhere
    assert ran["store"]["db"] == job.db_path
    assert ran["runner"] | {} == given["runner"] | {
        "device": "cpu", "kernels": "torch", "cudagraph_mode": "none", "uva": False,
        "num_kv_blocks": 512, "pdl": False, "rope_in_attention": False,  # auto: off on the CPU
        "split_kv": False, "decode_gemv": "plain", "decode_gemm": "cublas",
    }  # fmt: skip
    assert ran["model"]["dtype"] == "float32"
    assert ran["probes"]["cuda_events"] is False  # a CPU run records no GPU timeline
    # round trip: the stored scenario validates to itself, and asks for exactly what ran
    assert Scenario.model_validate(ran).model_dump(mode="json") == ran
    again = as_run(
        ran, db_path=job.db_path, device="cpu", dtype="float32", kernels="torch", uva=False,
        full_sizes=(), piecewise_sizes=(), num_kv_blocks=512, nvtx=False,
    )  # fmt: skip
    assert again == ran


def test_graph_mode_of_the_captured_sizes():
    assert graph_mode((1, 2), (8,)) == "full_and_piecewise"
    assert graph_mode((1,), ()) == "full"
    assert graph_mode((), (4,)) == "piecewise"
    assert graph_mode((), ()) == "none"


def test_the_environment_is_stored_with_the_run(run_in_process):
    job, _ = run_in_process()
    (env_json,) = _row(job, "SELECT environment FROM runs")
    env = json.loads(env_json)
    assert env["cpu_count"] == os.cpu_count() and env["cpu_model"]
    assert len(env["load_avg_start"]) == 3 and len(env["load_avg_end"]) == 3
    import torch

    assert env["torch"] == torch.__version__
    assert env["torch_threads"] == torch.get_num_threads()
    assert env["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS")


def test_environment_differences_name_hardware_software_and_threads():
    a = {"cpu_model": "X", "cpu_count": 2, "torch": "2.9", "cuda": None, "torch_threads": 2}
    b = dict(a, cpu_count=16, torch="2.10", torch_threads=16)
    assert environment_differences(a, b) == [
        "hardware: cpu_count differs (2 vs 16)",
        "software: torch differs (2.9 vs 2.10)",
        "threads: torch_threads differs (2 vs 16)",
    ]
    assert environment_differences(a, dict(a)) == []
    assert environment_differences({}, b) == []  # a run stored before environments: no claim


def _two_runs(path):
    from mrv2_prof.store import Store

    with Store.open(path) as store:
        for run_id, torch_version, perturbed in (
            ("aaaaaa", "2.9", False),
            ("bbbbbb", "2.10", True),
        ):
            store.begin_run(run_id, scenario_name="x", label=run_id, matrix_combo=None,
                            scenario_yaml="", device="cpu", versions={}, started_ns=0)  # fmt: skip
            env = {"cpu_model": "X", "cpu_count": 2, "torch": torch_version, "cuda": None}
            store.update_run(run_id, environment=env)
            store.append(run_id, "steps", {"step": [0, 1], "perturbed": [False, perturbed]})
            store.finish_run(run_id, "completed", ended_ns=1)


def test_compare_and_gate_warn_across_torch_versions_and_name_perturbed_steps(tmp_path):
    from typer.testing import CliRunner

    from mrv2_prof.cli import app

    db = tmp_path / "r.duckdb"
    _two_runs(db)
    warning = "warning: the runs differ in software: torch differs (2.9 vs 2.10)"
    note = "note: run bbbbbb: 1 perturbed steps (traced or capturing) left out of overlap, bubbles"
    res = CliRunner().invoke(app, ["compare", "aaaaaa", "bbbbbb", "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert warning in res.output and note in " ".join(res.output.split())
    res = CliRunner().invoke(
        app, ["gate", "--baseline", "aaaaaa", "--candidate", "bbbbbb", "--db", str(db), "--json"]
    )
    assert res.exit_code == 2  # runs on another torch are not gated without --allow-different
    assert "torch: torch differs ('2.9' vs '2.10', run bbbbbb)" in res.output
    res = CliRunner().invoke(
        app,
        ["gate", "--baseline", "aaaaaa", "--candidate", "bbbbbb", "--db", str(db), "--json",
         "--allow-different"],
    )  # fmt: skip
    data = json.loads(res.output)
    assert data["warnings"][0] == warning


def test_the_summary_shows_the_environment(run_in_process):
    from rich.console import Console

    from mrv2_prof.analysis.summary import render_summary
    from mrv2_prof.store import Store

    job, _ = run_in_process()
    with Store.open(job.db_path, read_only=True) as store:
        console = Console(record=True, width=300)
        console.print(render_summary(store, store.resolve_run("latest")))
    text = console.export_text()
    line = next(line for line in text.splitlines() if line.startswith("environment"))
    assert f"x{os.cpu_count()}" in line and "torch " in line


def test_gpu_driver_and_clocks_come_from_nvml_for_the_runs_gpu(monkeypatch):
    import sys
    import types

    from mrv2_prof.pipeline import run_environment
    from mrv2_prof.views.environment import environment_line

    calls = []
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(i) or f"gpu{i}",
        nvmlSystemGetDriverVersion=lambda: b"570.1",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(),
        nvmlDeviceGetClockInfo=lambda h, c: (1755, 3201)[c],
        nvmlDeviceGetMaxClockInfo=lambda h, c: (1980, 3201)[c],
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    facts = run_environment._nvml_facts("cuda:0")
    assert calls == [3]  # the first visible device, as CUDA numbers it
    assert facts == {"gpu_driver": "570.1", "gpu_uuid": "GPU-gpu3", "gpu_sm_clock_mhz": 1755,
                     "gpu_mem_clock_mhz": 3201, "gpu_max_sm_clock_mhz": 1980,
                     "gpu_max_mem_clock_mhz": 3201}  # fmt: skip
    line = environment_line(
        {"cpu_model": "EPYC", "cpu_count": 16, "torch": "2.9", "gpu_name": "H200", **facts}
    )
    assert line.endswith("H200, driver 570.1, SM 1755/1980 MHz")
