"""The decode paths as runner settings (``runner.decode_gemv``, ``decode_gemm``, ``pdl``,
``rope_in_attention``, ``split_kv``; ``runner/worker/kernel_paths.py``) through the real command
line on the tiny CPU model: a path the run cannot take is a printed and stored note (``strict``
refuses it before anything is written), a bad value is one line naming the field, and the as-run
scenario records the path that ran (``auto`` resolved), so that the asked-for one shows as a
downgrade."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch
import yaml as yaml_module
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.runner.config import RunnerConfig
from mrv2_prof.runner.worker import kernel_paths
from mrv2_prof.views.downgrades import downgrades


def ran_doc(text: str) -> dict:
    return yaml_module.safe_load(text)


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
        info, yaml, given = con.execute(
            "SELECT info, scenario_yaml, scenario_given_yaml FROM runs"
        ).fetchone()
    assert want in json.loads(info)["notes"]
    ran = yaml_module.safe_load(yaml)["runner"]
    assert (ran["decode_gemm"], ran["rope_in_attention"], ran["pdl"]) == ("cublas", False, False)
    found = {
        d.key: (d.asked, d.ran) for d in downgrades(yaml_module.safe_load(given), ran_doc(yaml))
    }
    assert found["runner.decode_gemm"] == ("triton", "cublas")
    assert found["runner.rope_in_attention"] == (True, False)
    assert "runner.pdl" not in found  # auto: not asked for


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
    """The Triton bundle's switches follow the paths the config resolves to."""
    pytest.importorskip("triton")
    from mrv2_prof.runner.model import (
        attention_decode_rope_triton,
        attention_split_kv_triton,
        pdl,
        projections_triton,
    )

    config = RunnerConfig(
        device="cpu", decode_gemv="fused_onepass", decode_gemm="triton", pdl=True,
        rope_in_attention=True, split_kv=True, fused_mlp=True,
    )  # fmt: skip
    kernel_paths.apply_kernel_paths(kernel_paths.resolved_paths(config, "triton", False))
    assert projections_triton.FUSED_MLP
    assert (projections_triton.DECODE_GEMV, projections_triton.DECODE_GEMM) == (
        "fused_onepass",
        "triton",
    )
    assert attention_decode_rope_triton.ROPE_IN_DECODE_ATTENTION
    assert attention_split_kv_triton.SPLIT_KV_ENABLED
    assert not pdl.LAUNCH_PDL  # asked for, but no CUDA device: a note (above), not taken


@pytest.mark.parametrize(
    ("path", "want"),
    [("cublas", ("cublas", None, ((2, 256),))), ("triton", ("triton", None, ((2, 256),))),
     ("narrow", ("triton", 1024, ((2, 64),)))],
)  # fmt: skip
def test_decode_gemm_sets_the_gemm_and_its_bounds(path, want):
    """``decode_gemm: narrow`` is the Triton GEMM held to projections of at most 1,024 outputs
    and 2-64 rows; ``triton`` takes every projection of 2-256 rows; ``cublas`` none. A warm-up
    runs the most rows of each launch variant's class that the GEMM serves (40 at a 40-token
    budget: 17-40 of the 17-64 class)."""
    pytest.importorskip("triton")
    from mrv2_prof.runner.model import projections_triton as proj

    config = RunnerConfig(device="cpu", decode_gemm=path)
    kernel_paths.apply_kernel_paths(kernel_paths.resolved_paths(config, "triton", False))
    got = (proj.DECODE_GEMM, proj.GEMM_MAX_FEATURES, proj.GEMM_ROWS)
    assert got == want
    x, narrow, wide = torch.zeros(16, 8), torch.zeros(1024, 8), torch.zeros(1025, 8)
    assert proj._gemm(x, narrow) is (path != "cublas")
    assert proj._gemm(x, wide) is (path == "triton")
    for rows, narrow_takes in ((1, False), (2, True), (17, True), (32, True), (33, True),
                               (64, True), (65, False), (256, False), (257, False)):  # fmt: skip
        takes = {"cublas": False, "triton": 1 < rows <= 256, "narrow": narrow_takes}[path]
        assert proj._gemm(torch.zeros(rows, 8), narrow) is takes, rows
    assert proj.warm_rows(512) == {"cublas": [], "triton": [16, 64, 128, 256, 257],
                                   "narrow": [16, 64, 65]}[path]  # fmt: skip
    # a warm shape of rows the GEMM does not serve (narrow: 256) takes the unserved count's place
    assert proj.warm_rows(512, (1, 4, 256)) == {"cublas": [], "triton": [16, 64, 128, 256, 257],
                                                "narrow": [16, 64]}[path]  # fmt: skip
    assert proj.warm_rows(40) == {"cublas": [], "triton": [16, 40], "narrow": [16, 40]}[path]
    assert proj.warm_rows(20) == {"cublas": [], "triton": [16, 20], "narrow": [16, 20]}[path]
    assert proj.warm_rows(12) == {"cublas": [], "triton": [12], "narrow": [12]}[path]


def test_auto_takes_pdl_the_fold_and_split_kv_where_the_run_can(monkeypatch):
    """``auto`` (the default of the three): all on with the Triton kernels on a GPU of compute
    capability 9.0 or more, PDL off below it, all off on the CPU and with the torch ops; a
    path asked for explicitly is kept (or, where it cannot run, off)."""
    defaults = RunnerConfig()
    assert (defaults.pdl, defaults.rope_in_attention, defaults.split_kv) == (None, None, None)
    auto = RunnerConfig(device="cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    hopper = kernel_paths.resolved_paths(auto, "triton", is_cuda=True)
    assert hopper == {
        "decode_gemv": "plain", "decode_gemm": "narrow", "pdl": True, "rope_in_attention": True,
        "split_kv": True, "fused_mlp": False,  # off until measured
    }  # fmt: skip
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    ampere = kernel_paths.resolved_paths(auto, "triton", is_cuda=True)
    assert (ampere["pdl"], ampere["rope_in_attention"], ampere["split_kv"]) == (False, True, True)
    on = RunnerConfig(device="cuda", split_kv=True)
    assert kernel_paths.resolved_paths(on, "triton", is_cuda=True)["split_kv"] is True
    assert kernel_paths.resolved_paths(on, "torch", is_cuda=True)["split_kv"] is False
    assert kernel_paths.kernel_path_notes(auto, "triton", is_cuda=True) == []  # auto: no note
    assert kernel_paths.resolved_paths(auto, "torch", is_cuda=True) == kernel_paths.OFF
    cpu = kernel_paths.resolved_paths(RunnerConfig(device="cpu"), "triton", is_cuda=False)
    assert (cpu["pdl"], cpu["rope_in_attention"], cpu["split_kv"]) == (False, False, False)
    off = RunnerConfig(device="cuda", decode_gemm="cublas", pdl=False, rope_in_attention=False,
                       split_kv=False)  # fmt: skip
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert kernel_paths.resolved_paths(off, "triton", is_cuda=True) == kernel_paths.OFF
    assert kernel_paths.kernel_path_notes(off, "torch", is_cuda=True) == []  # off asks nothing


def test_auto_decode_gemm_is_narrow_where_pdl_can_run_whatever_pdl_is_set_to(monkeypatch):
    """``decode_gemm: auto`` (the default): ``narrow`` with the Triton kernels on a GPU of
    compute capability 9.0 or more, with ``pdl`` on or off (so that PDL on and off serve the
    same kernels, and the same bits); ``cublas`` below 9.0, on the CPU and with the torch ops;
    never a note."""
    assert RunnerConfig().decode_gemm == "auto"
    config = RunnerConfig(device="cuda", decode_gemm="auto")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert kernel_paths.resolved_paths(config, "triton", is_cuda=True)["decode_gemm"] == "narrow"
    no_pdl = RunnerConfig(device="cuda", decode_gemm="auto", pdl=False)
    assert kernel_paths.resolved_paths(no_pdl, "triton", is_cuda=True)["decode_gemm"] == "narrow"
    assert kernel_paths.resolved_paths(config, "torch", is_cuda=True)["decode_gemm"] == "cublas"
    assert kernel_paths.kernel_path_notes(config, "triton", is_cuda=True) == []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert kernel_paths.resolved_paths(config, "triton", is_cuda=True)["decode_gemm"] == "cublas"
    cpu = RunnerConfig(device="cpu", decode_gemm="auto")
    assert kernel_paths.resolved_paths(cpu, "triton", is_cuda=False)["decode_gemm"] == "cublas"


def test_auto_decode_gemv_takes_the_one_pass_gemvs_on_a_narrow_model_on_a_gpu(monkeypatch):
    """``decode_gemv: auto`` (the default): ``fused_onepass`` with the Triton kernels on a GPU
    for a model of at most 768 hidden features (SmolLM2-135M's 576), ``plain`` for a wider one
    (qwen3-0.6b's 1,024), on the CPU, or when the width is not known; on an H100 SXM up to
    2,048 (llama-1b's), not 4,096 (the 8B's); an explicit value is kept; auto asks for nothing,
    so it is never a note."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    auto = RunnerConfig(device="cuda")
    assert auto.decode_gemv == "auto"

    def gemv(config, kernels="triton", is_cuda=True, hidden=None):
        return kernel_paths.resolved_paths(config, kernels, is_cuda, hidden)["decode_gemv"]

    assert [gemv(auto, hidden=h) for h in (576, 768, 769, 1024, 2048)] == [
        "fused_onepass", "fused_onepass", "plain", "plain", "plain"
    ]  # fmt: skip
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert [gemv(auto, hidden=h) for h in (576, 1024, 2048, 2049, 4096)] == [
        "fused_onepass", "fused_onepass", "fused_onepass", "plain", "plain"
    ]  # fmt: skip
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 PCIe")
    assert gemv(auto, hidden=1024) == "plain"  # not measured: the width of any other GPU
    assert gemv(auto, is_cuda=False, hidden=576) == "plain"
    assert gemv(auto) == "plain" and gemv(auto, "torch", hidden=576) == "plain"
    explicit = RunnerConfig(device="cuda", decode_gemv="plain")
    assert gemv(explicit, hidden=576) == "plain"
    assert gemv(RunnerConfig(device="cuda", decode_gemv="fused"), hidden=4096) == "fused"
    assert kernel_paths.kernel_path_notes(RunnerConfig(device="cpu"), "torch", False) == []


def test_the_as_run_scenario_records_the_resolved_decode_gemv(tmp_path):
    """Through the command line on the CPU: ``auto`` ran as ``plain`` and is recorded so (not a
    downgrade: auto asks for nothing); ``auto`` is a value a scenario may spell."""
    result, db = _run(tmp_path, "runner.decode_gemv=auto")
    assert result.exit_code == 0, (result.output, result.exception)
    with duckdb.connect(str(db), read_only=True) as con:
        yaml, given = con.execute("SELECT scenario_yaml, scenario_given_yaml FROM runs").fetchone()
    assert ran_doc(yaml)["runner"]["decode_gemv"] == "plain"
    assert ran_doc(given)["runner"]["decode_gemv"] == "auto"
    keys = {d.key for d in downgrades(ran_doc(given), ran_doc(yaml))}
    assert "runner.decode_gemv" not in keys


def test_auto_and_booleans_are_the_scenario_spellings(tmp_path):
    """``runner.pdl: auto | true | false``; anything else is one line naming the field."""
    result, db = _run(tmp_path, "runner.pdl=sometimes")
    assert result.exit_code == 2 and "runner.pdl" in result.output, result.output
    assert "'auto', true or false" in result.output and not db.exists()


def test_the_fused_mlp_without_the_batch_one_gemv_or_with_tensor_parallelism_is_a_note(
    monkeypatch,
):
    """``fused_mlp: true`` follows the batch-1 o GEMV, so with ``decode_gemv: off`` it cannot
    run, nor in a tensor-parallel shard (its MLP split at an all-reduce): a note naming why,
    and the path resolved off (the as-run scenario says false); with a GEMV path, no note."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    for config, why in (
        (RunnerConfig(device="cuda", fused_mlp=True, decode_gemv="off"), "decode_gemv is off"),
        (RunnerConfig(device="cuda", fused_mlp=True, tensor_parallel_size=2), "tensor-parallel"),
    ):
        notes = kernel_paths.kernel_path_notes(config, "triton", is_cuda=True)
        assert len(notes) == 1 and notes[0].startswith("runner.fused_mlp: ") and why in notes[0]
        assert notes[0].endswith("; not used")
        assert kernel_paths.resolved_paths(config, "triton", True, 576)["fused_mlp"] is False
    ok = RunnerConfig(device="cuda", fused_mlp=True, decode_gemv="plain")
    assert kernel_paths.kernel_path_notes(ok, "triton", is_cuda=True) == []
    assert kernel_paths.resolved_paths(ok, "triton", True, 576)["fused_mlp"] is True


def test_a_fused_mlp_behind_a_cublas_o_projection_resolves_off_with_a_note(monkeypatch):
    """``plain`` and ``hybrid`` hand an o projection of more than ``PLAIN_MAX_FEATURES``
    outputs (the model's hidden size) to cuBLAS, and the MLP in one launch follows the o GEMV:
    the path resolves off and the note names the width and the mode; the one-pass fused GEMV
    has no such bound, and a model at the bound keeps it."""
    from mrv2_prof.runner.model.projections_triton import PLAIN_MAX_FEATURES

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    wide = PLAIN_MAX_FEATURES + 1
    for mode in ("plain", "hybrid", "auto"):  # auto: plain at this width
        config = RunnerConfig(device="cuda", fused_mlp=True, decode_gemv=mode)
        paths = kernel_paths.resolved_paths(config, "triton", True, wide)
        assert paths["fused_mlp"] is False, mode
        note = kernel_paths.fused_mlp_too_wide(config, paths["decode_gemv"], wide)
        assert note == (
            f"runner.fused_mlp: the o projection's {wide:,} outputs take cuBLAS under "
            f"runner.decode_gemv: {paths['decode_gemv']} (its GEMV takes at most "
            f"{PLAIN_MAX_FEATURES:,}), and the MLP in one launch follows the o GEMV; not used"
        )
        at_bound = kernel_paths.resolved_paths(config, "triton", True, PLAIN_MAX_FEATURES)
        assert at_bound["fused_mlp"] is True, mode
    fused = RunnerConfig(device="cuda", fused_mlp=True, decode_gemv="fused_onepass")
    assert kernel_paths.resolved_paths(fused, "triton", True, wide)["fused_mlp"] is True
    assert kernel_paths.fused_mlp_too_wide(fused, "fused_onepass", wide) is None
    off = RunnerConfig(device="cuda", decode_gemv="plain")  # not asked for: no note
    assert kernel_paths.fused_mlp_too_wide(off, "plain", wide) is None
