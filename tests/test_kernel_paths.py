"""The decode paths as runner settings (``runner.decode_gemv``, ``decode_gemm``, ``pdl``,
``rope_in_attention``; ``runner/worker/kernel_paths.py``) through the real command line on the
tiny CPU model: a path the run cannot take is a printed and stored note (``strict`` refuses it
before anything is written), a bad value is one line naming the field, and the as-run scenario
keeps what was asked."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.runner.config import RunnerConfig
from mrv2_prof.runner.worker import kernel_paths

runner = CliRunner()
SCENARIO = (
    "name: paths\nmodel: {preset: llama-tiny}\n"
    "runner: {device: cpu, num_kv_blocks: 64, max_model_len: 128}\n"
    "workload: {num_requests: 2, prompt_len: {dist: fixed, value: 8}, "
    "output_len: {dist: fixed, value: 4}}\n"
)


def _run(tmp_path: Path, *sets: str, strict: bool = False):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    db = tmp_path / "runs.duckdb"
    args = ["run", str(tmp_path / "s.yaml"), "--db", str(db), "--headless"]
    for s in sets:
        args += ["--set", s]
    result = runner.invoke(app, args + (["--strict"] if strict else []))
    return result, db


def test_a_decode_path_without_the_triton_kernels_is_a_note(tmp_path):
    result, db = _run(tmp_path, "runner.decode_gemm=triton", "runner.rope_in_attention=true")
    assert result.exit_code == 0, (result.output, result.exception)
    want = (
        "runner.decode_gemm: the decode paths (decode_gemm: triton, rope_in_attention: true) "
        "are the Triton kernels'; the torch ops run"
    )
    assert want in " ".join(result.output.split())
    with duckdb.connect(str(db), read_only=True) as con:
        info, yaml = con.execute("SELECT info, scenario_yaml FROM runs").fetchone()
    assert want in json.loads(info)["notes"]
    assert "decode_gemm: triton" in yaml and "rope_in_attention: true" in yaml  # as asked


def test_strict_refuses_it_before_anything_is_written(tmp_path):
    cpu_probes = ("probes.cuda_events=false", "runner.kernels=torch")  # else refused first
    result, db = _run(tmp_path, "runner.pdl=true", *cpu_probes, strict=True)
    assert result.exit_code == 2
    assert "runner.pdl" in result.output and "Traceback" not in result.output
    assert not db.exists()


def test_a_bad_value_is_one_line_naming_the_field(tmp_path):
    result, db = _run(tmp_path, "runner.decode_gemv=fast")
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "runner.decode_gemv" in lines[0], result.output
    assert not db.exists()


def test_pdl_needs_hopper(monkeypatch):
    """On a CUDA device, PDL is a note below compute capability 9.0 and none from 9.0."""
    config = RunnerConfig(device="cuda", pdl=True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    (note,) = kernel_paths.kernel_path_notes(config, "triton", is_cuda=True)
    assert note.startswith("runner.pdl:") and "this GPU has 8.0" in note
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert kernel_paths.kernel_path_notes(config, "triton", is_cuda=True) == []
    assert kernel_paths.kernel_path_notes(RunnerConfig(device="cuda"), "torch", True) == []


def test_the_runner_sets_the_kernel_switches_from_its_config():
    """The Triton bundle's switches follow the config; the torch bundle leaves them."""
    pytest.importorskip("triton")
    from mrv2_prof.runner.model import attention_decode_rope_triton, pdl, projections_triton

    config = RunnerConfig(
        device="cpu", decode_gemv="fused_onepass", decode_gemm="triton", pdl=True,
        rope_in_attention=True,
    )  # fmt: skip
    kernel_paths.apply_kernel_paths(config, "torch")
    assert projections_triton.DECODE_GEMV == "plain" and not pdl.LAUNCH_PDL
    kernel_paths.apply_kernel_paths(config, "triton")
    assert (projections_triton.DECODE_GEMV, projections_triton.DECODE_GEMM) == (
        "fused_onepass",
        "triton",
    )
    assert pdl.LAUNCH_PDL and attention_decode_rope_triton.ROPE_IN_DECODE_ATTENTION
