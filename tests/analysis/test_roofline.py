"""The per-step roofline (analysis/roofline.py) against figures worked by hand."""

from __future__ import annotations

import pytest

from mrv2_prof.analysis.roofline import run_roofline
from mrv2_prof.store import Store

COST = {
    "weight_bytes": 1_000_000,
    "embed_row_bytes": 100,
    "kv_bytes_per_token": 1_000,
    "logits_bytes_per_row": 2_000,
    "matmul_flops_per_token": 1_000_000,
    "lm_head_flops_per_row": 50_000,
    "attn_flops_per_pair": 1_000,
}
PEAKS = {"hbm_read_bytes_per_s": 1e12, "tensor_flops_per_s": 1e14, "hbm_source": "given"}


def _run(tmp_path, steps: list[tuple], info: dict | None = None) -> Store:
    store = Store.open(tmp_path / "r.duckdb")
    info = {"step_cost": COST, "machine_peaks": PEAKS} if info is None else info
    store.begin_run(
        "r", scenario_name="s", label="s", matrix_combo=None, scenario_yaml="name: s\n",
        device="cuda:0", versions={}, started_ns=0, info=info,
    )  # fmt: skip
    cols = ("step", "num_reqs", "num_tokens", "num_prefill_tokens", "num_draft_tokens",
            "context_tokens", "attn_pairs", "gpu_start_ns", "gpu_end_ns", "perturbed")  # fmt: skip
    store.append("r", "steps", {c: [s[i] for s in steps] for i, c in enumerate(cols)})
    return store


def test_a_decode_step_against_the_memory_roof(tmp_path):
    # 2 requests decoding, 500 tokens of context in all, 2 logits rows:
    # bytes = 1e6 + 100*2 + 1000*500 + 2000*2 = 1,504,200; FLOPs = 1e6*2 + 5e4*2 + 1000*500
    # = 2.6e6. GPU time 3 us: memory time 1.5042 us, compute 0.026 us -> 50.14 % of the roof.
    with _run(tmp_path, [(0, 2, 2, 0, 0, 500, 500, 1_000, 4_000, False)]) as store:
        roof = run_roofline(store, "r")
    s = roof.per_step
    assert s.bytes[0] == 1_504_200 and s.flops[0] == 2_600_000
    assert s.fraction[0] == pytest.approx(1.5042e-6 / 3e-6)
    assert s.bytes_per_s[0] == pytest.approx(1_504_200 / 3e-6)
    assert not s.compute_bound[0]
    (d,) = roof.summaries
    assert d.kind == "decode" and d.steps == 1 and roof.note is None


def test_a_prefill_step_is_compute_bound_and_summarised_apart(tmp_path):
    # 1 request, 1,000 prompt tokens, no cache: pairs = 1000*1001/2 = 500,500, context 1,000.
    # FLOPs = 1e6*1000 + 5e4 + 1000*500500 = 1.50055e9 -> 15.0055 us at 1e14;
    # bytes = 1e6 + 100*1000 + 1000*1000 + 2000 = 2.102e6 -> 2.102 us. GPU time 30 us.
    steps = [
        (0, 1, 1000, 1000, 0, 1000, 500_500, 0, 30_000, False),
        (1, 1, 1, 0, 0, 1001, 1001, 30_000, 33_000, False),
        (2, 1, 1, 0, 0, 1002, 1002, 33_000, 33_500, True),  # perturbed: left out
        (3, 1, 1, 0, 0, -1, -1, 33_500, 36_000, False),  # no extent recorded: left out
    ]
    with _run(tmp_path, steps) as store:
        roof = run_roofline(store, "r")
    assert list(roof.per_step.step) == [0, 1]
    assert roof.per_step.compute_bound.tolist() == [True, False]
    assert roof.per_step.fraction[0] == pytest.approx(15.0055e-6 / 30e-6)
    assert [x.kind for x in roof.summaries] == ["decode", "prefill"]


def test_without_a_tensor_peak_only_the_memory_roof_is_used_and_said(tmp_path):
    peaks = {**PEAKS, "tensor_flops_per_s": None, "tensor_source": "X is not in the table"}
    info = {"step_cost": COST, "machine_peaks": peaks}
    with _run(tmp_path, [(0, 1, 1000, 1000, 0, 1000, 500_500, 0, 30_000, False)], info) as st:
        roof = run_roofline(st, "r")
    assert roof.per_step.fraction[0] == pytest.approx(2.102e-6 / 30e-6)
    assert roof.note == "memory roof only (X is not in the table)"


def test_a_cpu_run_says_why_it_has_no_roofline(tmp_path):
    info = {"step_cost": COST, "machine_peaks": {"note": "the CPU has no device timeline"}}
    with _run(tmp_path, [(0, 1, 1, 0, 0, 5, 5, None, None, False)], info) as store:
        roof = run_roofline(store, "r")
    assert roof.per_step is None and roof.note == "no roofline: the CPU has no device timeline"


def test_the_cache_holds_the_latest_measured_bandwidth_per_gpu(tmp_path):
    from mrv2_prof.analysis.roofline import measured_peaks

    store = Store.open(tmp_path / "c.duckdb")
    for i, (uuid, bw, source) in enumerate(
        [("GPU-a", 4.0e12, "measured: ..."), ("GPU-a", 4.1e12, "measured: ..."),
         ("GPU-a", 9.9e12, "given: probes.hbm_gbps = 9900"), ("GPU-b", 2.0e12, "cached: r0")]
    ):  # fmt: skip
        peaks = {"gpu_uuid": uuid, "hbm_read_bytes_per_s": bw, "hbm_source": source}
        store.begin_run(
            f"r{i}", scenario_name="s", label="s", matrix_combo=None, scenario_yaml="",
            device="cuda:0", versions={}, started_ns=i, info={"machine_peaks": peaks},
        )  # fmt: skip
    with store:
        assert measured_peaks(store) == {"GPU-a": [4.1e12, "r1"]}
