"""Scenario files: loading, defaults, one-line errors naming the field, overrides, matrices."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mrv2_prof.runner.config import ConfigError, RunnerConfig
from mrv2_prof.scenario import (
    QUICKSTART_YAML,
    FixedLen,
    Scenario,
    ScenarioError,
    UniformLen,
    expand_matrix,
    load_quickstart,
    load_scenario,
)

FULL = """\
name: decode-heavy
seed: 7
model:
  preset: llama-1b
  dtype: bfloat16
runner:
  device: auto
  max_num_reqs: 1024
  max_num_seqs: 256
  max_num_batched_tokens: 8192
  max_model_len: 4096
  block_size: 16
  num_kv_blocks: auto
  gpu_memory_utilization: 0.8
  kernels: triton
  async_scheduling: true
  staged_writes: true
  uva: true
  cudagraph_mode: full_and_piecewise
  cudagraph_capture_sizes: auto
  strict: false
workload:
  num_requests: 512
  arrival: {pattern: poisson, rate: 64}
  prompt_len: {dist: uniform, min: 64, max: 512}
  output_len: {dist: fixed, value: 256}
  sampling: {temperature: 0.0, top_k: 0, top_p: 1.0, logprobs: 0}
probes: {nvtx: true, cuda_events: true, sync_finder: true, copy_audit: true, nvml_hz: 10,
         kernel_trace: false}
store: {db: runs.duckdb}
matrix:
  runner.cudagraph_mode: [full, none]
  runner.async_scheduling: [true, false]
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, overrides)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ")
    return msg


def test_full_example_loads(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, FULL))
    assert (s.name, s.seed, s.model.preset, s.model.dtype) == (
        "decode-heavy",
        7,
        "llama-1b",
        "bfloat16",
    )
    assert s.runner.kernels == "triton" and s.runner.num_kv_blocks == "auto"
    assert s.runner.cudagraph_mode == "full_and_piecewise"
    assert s.workload.num_requests == 512
    assert (s.workload.arrival.pattern, s.workload.arrival.rate) == ("poisson", 64)
    assert s.workload.prompt_len == UniformLen(dist="uniform", min=64, max=512)
    assert s.workload.output_len == FixedLen(dist="fixed", value=256)
    assert s.probes.nvml_hz == 10 and not s.probes.kernel_trace
    assert s.matrix == {
        "runner.cudagraph_mode": ["full", "none"],
        "runner.async_scheduling": [True, False],
    }
    cfg = s.runner_config()
    assert cfg.num_kv_blocks is None and cfg.seed == 7 and cfg.kernels == "triton"
    assert s.model_spec().seed == 7


def test_defaults(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, "name: x\n"))
    assert s.seed == 0 and s.model.preset == "llama-tiny" and s.model.path is None
    r = s.runner
    assert (r.device, r.max_num_reqs, r.max_num_seqs, r.max_num_batched_tokens) == (
        "auto",
        1024,
        256,
        8192,
    )
    assert (r.max_model_len, r.block_size, r.gpu_memory_utilization) == ("auto", 16, 0.8)
    assert r.async_scheduling and r.staged_writes and r.uva and not r.strict
    assert r.cudagraph_mode == "full_and_piecewise" and r.cudagraph_capture_sizes == "auto"
    w = s.workload
    assert w.num_requests is None and w.arrival.pattern == "burst" and w.abort_fraction == 0
    assert w.ignore_eos is None and not w.as_fast_as_possible and w.trace is None
    assert s.probes.nvtx and s.probes.nvml_hz == 10 and s.store.db == "runs.duckdb"
    assert s.probes.cuda_events and not (s.probes.sync_finder or s.probes.copy_audit)
    assert expand_matrix(s) == [("x", s)]


def test_model_path_instead_of_preset(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, "name: x\nmodel: {path: ./ckpt}\n"))
    assert s.model.preset is None and s.model.path == "./ckpt"
    # both: the path replaces the preset, and a note on the run says so
    s = load_scenario(write(tmp_path, "name: x\nmodel: {path: ./ckpt, preset: llama-tiny}\n"))
    assert s.model.preset is None and s.model.path == "./ckpt"
    assert s.notes == ("model.path './ckpt' replaces the scenario's model.preset 'llama-tiny'",)


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        ("name: x\nbogus: 1\n", "bogus", "unknown key"),
        ("name: x\nrunner: {foo: 1}\n", "runner.foo", "unknown key"),
        (
            "name: x\nworkload: {arrival: {pattern: burst, speed: 2}}\n",
            "workload.arrival.speed",
            "unknown key",
        ),
        ("name: x\nrunner: {max_num_seqs: many}\n", "runner.max_num_seqs", "integer"),
        ("name: x\nrunner: {block_size: 0}\n", "runner.block_size", "must be >= 1, got 0"),
        (
            "name: x\nrunner: {max_model_len: 1}\n",
            "runner.max_model_len",
            "must be 'auto' or an integer >= 2, got 1",
        ),
        ("name: x\nrunner: {kernels: cuda}\n", "runner.kernels", "triton"),
        ("name: x\nrunner: {num_kv_blocks: 0}\n", "runner.num_kv_blocks", "auto"),
        (
            "name: x\nrunner: {gpu_memory_utilization: 1.5}\n",
            "runner.gpu_memory_utilization",
            "<= 1",
        ),
        (
            "name: x\nrunner: {max_num_batched_tokens: 64, cudagraph_capture_sizes: [1, 8, 128]}\n",
            "runner.cudagraph_capture_sizes",
            "128 exceeds max_num_batched_tokens 64",
        ),
        (
            "name: x\nrunner: {max_num_seqs: 20, max_num_reqs: 10}\n",
            "runner.max_num_seqs",
            "exceeds",
        ),
        (
            "name: x\nworkload: {prompt_len: {dist: uniform, min: 9, max: 3}}\n",
            "workload.prompt_len.min",
            "greater than max",
        ),
        (
            "name: x\nworkload: {output_len: {dist: fixed, value: 0}}\n",
            "workload.output_len.value",
            ">= 1",
        ),
        (
            "name: x\nworkload: {prompt_len: {dist: zipf}}\n",
            "workload.prompt_len",
            "unknown dist 'zipf'",
        ),
        ("name: x\nworkload: {arrival: {pattern: poisson}}\n", "workload.arrival.rate", "required"),
        ("name: x\nworkload: {trace: nope.jsonl}\n", "workload.trace", "not found"),
        ("name: x\nworkload: {sampling: {top_p: 0}}\n", "workload.sampling.top_p", "> 0"),
        ("name: x\nworkload: {abort_fraction: 2}\n", "workload.abort_fraction", "<= 1"),
        ("seed: 1\n", "name", "required"),
        ("name: ''\n", "name", "at least 1"),
        ("name: x\nmatrix: {runner.nope: [1]}\n", "matrix.runner.nope", "unknown key"),
        ("name: x\nmatrix: {runner.uva: []}\n", "matrix.runner.uva", "at least one"),
    ],
)
def test_bad_input_names_file_and_field(
    tmp_path: Path, body: str, field: str, problem: str
) -> None:
    msg = error_of(tmp_path, body)
    assert f"s.yaml: {field}: " in msg, msg
    assert problem in msg, msg


def test_trace_resolved_against_scenario_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.jsonl").write_text('{"prompt_len": 4, "max_tokens": 2}\n')
    monkeypatch.chdir(tmp_path)
    s = load_scenario(write(tmp_path / "sub", "name: x\nworkload: {trace: t.jsonl}\n"))
    assert s.workload.trace == tmp_path / "sub" / "t.jsonl"


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "name: x\nrunner:\n  block_size: 16\n  uva: [true\n")
    assert "line " in msg and "YAML syntax error" in msg
    msg = error_of(tmp_path, "name: x\nrunner: {a: b: c}\n")
    assert "s.yaml: line 2: " in msg


def test_non_mapping_and_missing_file(tmp_path: Path) -> None:
    assert "must be a mapping" in error_of(tmp_path, "- a\n- b\n")
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(missing)
    assert str(info.value).startswith(f"{missing}: ") and "\n" not in str(info.value)


def test_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    s = load_scenario(
        path,
        [
            "runner.async_scheduling=false",
            "workload.num_requests=3",
            "runner.cudagraph_capture_sizes=[1,2,4]",
            "workload.prompt_len.max=100",
            "workload.shared_prefix.len=32",
        ],
    )
    assert s.runner.async_scheduling is False and s.workload.num_requests == 3
    assert s.runner.cudagraph_capture_sizes == [1, 2, 4]
    assert s.workload.prompt_len.max == 100
    assert s.workload.shared_prefix is not None and s.workload.shared_prefix.len == 32


@pytest.mark.parametrize(
    ("override", "field", "problem"),
    [
        ("runner.bogus=1", "runner.bogus", "unknown key"),
        ("nothing.here=1", "nothing.here", "unknown key"),
        ("runner.block_size", "runner.block_size", "key=value"),
        ("runner.block_size=0", "runner.block_size", ">= 1"),
    ],
)
def test_bad_overrides(tmp_path: Path, override: str, field: str, problem: str) -> None:
    msg = error_of(tmp_path, "name: x\n", (override,))
    assert f"s.yaml: {field}: " in msg and problem in msg, msg


def test_matrix_expansion(tmp_path: Path) -> None:
    runs = expand_matrix(load_scenario(write(tmp_path, FULL)))
    assert [label for label, _ in runs] == [
        "decode-heavy[runner.cudagraph_mode=full,runner.async_scheduling=true]",
        "decode-heavy[runner.cudagraph_mode=full,runner.async_scheduling=false]",
        "decode-heavy[runner.cudagraph_mode=none,runner.async_scheduling=true]",
        "decode-heavy[runner.cudagraph_mode=none,runner.async_scheduling=false]",
    ]
    values = [(s.runner.cudagraph_mode, s.runner.async_scheduling) for _, s in runs]
    assert values == [("full", True), ("full", False), ("none", True), ("none", False)]
    for _, s in runs:
        assert isinstance(s, Scenario) and s.matrix is None
        assert s.workload.num_requests == 512 and s.seed == 7


def test_matrix_invalid_combination(tmp_path: Path) -> None:
    body = (
        "name: x\nrunner: {max_num_reqs: 64, max_num_seqs: 32}\n"
        "matrix:\n  runner.max_num_seqs: [16, 128]\n"
    )
    s = load_scenario(write(tmp_path, body))
    with pytest.raises(ScenarioError) as info:
        expand_matrix(s)
    assert "s.yaml: runner.max_num_seqs: 128 exceeds max_num_reqs 64" in str(info.value)


def test_quickstart() -> None:
    s = load_quickstart()
    assert "kernels: torch" in QUICKSTART_YAML
    r = s.runner
    assert (r.kernels, r.async_scheduling, r.uva, r.cudagraph_mode) == (
        "torch",
        False,
        False,
        "none",
    )
    assert (r.num_kv_blocks, r.max_model_len, r.max_num_batched_tokens) == (512, 1024, 2048)
    w = s.workload
    assert w.num_requests == 16 and w.arrival.pattern == "burst"
    assert w.prompt_len == UniformLen(dist="uniform", min=16, max=96)
    assert w.output_len == FixedLen(dist="fixed", value=32) and w.sampling.temperature == 0
    cfg = s.runner_config()
    assert isinstance(cfg, RunnerConfig)
    assert cfg.num_kv_blocks == 512 and cfg.kernels == "torch" and cfg.cudagraph_mode == "none"
    assert s.model_spec().preset == "llama-tiny"


# ---- the runner section is RunnerConfig's fields, declared once ------------------------------
def test_the_runner_section_has_every_runner_field_with_its_default() -> None:
    """A scenario without ``runner:`` and ``RunnerConfig()`` are the same runner (seed aside)."""
    section = Scenario(name="x").runner
    defaults = RunnerConfig()
    derived = ("seed", "workload_max_reqs", "workload_max_step_tokens")  # set elsewhere
    names = [f.name for f in dataclasses.fields(RunnerConfig) if f.name not in derived]
    assert list(type(section).model_fields) == names
    assert section.to_runner_config(seed=defaults.seed) == defaults
    for name in names:
        want = getattr(defaults, name)
        got = getattr(section, name)
        if name == "spec_decode":  # a section of its own: compared as the config it makes
            got = got.to_config()
        assert got == ("auto" if want is None else want), name


@pytest.mark.parametrize(
    ("runner", "field", "problem"),
    [
        ({"num_kv_blocks": 2, "max_model_len": 1024}, "num_kv_blocks", "cannot hold one request"),
        ({"max_num_reqs": 300, "max_num_seqs": 256}, "max_num_reqs", "too small for async"),
        ({"max_num_batched_tokens": 64, "cudagraph_capture_sizes": [128]},
         "cudagraph_capture_sizes", "size 128 exceeds max_num_batched_tokens 64"),
        ({"cudagraph_capture_sizes": []}, "cudagraph_capture_sizes", "non-empty list"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization", "> 0"),
    ],
)  # fmt: skip
def test_a_runner_rule_is_one_error_from_a_scenario_and_from_runner_config(
    tmp_path: Path, runner: dict, field: str, problem: str
) -> None:
    body = "name: x\nrunner: {" + ", ".join(f"{k}: {v}" for k, v in runner.items()) + "}\n"
    msg = error_of(tmp_path, body)
    assert f": runner.{field}: " in msg and problem in msg
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in runner.items()}
    with pytest.raises(ConfigError) as info:
        RunnerConfig(**kwargs)
    assert info.value.field == field and str(info.value).startswith(f"runner.{field}: ")
    assert problem in str(info.value)
