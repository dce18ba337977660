"""Energy per output token on a GPU: a quickstart run on CUDA with NVML sampled; the figure
``show`` gives equals the energy counter's difference between the first and the last sample
inside the serving window over the tokens between them, computed here from the stored rows."""

from __future__ import annotations

import json

import duckdb
import pytest
import torch
from test_run import QUICKSTART, cli


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_energy_per_token_is_the_counter_difference_over_the_tokens(tmp_path):
    db = str(tmp_path / "gpu.duckdb")
    sets = (
        "runner.device=cuda", "probes.nvml_hz=100", "workload.num_requests=8",
        "workload.output_len.value=800",  # 800 decode steps: a window of many samples
    )  # fmt: skip
    args = (a for s in sets for a in ("--set", s))
    proc = cli("run", str(QUICKSTART), "--headless", "--db", db, *args, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "J per output token" in proc.stdout, proc.stdout

    with duckdb.connect(db, read_only=True) as con:
        ((run_id,),) = con.execute("SELECT run_id FROM runs").fetchall()
        lo, hi = con.execute("SELECT min(arrival_ns), max(finish_ns) FROM requests").fetchone()
        samples = con.execute(
            "SELECT t_ns, energy_mj FROM gpu_samples WHERE energy_mj IS NOT NULL "
            "AND t_ns BETWEEN ? AND ? ORDER BY t_ns",
            [lo, hi],
        ).fetchall()
        assert len(samples) >= 2, "the GPU reports no energy counter, or the run was too short"
        (t0, e0), (t1, e1) = samples[0], samples[-1]
        (tokens,) = con.execute(
            "SELECT count(*) FROM tokens WHERE t_ns > ? AND t_ns <= ?", [t0, t1]
        ).fetchone()
    assert e1 > e0 and tokens > 0

    shown = cli("show", run_id, "--db", db, "--json")
    assert shown.returncode == 0, shown.stderr
    energy = json.loads(shown.stdout)["energy"]
    assert energy["reason"] is None and energy["output_tokens"] == tokens
    assert energy["joules"] == pytest.approx((e1 - e0) / 1e3)
    assert energy["joules_per_output_token"] == pytest.approx((e1 - e0) / 1e3 / tokens)
    assert energy["mean_power_w"] == pytest.approx((e1 - e0) / 1e3 / ((t1 - t0) / 1e9))
    print(json.dumps(energy, indent=1))
