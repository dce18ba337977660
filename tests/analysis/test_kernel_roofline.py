"""The per-op kernel table (analysis/kernel_ops.py, analysis/kernel_roofline.py) and its report
section against a hand-made ``kernels`` table of llama-tiny (2 layers) with known durations."""

from __future__ import annotations

from types import SimpleNamespace

import plotly.graph_objects as go
import pytest

from mrv2_prof.analysis import kernel_roofline as kernel_roofline_module
from mrv2_prof.analysis.findings import RULES, Finding
from mrv2_prof.analysis.kernel_ops import attribute_step
from mrv2_prof.analysis.kernel_roofline import (
    NO_KERNELS,
    OpRow,
    kernel_roofline,
    kernels_far_from_roof,
    op_line,
    to_close,
)
from mrv2_prof.report.figure_meta import NotMeasured
from mrv2_prof.report.html_report import render_run_report
from mrv2_prof.report.kernel_table import kernel_table
from mrv2_prof.store import Store
from tests.runner.test_op_cost import LLAMA_TINY_OPS

PEAKS = {"hbm_read_bytes_per_s": 1e12, "tensor_flops_per_s": 1e14, "hbm_source": "given"}
COST = {"layers": 2, "ops": LLAMA_TINY_OPS}
GEMM = "nvjet_hsh_64x8_64x16_2x1_v_bz_splitK_TNT"  # a cuBLAS GEMM (split-K: a reduction follows)
LAYER = [  # (name, ns): one decoder layer at batch 1, the Triton bundle, plain GEMV
    ("_rmsnorm_kernel", 1_000), ("_gemv_kernel", 2_000), ("_qk_norm_rope_kernel", 1_000),
    ("_paged_decode_kernel", 3_000), ("_gemv_kernel", 1_000), ("_rmsnorm_kernel", 1_000),
    (GEMM, 4_000), ("void splitKreduce_kernel<32, 16>", 500), ("_silu_and_mul_kernel", 1_000),
    ("_gemv_kernel", 2_000),
]  # fmt: skip
STEP = [
    ("_prepare_inputs_kernel", 2_000), ("void at::native::indexSelectSmallIndex", 1_000),
    *LAYER, *LAYER, ("_rmsnorm_kernel", 1_000), ("nvjet_hsh_256x128_lm_head", 8_000),
    ("_gumbel_argmax_kernel", 1_000), ("_advance_kernel", 1_000),
]  # fmt: skip
# per step: layers 2 x 16,500 ns, final norm 1,000, LM head 8,000, other 5,000: 47,000 ns


def _store(tmp_path, steps: dict[int, list[tuple[str, int]]], cost=COST) -> Store:
    store = Store.open(tmp_path / "r.duckdb")
    store.begin_run(
        "r", scenario_name="s", label="s", matrix_combo=None, scenario_yaml="name: s\n",
        device="cuda:0", versions={}, started_ns=0,
        info={"step_cost": cost, "machine_peaks": PEAKS},
    )  # fmt: skip
    # every step decodes 1 token of 1 request over 10 tokens of context (10 query-key pairs)
    cols = {"step": list(steps), "num_reqs": [1] * len(steps), "num_tokens": [1] * len(steps),
            "num_prefill_tokens": [0] * len(steps), "num_draft_tokens": [0] * len(steps),
            "context_tokens": [10] * len(steps), "attn_pairs": [10] * len(steps),
            "perturbed": [True] * len(steps)}  # fmt: skip
    store.append("r", "steps", cols)
    rows = {"step": [], "phase": [], "name": [], "start_ns": [], "end_ns": [], "stream": []}
    t = 0
    for step, kernels in steps.items():
        for name, ns, *early in kernels:  # early: it starts that long before its slot
            start = t - sum(early)
            for col, v in zip(rows, (step, "forward", name, start, start + ns, 7), strict=True):
                rows[col].append(v)
            t = start + ns + 100
    store.append("r", "kernels", rows)
    return store


def test_each_kernel_is_put_with_its_op_and_layer():
    ops, why = attribute_step([n for n, _ in STEP], layers=2)
    assert why is None
    got = [(k.op, k.layer, k.joins) for k in ops]
    layer = [("norm", 0, False), ("qkv", 0, False), ("qk_rope", 0, False),
             ("attention", 0, False), ("o", 0, False), ("add_norm", 0, False),
             ("gate_up", 0, False), ("gate_up", 0, True), ("silu_mul", 0, False),
             ("down", 0, False)]  # fmt: skip
    assert got[:2] == [("other", None, False)] * 2
    assert got[2:12] == layer
    assert got[12:22] == [(op, 1, j) for op, _, j in layer]
    assert got[22:] == [("norm", None, False), ("lm_head", None, False),
                        ("other", None, False), ("other", None, False)]  # fmt: skip


def test_the_folded_attention_and_the_decode_gemm_are_put_with_their_ops():
    """A decode layer with RoPE folded into attention (no RoPE kernel) and the decode GEMM with
    its split-K reduction: the fold counts as attention, the reduction joins its GEMM's slot."""
    layer = [("_rmsnorm_kernel", 1), ("_gemm_decode_kernel", 1), ("_paged_decode_rope_kernel", 1),
             ("_gemm_decode_kernel", 1), ("_gemm_decode_splitk_reduce_kernel", 1),
             ("_rmsnorm_kernel", 1), ("_gemm_decode_kernel", 1), ("_silu_and_mul_kernel", 1),
             ("_gemm_decode_kernel", 1)]  # fmt: skip
    names = [n for n, _ in layer * 2] + ["_rmsnorm_kernel", "nvjet_lm_head"]
    ops, why = attribute_step(names, layers=2)
    assert why is None
    got = [(k.op, k.layer, k.joins) for k in ops[:9]]
    assert got == [("norm", 0, False), ("qkv", 0, False), ("attention", 0, False),
                   ("o", 0, False), ("o", 0, True), ("add_norm", 0, False),
                   ("gate_up", 0, False), ("silu_mul", 0, False), ("down", 0, False)]  # fmt: skip
    assert [(k.op, k.layer) for k in ops[-2:]] == [("norm", None), ("lm_head", None)]


def test_the_gemm_switches_kernels_are_put_with_their_ops():
    """A decode layer with ``O_ADD_NORM`` (the o GEMM's partials, then one kernel that sums
    them, adds and normalises) and ``DOWN_SILU_MUL`` (no SiLU-and-mul launch): that kernel is the
    layer's add + norm, and the four GEMMs keep their slots."""
    layer = ["_rmsnorm_kernel", "_gemm_decode_kernel", "_paged_decode_rope_kernel",
             "_gemm_decode_kernel", "_splits_add_rmsnorm_kernel", "nvjet_gate_up",
             "_gemm_decode_kernel", "_gemm_decode_splitk_reduce_kernel"]  # fmt: skip
    ops, why = attribute_step(layer * 2 + ["_rmsnorm_kernel", "nvjet_lm_head"], layers=2)
    assert why is None
    assert [(k.op, k.layer, k.joins) for k in ops[8:16]] == [
        ("norm", 1, False), ("qkv", 1, False), ("attention", 1, False), ("o", 1, False),
        ("add_norm", 1, False), ("gate_up", 1, False), ("down", 1, False), ("down", 1, True),
    ]  # fmt: skip


def test_the_fused_mlp_takes_the_gate_up_and_down_slots_as_one_op(tmp_path):
    """A batch-1 layer with the MLP in one launch (o GEMV into the residual, then the MLP
    kernel): the kernel is the op ``mlp`` of its layer, counted as two GEMM slots, and its bytes
    are both weights' and the norm's (hand count: 32,768 + 16,384 + 128 B at one token)."""
    layer = [("_gemv_kernel", 2_000), ("_paged_decode_rope_kernel", 3_000),
             ("_gemv_kernel", 1_000), ("_mlp_decode_kernel", 5_000)]  # fmt: skip
    step = [*layer, *layer, ("_rmsnorm_kernel", 1_000), ("nvjet_lm_head", 8_000)]
    ops, why = attribute_step([n for n, _ in step], layers=2)
    assert why is None
    assert [(k.op, k.layer) for k in ops] == [
        ("qkv", 0), ("attention", 0), ("o", 0), ("mlp", 0),
        ("qkv", 1), ("attention", 1), ("o", 1), ("mlp", 1), ("norm", None), ("lm_head", None),
    ]  # fmt: skip
    with _store(tmp_path, {5: step}) as store:
        rows = {r.op: r for r in kernel_roofline(store, "r").rows}
    m = rows["mlp"]
    assert (m.launches, m.us, m.bytes) == (2, 10.0, 2 * (32_768 + 16_384 + 128))
    # an MLP kernel where gate_up is not the next slot breaks the pattern
    ops, why = attribute_step(["_mlp_decode_kernel", *[n for n, _ in step]], layers=2)
    assert why is not None and all(k.op == "unattributed" for k in ops)


def test_the_per_op_table_of_two_steps_is_the_hand_count(tmp_path):
    with _store(tmp_path, {5: STEP, 6: STEP}) as store:
        table = kernel_roofline(store, "r")
    assert table.why is None and table.steps == 2 and table.tokens_per_step == 1
    rows = {r.op: r for r in table.rows}
    assert [r.op for r in table.rows[:3]] == ["gate_up", "lm_head", "attention"]
    g = rows["gate_up"]  # 2 launches of 4.5 us (GEMM + split-K reduction), 32,768 B each
    assert (g.launches, g.us, g.bytes, g.flops) == (2, 9.0, 65_536, 65_536)
    assert g.share == pytest.approx(9_000 / 47_000)
    assert g.bytes_per_s == pytest.approx(65_536 / 9e-6)
    assert g.fraction == pytest.approx(65_536 / 1e12 / 9e-6) and g.bound == "HBM"
    q = rows["qkv"]  # 2 GEMVs of 2 us, 16,384 B and 16,384 FLOPs each at one token
    assert (q.launches, q.us, q.bytes, q.flops) == (2, 4.0, 32_768, 32_768)
    a = rows["attention"]  # 128 B and 256 FLOPs per context token and pair, 2 layers
    assert (a.us, a.bytes, a.flops) == (6.0, 2 * 1_280, 2 * 2_560)
    lm = rows["lm_head"]  # the table, one logits row written
    assert (lm.launches, lm.us, lm.bytes, lm.flops) == (1, 8.0, 65_536 + 1_024, 65_536)
    n = rows["norm"]  # 2 input norms and the final one: 128 B of weight, a row in and out
    assert (n.launches, n.bytes) == (3, 3 * (128 + 256))
    assert (rows["add_norm"].launches, rows["add_norm"].bytes) == (2, 2 * (128 + 512))
    o = rows["other"]
    assert (o.launches, o.us, o.bytes_per_s, o.fraction) == (4, 5.0, None, None)
    assert table.notes == []


def test_kernels_starting_under_their_predecessor_count_their_own_time(tmp_path):
    """Under programmatic dependent launch the o projection's GEMV starts while attention runs
    and waits for it: recorded 3,900 ns from its start, 2,900 of them under attention. Each op
    counts its own time (from the later of its start and the end before it), so the table is the
    sequential step's hand count, and a note gives the overlap: 2 x 2,900 ns per step."""
    layer = list(LAYER)
    assert layer[4] == ("_gemv_kernel", 1_000)  # o, after attention's 3,000 ns
    layer[4] = ("_gemv_kernel", 3_900, 3_000)  # starts 2,900 ns before attention ends
    step = [*STEP[:2], *layer, *layer, *STEP[22:]]
    assert kernel_roofline_module.own_ns([(0, 10), (5, 20), (8, 12), (25, 30)]) == [10, 10, 0, 5]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    with _store(tmp_path / "a", {5: step}) as store:
        table = kernel_roofline(store, "r")
    with _store(tmp_path / "b", {5: STEP}) as store:
        sequential = kernel_roofline(store, "r")
    got = {r.op: (r.us, r.share, r.fraction) for r in table.rows}
    assert got == {r.op: (r.us, r.share, r.fraction) for r in sequential.rows}
    assert got["o"][0] == 2.0 and got["attention"][0] == 6.0
    assert table.notes == [
        "kernels overlapped the ones before them by 5.8 µs per step (programmatic dependent "
        "launch, or streams): each op counts its kernels' own time"
    ]


def test_a_step_off_the_pattern_is_unattributed_with_the_reason(tmp_path):
    extra = [*STEP[:5], ("sm90_xmma_gemm_draft", 1_000), *STEP[5:]]
    with _store(tmp_path, {5: STEP, 6: extra}) as store:
        table = kernel_roofline(store, "r")
    rows = {r.op: r for r in table.rows}
    assert rows["unattributed"].launches == (len(STEP) - 4 + 1) / 2  # all but the 4 others
    assert rows["qkv"].launches == 1  # step 5 only, over 2 steps
    assert table.notes == [
        "1 of 2 steps unattributed: 10 GEMM launches, expected 9 (4 per layer x 2 layers + "
        "the LM head)"
    ]


def test_the_finding_names_the_top_ops_far_from_their_roof(tmp_path):
    with _store(tmp_path, {5: STEP}) as store:
        table = kernel_roofline(store, "r")
    found = kernels_far_from_roof(Finding, None, SimpleNamespace(kernel_roofline=table))
    assert found.rule == "kernels_far_from_roof" and found.severity == 1
    assert found.text.startswith("kernels far from their roof (1 tokens per step): gate_up at ")
    assert "; lm_head at 0.01 TB/s, 1 % of the HBM roof: 8.0 µs per step (17 % of" in found.text
    # gate_up: 9 µs over 2 launches, 65,536 B at 1 TB/s = 0.066 µs of work, 0.033 µs a launch
    assert (
        "launches per step); 4.5 µs a launch for 0.03 µs of work at the roof: launch-bound, "
        "so fewer, larger launches would close it" in found.text
    )
    assert found.weight == pytest.approx(17_000 / 47_000)
    assert any(getattr(rule, "func", None) is kernels_far_from_roof for rule in RULES)
    assert kernels_far_from_roof(Finding, None, SimpleNamespace()) is None


def test_the_report_section_renders_or_says_why(tmp_path):
    with _store(tmp_path, {5: STEP}) as store:
        fig = kernel_table(kernel_roofline(store, "r"))
    assert isinstance(fig, go.Figure) and fig.layout.meta["id"] == "kernel_ops"
    assert fig.layout.meta["ops"][:2] == ["gate_up", "lm_head"]
    assert fig.data[0].cells.values[0][0] == "gate_up"
    assert any(n.startswith("far from the roof: gate_up") for n in fig.layout.meta["notes"])
    (tmp_path / "none").mkdir()
    with _store(tmp_path / "none", {}) as store:
        missing = kernel_table(kernel_roofline(store, "r"))
    assert isinstance(missing, NotMeasured) and missing.why == NO_KERNELS


def test_the_run_report_has_the_section_and_opens_with_the_finding(tmp_path):
    with _store(tmp_path, {5: STEP, 6: STEP}) as store:
        page = render_run_report(store, "r")
    assert 'id="sec-kernel_ops"' in page and 'data-fig-id="kernel_ops"' in page
    assert 'data-rule="kernels_far_from_roof"' in page


def test_a_run_stored_before_the_op_cost_says_so(tmp_path):
    with _store(tmp_path, {5: STEP}, cost={"weight_bytes": 1}) as store:
        table = kernel_roofline(store, "r")
    assert table.why == "the run recorded no per-op cost (stored before it was)"


def _op(launches: float, us: float, fraction: float | None) -> OpRow:
    return OpRow(op="x", launches=launches, us=us, share=0.5, bytes=1.0, flops=0.0,
                 bytes_per_s=1.0, flops_per_s=0.0, fraction=fraction, bound="HBM")  # fmt: skip


def test_what_would_close_an_op_follows_its_work_a_launch_at_the_roof():
    """Hand-worked: time a launch = µs per step / launches; its work at the roof = that x the
    fraction of the roof; under LAUNCH_BOUND_US (2 µs) the launches bind."""
    assert kernel_roofline_module.LAUNCH_BOUND_US == 2.0
    # decode attention at batch 1: 16 launches, 107 µs, 2 % of the roof: 6.7 µs for 0.13 µs
    attention = to_close(_op(16, 107.0, 0.02))
    assert attention.startswith("6.7 µs a launch for 0.13 µs of work at the roof: launch-bound")
    # a down projection: 28 launches, 148 µs at 40 %: 5.3 µs a launch for 2.1 µs of work
    down = to_close(_op(28, 148.0, 0.40))
    assert down.startswith("5.3 µs a launch for 2.1 µs of work at the roof: enough work a launch")
    assert "its tiles" in down and "launch-bound" not in down
    assert "enough work" in to_close(_op(1, 4.0, 0.5))  # exactly 2 µs of work: not launch-bound
    assert "launch-bound" in to_close(_op(1, 4.0, 0.49))
    assert to_close(_op(2, 5.0, None)) is None  # no cost, no roof: nothing said
    assert op_line(_op(2, 5.0, None)).endswith("(50 % of kernel time, 2 launches per step)")
