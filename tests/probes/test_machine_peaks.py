"""The machine's peaks (probes/machine_peaks.py): the tensor-core table, a given or cached HBM
bandwidth taken without measuring, and the measurement itself on a GPU."""

from __future__ import annotations

import pytest
import torch

from mrv2_prof.probes.machine_peaks import machine_peaks, read_bandwidth, tensor_peak


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H200", 989.4),
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
    ],
)
def test_known_gpus_have_their_datasheet_peak(name, tflops):
    flops, how = tensor_peak(name, "bfloat16")
    assert flops == tflops * 1e12 and name in how


def test_an_unknown_gpu_or_float32_has_no_peak_and_says_why():
    assert tensor_peak("NVIDIA GeForce GTX 1080", "float16") == (
        None,
        "NVIDIA GeForce GTX 1080 is not in the table of tensor-core peaks",
    )
    flops, how = tensor_peak("NVIDIA H200", "float32")
    assert flops is None and "float32" in how


ENV = {"gpu_uuid": "GPU-1234", "gpu_name": "NVIDIA H200"}


def test_a_given_bandwidth_is_taken_without_measuring():
    peaks = machine_peaks("cuda:0", ENV, "bfloat16", 4800, {"GPU-1234": [4.1e12, "r1"]})
    assert peaks["hbm_read_bytes_per_s"] == 4.8e12
    assert peaks["hbm_source"] == "given: probes.hbm_gbps = 4800"
    assert peaks["tensor_flops_per_s"] == 989.4e12


def test_a_cached_bandwidth_names_the_run_that_measured_it():
    peaks = machine_peaks("cuda:0", ENV, "bfloat16", 0, {"GPU-1234": [4.1e12, "r1"]})
    assert peaks["hbm_read_bytes_per_s"] == 4.1e12
    assert peaks["hbm_source"] == "cached: measured by run r1"


def test_the_cpu_has_no_peaks():
    assert machine_peaks("cpu", {}, "float32", 0) == {"note": "the CPU has no device timeline"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_measured_bandwidth_is_a_plausible_hbm_figure():
    """Against an independent timing: one big copy (read + write) timed by CUDA events reads at
    least half as fast as the reduction; and an H200 (4.8 TB/s nominal) reads 3-4.8 TB/s."""
    bw, how = read_bandwidth("cuda:0")
    assert how.startswith("measured")
    x = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    y.copy_(x)
    end.record()
    end.synchronize()
    copy_read = x.numel() * 2 / (start.elapsed_time(end) / 1e3)
    assert bw >= 0.5 * copy_read
    if "H200" in torch.cuda.get_device_name():
        assert 3.0e12 < bw < 4.8e12
