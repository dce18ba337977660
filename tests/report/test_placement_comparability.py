"""``compare`` and ``gate`` say when two groups ran on different hosts or GPUs
(``report.comparability``): hand-made groups of repeats (group_runs.py) whose environments name
the host, the GPU and the other processes on it."""

from __future__ import annotations

from group_runs import ENV, add_group, make_groups
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.store import Store

runner = CliRunner()
BASE = [10.0, 10.1, 9.9]
H200 = {**ENV, "cuda": "12.8", "gpu_name": "NVIDIA H200", "gpu_driver": "570.1",
        "gpu_uuid": "GPU-aaaa", "gpu_cotenants": []}  # fmt: skip


def _db(tmp_path, other: dict, host: str | None = None):
    db = make_groups(tmp_path / "p.duckdb", {"base": BASE}, device="cuda:0", environment=H200)
    with Store.open(db) as store:
        run_ids = add_group(store, "other", BASE, device="cuda:0", environment=other)
        if host is not None:  # the group's last repeat ran on another host
            store.connection.execute(
                "UPDATE runs SET writer_host = ? WHERE run_id = ?", [host, run_ids[-1]]
            )
    return db


def _lines(result, prefix: str) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith(prefix)]


def gate(db, *args: str):
    argv = ["gate", "--db", str(db), "--baseline", "group:base", "--candidate", "group:other"]
    return runner.invoke(app, [*argv, *args])


def test_another_host_and_another_card_of_the_same_model_are_said_without_refusing(tmp_path):
    db = _db(tmp_path, {**H200, "gpu_uuid": "GPU-bbbb"}, host="node-b")
    result = gate(db)
    assert result.exit_code == 0, result.output
    said = " | ".join(result.stdout.splitlines())
    assert "host: writer_host differs (" in said and "'node-b', run other-2)" in said
    assert "GPU: gpu_uuid differs ('GPU-aaaa' vs 'GPU-bbbb', run other-0)" in said
    result = runner.invoke(app, ["compare", "group:base", "group:other", "--db", str(db)])
    assert result.exit_code == 0, result.output
    differs = " | ".join(_lines(result, "differs: "))
    assert "host: writer_host differs" in differs and "GPU: gpu_uuid differs" in differs


def test_another_gpu_model_refuses_the_gate_and_compare_says_it(tmp_path):
    db = _db(tmp_path, {**H200, "gpu_name": "NVIDIA H100", "gpu_uuid": "GPU-cccc"})
    result = gate(db)
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "GPU: gpu_name differs ('NVIDIA H200' vs 'NVIDIA H100', run other-0)" in line
    result = runner.invoke(app, ["compare", "group:base", "group:other", "--db", str(db)])
    assert any("gpu_name differs" in x for x in _lines(result, "differs: "))
    assert any("gpu_name differs" in x for x in _lines(result, "warning: "))


def test_other_processes_on_the_gpu_are_said_and_a_run_from_before_makes_no_claim(tmp_path):
    shared = [{"pid": 7, "used_mib": 900, "name": "python3"}]
    result = gate(_db(tmp_path, {**H200, "gpu_cotenants": shared}))
    assert result.exit_code == 0, result.output
    assert "GPU: co-tenants differs ('none' vs '1 other process', run other-0)" in result.stdout
    before = {k: v for k, v in H200.items() if k not in ("gpu_uuid", "gpu_cotenants")}
    (tmp_path / "b").mkdir()
    result = gate(_db(tmp_path / "b", before))
    assert result.exit_code == 0, result.output
    assert "gpu_uuid" not in result.stdout and "co-tenants" not in result.stdout
