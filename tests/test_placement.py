"""Where a run ran, recorded with its environment (``pipeline/run_environment.py``): the host's
name, the GPU (name and driver read without torch for the parent) and the other processes on it
at the start; and how ``show``'s environment line says it (``views/environment.py``)."""

from __future__ import annotations

import os
import platform
import sys
import types

from mrv2_prof.pipeline import run_environment
from mrv2_prof.views.environment import environment_line


def _fake_nvml(monkeypatch, processes=None, error: Exception | None = None):
    def running(handle):
        if error is not None:
            raise error
        return processes

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"gpu{i}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlSystemGetDriverVersion=lambda: b"570.1",
        nvmlDeviceGetComputeRunningProcesses=running,
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _process(pid: int, used: int | None):
    return types.SimpleNamespace(pid=pid, usedGpuMemory=used)


def test_the_other_processes_on_the_gpu_leave_the_runner_out(monkeypatch):
    parent = os.getppid()  # a process whose name /proc tells
    with open(f"/proc/{parent}/comm") as f:
        name = f.read().strip()
    own = _process(os.getpid(), 2 * 2**30)
    _fake_nvml(monkeypatch, [own, _process(parent, 3 * 2**30), _process(2**22 + 7, None)])
    assert run_environment.gpu_cotenants("cuda:0") == {
        "gpu_cotenants": [
            {"pid": parent, "used_mib": 3072, "name": name},
            {"pid": 2**22 + 7, "used_mib": None, "name": None},  # no such process here
        ]
    }
    _fake_nvml(monkeypatch, [own])
    assert run_environment.gpu_cotenants("cuda:0") == {"gpu_cotenants": []}


def test_a_gpu_whose_processes_nvml_cannot_list_says_so(monkeypatch):
    class NVMLError_NotSupported(Exception):  # noqa: N801 (pynvml's name)
        pass

    _fake_nvml(monkeypatch, error=NVMLError_NotSupported())
    assert run_environment.gpu_cotenants("cuda:0") == {
        "gpu_cotenants_note": "NVML could not list the GPU's processes (NVMLError_NotSupported)"
    }


def test_without_nvml_nothing_is_said(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert run_environment.gpu_cotenants("cuda:0") == {}
    assert run_environment.gpu_identity("cuda:0") == {}


def test_the_gpu_identity_is_read_without_torch(monkeypatch):
    _fake_nvml(monkeypatch)
    assert run_environment.gpu_identity("cuda") == {
        "gpu_name": "NVIDIA H200",
        "gpu_driver": "570.1",
    }


def test_a_cpu_run_records_its_host_and_no_gpu_placement():
    env = run_environment.run_environment("cpu")
    assert env["host"] == platform.node()
    assert not any(key.startswith("gpu") for key in env)


def test_the_environment_line_names_the_host_and_the_gpus_other_processes():
    env = {"host": "node-7", "cpu_model": "EPYC", "cpu_count": 16, "torch": "2.9",
           "gpu_name": "H200", "gpu_driver": "570.1"}  # fmt: skip
    assert environment_line(env).startswith("host node-7; EPYC x16;")
    assert environment_line({**env, "gpu_cotenants": []}).endswith("H200, driver 570.1")
    others = [{"pid": 1, "used_mib": 1024, "name": "python3"},
              {"pid": 2, "used_mib": None, "name": None}]  # fmt: skip
    line = environment_line({**env, "gpu_cotenants": others})
    assert line.endswith("H200, driver 570.1, shared with 2 other processes (1,024 MiB: python3)")
    long = environment_line({**env, "host": "a-very-long-pod-name-0123456789-abcdef"})
    assert long.startswith("host a-very-long-pod-name-0123456789…; EPYC")
