"""Compiles after warm-up on a CUDA device: a compile planted in step 50 (a staged-write apply
on a dtype no staged tensor has, a new specialization of a step-path launcher) is recorded at
that step with its kernel and key, the finding names it and ``strict`` fails the run on it; a
warmed run of a shipped scenario (decode_heavy at length; each one but the smollm2 ones
shortened) records no compile after warm-up."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from test_run import cli, query

from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.runner.config import ConfigError, ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker.staged_write_triton import apply_packed_writes_triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ROOT = Path(__file__).resolve().parents[2]
KERNEL = "_apply_packed_writes_kernel"
CONFIG = RunnerConfig(
    device="cuda",
    max_num_reqs=16,
    max_num_seqs=4,
    max_model_len=256,
    num_kv_blocks=64,
    kernels="triton",
    cudagraph_mode="full_and_piecewise",
    cudagraph_capture_sizes=(1, 2, 4),
)


def _planted_run(
    config: RunnerConfig, at_step: int = 50, dtype: torch.dtype = torch.float64
) -> tuple[Engine, RecordingProbe]:
    """An engine warmed and serving four requests for 70 steps; inside step ``at_step`` the
    step-path staged-write launcher gets a base of ``dtype`` (an empty write: nothing changes;
    the launchers are process-wide, so each test plants its own dtype)."""
    probe = RecordingProbe()
    engine = Engine(config, ModelSpec(preset="llama-tiny"), probe)
    queue_step = engine.runner.queue_step

    def planted(so):
        if engine.step_index == at_step:
            base = torch.zeros(2, 8, dtype=dtype, device="cuda")
            apply_packed_writes_triton(base, torch.zeros(4, dtype=torch.int32, device="cuda"), 1, 0)
        return queue_step(so)

    engine.runner.queue_step = planted
    params = SamplingParams(max_tokens=70, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"r{i}", list(range(5 + i, 30 + i)), params)
    return engine, probe


def _compiles_to_the_end(engine: Engine, probe: RecordingProbe) -> dict:
    """Step ``engine`` until its requests are done, close it; the ``compiles`` rows recorded."""
    try:
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.close()
    return probe.drain()["compiles"]


def test_gpu_a_compile_planted_at_step_50_is_recorded_with_its_kernel_and_key():
    engine, probe = _planted_run(CONFIG)
    rows = _compiles_to_the_end(engine, probe)
    late = [
        (int(s), k, key, float(ms))
        for s, k, key, ms, after in zip(
            rows["step"], rows["kernel"], rows["key"], rows["compile_ms"], rows["after_warmup"],
            strict=True,
        )
        if after
    ]  # fmt: skip
    print("compiles after warm-up:", late)
    assert (rows["step"][~rows["after_warmup"]] == -1).all()  # start-up's: step -1
    planted = [c for c in late if c[1] == KERNEL and "float64" in c[2]]
    assert len(planted) == 1, late
    step, _, key, ms = planted[0]
    assert step == 50 and key.startswith("BLOCK=") and ms > 0
    assert late == [planted[0]], "the warmed engine compiled something besides the planted"


def test_gpu_strict_fails_the_step_that_compiled():
    strict = dataclasses.replace(CONFIG, strict=True)
    engine, _ = _planted_run(strict, at_step=30, dtype=torch.int16)
    try:
        with pytest.raises(ConfigError, match=rf"Triton kernel {KERNEL} compiled at step 30"):
            while engine.has_unfinished_requests():
                engine.step()
        assert engine.step_index == 30
    finally:
        engine.close()


PATHS = [  # every decode path on (the defaults: PDL and the fold auto, on an H200)
    "runner.decode_gemv=fused_onepass", "runner.decode_gemm=triton", "runner.pdl=true",
    "runner.rope_in_attention=true",
]  # fmt: skip


@pytest.mark.parametrize("paths", [[], PATHS], ids=["default-paths", "all-decode-paths"])
def test_gpu_a_warmed_shipped_scenario_records_no_compile_after_warm_up(tmp_path, paths):
    """decode_heavy at length on llama-tiny, with the default decode paths and with every
    path switched on (their kernels' variants warmed too)."""
    db = tmp_path / "runs.duckdb"
    args = ["run", str(ROOT / "scenarios/decode_heavy.yaml"), "--headless", "--db", str(db)]
    for s in ("model.preset=llama-tiny", "runner.num_kv_blocks=4096", "workload.num_requests=24",
              "workload.output_len.value=48", *paths):  # fmt: skip
        args += ["--set", s]
    proc = cli(*args, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    startup = query(db, "SELECT count(*) FROM compiles WHERE NOT after_warmup AND step = -1")
    late = query(db, "SELECT step, kernel, key FROM compiles WHERE after_warmup")
    assert startup[0][0] > 0  # the warm-up's compiles are recorded
    assert late == []


def test_gpu_a_decode_batch_wider_than_the_sms_compiles_nothing_after_warm_up(tmp_path):
    """decode_heavy on llama-tiny (2 kv heads) with 96 requests at once: its decode batches
    have more programs than the device has SMs, so they take the wide key tile
    (``attention_triton.decode_keys``), which the warm-up compiled with a batch of
    ``smallest_wide_batch`` requests: nothing compiles while serving."""
    from mrv2_prof.runner.model.attention_triton import smallest_wide_batch

    wide = smallest_wide_batch(2, torch.device("cuda"))
    db = tmp_path / "runs.duckdb"
    args = ["run", str(ROOT / "scenarios/decode_heavy.yaml"), "--headless", "--db", str(db)]
    for s in ("model.preset=llama-tiny", "runner.num_kv_blocks=4096", "workload.num_requests=96",
              "workload.output_len.value=24"):  # fmt: skip
        args += ["--set", s]
    proc = cli(*args, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    widest = query(db, "SELECT max(num_reqs) FROM steps WHERE num_prefill_tokens = 0")[0][0]
    assert widest >= wide, (widest, wide)  # the wide tile was served
    assert query(db, "SELECT step, kernel, key FROM compiles WHERE after_warmup") == []


# every shipped scenario but the smollm2 ones (a downloaded model), each matrix cell run
SHIPPED = sorted(p for p in (ROOT / "scenarios").glob("*.yaml") if "smollm2" not in p.stem)
# a scenario's requests, cut to a few so that each runs in seconds; its other settings as shipped
SHORTER = {"mixed_poisson": 12, "prefix_sharing": 12, "prefill_heavy": 8, "spec_decode": 6}


@pytest.mark.parametrize("scenario", SHIPPED, ids=lambda p: p.stem)
def test_gpu_each_warmed_shipped_scenario_records_no_compile_after_warm_up(tmp_path, scenario):
    """Each shipped scenario's step shapes (its batch sizes, sampling flags, chunked prefill,
    preemption, speculation, graph modes) on llama-tiny: every Triton specialization a step
    launches was compiled by the warm-up or the capture."""
    db = tmp_path / "runs.duckdb"
    args = ["run", str(scenario), "--headless", "--db", str(db)]
    sets = ["model.preset=llama-tiny", f"workload.num_requests={SHORTER.get(scenario.stem, 8)}"]
    for s in sets:
        args += ["--set", s]
    proc = cli(*args, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert query(db, "SELECT count(*) FROM steps")[0][0] > 0
    late = query(db, "SELECT run_id, step, kernel, key FROM compiles WHERE after_warmup")
    assert late == [], f"{scenario.name}: compiled after warm-up (run, step, kernel, key): {late}"


def test_gpu_a_kernel_launched_directly_is_caught_by_tritons_hooks():
    """A kernel launched with ``kernel[grid]`` (no launcher, as the model's kernels are) first
    launched at step 40 is recorded at that step by triton's JIT hooks, with its name."""
    import triton
    import triton.language as tl

    @triton.jit
    def _planted_direct_kernel(x_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)

    probe = RecordingProbe()
    engine = Engine(CONFIG, ModelSpec(preset="llama-tiny"), probe)
    queue_step = engine.runner.queue_step

    def planted(so):
        if engine.step_index == 40:
            _planted_direct_kernel[(1,)](torch.zeros(32, device="cuda"), BLOCK=32)
        return queue_step(so)

    engine.runner.queue_step = planted
    for i in range(2):
        engine.add_request(
            f"r{i}", list(range(5, 30)), SamplingParams(max_tokens=50, ignore_eos=True)
        )
    rows = _compiles_to_the_end(engine, probe)
    found = [
        (int(s), str(key)) for s, k, key in zip(rows["step"], rows["kernel"], rows["key"],
                                                strict=True)
        if k == "_planted_direct_kernel"
    ]  # fmt: skip
    assert len(found) == 1 and found[0][0] == 40, found
    assert "_planted_direct_kernel" in found[0][1]
