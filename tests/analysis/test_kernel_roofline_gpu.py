"""The per-op kernel table of a real kernel-trace window: llama-tiny on CUDA with the Triton
kernels and FULL graphs, every forward kernel put with its op and layer, and the per-op bytes
the hand count of tests/runner/test_op_cost.py."""

from __future__ import annotations

import json

import duckdb
import pytest
import torch

from mrv2_prof.analysis.kernel_ops import LAYER_GEMMS, OTHER, UNATTRIBUTED, attribute_step
from mrv2_prof.analysis.kernel_roofline import kernel_roofline
from mrv2_prof.store import Store
from tests.runner.test_op_cost import LLAMA_TINY_OPS

WINDOW = "[12,3]"  # decode steps of the 16 requests (the prompts are one step)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_kernel_trace_window_is_attributed_op_by_op(run_in_process):
    job, _ = run_in_process(
        "runner.device=cuda", "runner.kernels=triton", "runner.cudagraph_mode=full",
        "model.dtype=bfloat16", "probes.cuda_events=true", "probes.kernel_trace=true",
        f"probes.kernel_trace_steps={WINDOW}",
    )  # fmt: skip
    con = duckdb.connect(job.db_path, read_only=True)
    (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
    rows = con.execute(
        "SELECT step, name FROM kernels WHERE step >= 0 ORDER BY step, start_ns"
    ).fetchall()
    steps = sorted({s for s, _ in rows})
    assert steps, con.execute("SELECT info FROM runs").fetchone()
    model_ops = {(g, layer) for g in LAYER_GEMMS for layer in (0, 1)}
    model_ops |= {("attention", 0), ("attention", 1), ("lm_head", None), ("norm", None)}
    for step in steps:
        names = [n for s, n in rows if s == step]
        ops, why = attribute_step(names, layers=2)
        assert why is None, (step, why, names)
        got = {(k.op, k.layer) for k in ops if k.op != OTHER}
        assert model_ops <= got, (step, sorted(got, key=str), names)
        assert all(k.op != UNATTRIBUTED for k in ops)
    extent = con.execute(
        "SELECT avg(num_reqs + coalesce(num_draft_tokens, 0)), avg(context_tokens) FROM steps "
        f"WHERE step IN ({', '.join(map(str, steps))})"
    ).fetchone()
    con.close()
    with Store.open(job.db_path) as store:
        table = kernel_roofline(store, run_id)
        info = json.loads(store.connection.execute("SELECT info FROM runs").fetchone()[0])
    assert info["step_cost"]["ops"] == LLAMA_TINY_OPS  # bf16 weights and cache
    assert table.why is None and not any("unattributed" in n for n in table.notes), table.notes
    by_op = {r.op: r for r in table.rows}
    ops = LLAMA_TINY_OPS
    for g in LAYER_GEMMS:  # two layers, one launch each, the weights once
        assert by_op[g].bytes == pytest.approx(2 * ops[g]["weight_bytes"])
    rows_per_step, context = extent
    lm = ops["lm_head"]
    assert by_op["lm_head"].bytes == pytest.approx(
        lm["weight_bytes"] + lm["bytes_per_row"] * rows_per_step
    )
    assert by_op["attention"].bytes == pytest.approx(2 * 128 * context)
    assert by_op["attention"].bytes_per_s > 0 and by_op["qkv"].fraction is not None
