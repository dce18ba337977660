"""First contact through the CLI: the defaults run on a CPU, and the exit codes are those of
docs/commands.md (2: bad input, nothing written; 1: a run that started and failed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )


def stored(db: Path) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT status, scenario_yaml, scenario_given_yaml FROM runs").fetchall()


def test_a_scenario_of_a_name_and_a_preset_runs_with_the_defaults(tmp_path):
    """On a CPU: ``num_kv_blocks: auto`` within the CPU budget, the model's own length."""
    (tmp_path / "s.yaml").write_text("name: minimal\nmodel: {preset: llama-tiny}\n")
    db = tmp_path / "runs.duckdb"
    proc = cli("run", str(tmp_path / "s.yaml"), "--headless", "--db", str(db),
               "--set", "workload.num_requests=2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    ((status, as_run, given),) = stored(db)
    assert status == "completed"
    assert yaml.safe_load(as_run)["runner"]["max_model_len"] == 4096  # llama-tiny's own length
    assert yaml.safe_load(given)["runner"]["max_model_len"] == "auto"  # as given


def test_max_model_len_defaults_to_the_checkpoints_own(tmp_path, make_hf_checkpoint):
    """A checkpoint of max_position_embeddings 512 with 40 blocks of 16 tokens (640 tokens):
    the old fixed default of 4096 could not fit; the model's own length does."""
    ckpt = make_hf_checkpoint(tmp_path, max_position_embeddings=512, name="ckpt")
    (tmp_path / "s.yaml").write_text(
        f"name: hf\nmodel: {{path: {ckpt}}}\nrunner: {{num_kv_blocks: 40, block_size: 16}}\n"
        "workload: {num_requests: 2, output_len: {dist: fixed, value: 4}}\n"
    )
    db = tmp_path / "runs.duckdb"
    proc = cli("run", str(tmp_path / "s.yaml"), "--headless", "--db", str(db))
    assert proc.returncode == 0, proc.stderr[-2000:]
    ((status, as_run, _),) = stored(db)
    assert status == "completed"
    assert yaml.safe_load(as_run)["runner"]["max_model_len"] == 512


def test_an_explicit_max_model_len_beyond_the_checkpoint_is_one_line_exit_2(
    tmp_path, make_hf_checkpoint
):
    """As vLLM refuses a user max_model_len over the derived one."""
    ckpt = make_hf_checkpoint(tmp_path, max_position_embeddings=512, name="ckpt")
    (tmp_path / "s.yaml").write_text(f"name: hf\nmodel: {{path: {ckpt}}}\n")
    db = tmp_path / "runs.duckdb"
    proc = cli("run", str(tmp_path / "s.yaml"), "--headless", "--db", str(db),
               "--set", "runner.max_model_len=1024")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: {tmp_path / 's.yaml'}: runner.max_model_len: 1,024 exceeds the model's "
        "max_position_embeddings 512"
    )
    assert not db.exists()


@NO_CUDA
def test_a_gpu_scenario_on_a_cpu_is_exit_2_with_the_fix_and_no_run_row(tmp_path):
    db = tmp_path / "runs.duckdb"
    proc = cli("run", str(ROOT / "scenarios/decode_heavy.yaml"), "--headless", "--db", str(db))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "runner.device" in lines[0], proc.stderr
    assert "--set runner.device=cpu" in lines[0]
    assert proc.stdout == ""  # no summary of zeros
    assert not db.exists()


def test_strict_without_a_scenario_runs_the_quickstart(tmp_path):
    proc = cli("run", "--strict", "--headless", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ((status, _, given),) = stored(tmp_path / "runs.duckdb")
    assert status == "completed" and yaml.safe_load(given)["runner"]["strict"] is True


def test_a_config_error_found_after_start_up_is_a_failed_run_exit_1(run_in_process, monkeypatch):
    """What only start-up can find (here: the runner refuses its config) fails the run that
    started: its row is kept ``failed`` and the exit code is 1, not bad input's 2."""
    from mrv2_prof.runner import engine
    from mrv2_prof.runner.config import ConfigError

    def refuse(*args, **kwargs):
        raise ConfigError("runner.num_kv_blocks: the profiled cache holds no request")

    monkeypatch.setattr(engine.Engine, "__init__", refuse)
    job, sent = run_in_process()
    (outcome,) = [payload for kind, payload in sent if kind == "done"]
    assert (outcome.status, outcome.exit_code) == ("failed", 1)
    assert outcome.error == "runner.num_kv_blocks: the profiled cache holds no request"
    ((status, _, _),) = stored(Path(job.db_path))
    assert status == "failed"
