"""The HTML report: self-contained, one plotly.js, and figures that carry the run's data.

Figures are read back from the page (the JSON of each ``mrv2-figure`` script element, typed
arrays decoded) and compared with values worked out by hand in the comments, or recomputed in
Python from the rows of a real quickstart run.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from plotly.offline import get_plotlyjs

from mrv2_prof.report.html_report import render_run_report
from mrv2_prof.store import Store
from tests.analysis.test_roofline import COST as ROOFLINE_COST
from tests.analysis.test_roofline import PEAKS as ROOFLINE_PEAKS

MS = 1_000_000
T0 = 5_000_000_000_000  # perf_counter_ns of step 0's start
RUN_FIGURES = ("timeline", "scheduler", "overlap", "bubbles", "sync_sites", "graph_modes",
               "graph_capture", "staged_writes", "latency_cdf", "nvml", "host_flame",
               "spec_decode", "spec_steps", "roofline")  # fmt: skip
MR = "mrv2_prof/runner/worker/model_runner.py:123"
SAMPLER = "mrv2_prof/runner/worker/sampler.py:45"
INPUT = "mrv2_prof/runner/worker/input_batch.py:77"

# ---- reading a report back ----------------------------------------------------------------

_FIGURE = re.compile(
    r'<script type="application/json" class="mrv2-figure" data-fig-id="([^"]+)">(.*?)</script>',
    re.S,
)


def _decode(node):
    """Plotly's JSON with typed arrays ({"dtype", "bdata", "shape"}) turned into numpy."""
    if isinstance(node, dict):
        if "bdata" in node and "dtype" in node:
            arr = np.frombuffer(base64.b64decode(node["bdata"]), dtype=np.dtype(node["dtype"]))
            if "shape" in node:
                arr = arr.reshape([int(n) for n in str(node["shape"]).split(",")])
            return arr
        return {k: _decode(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_decode(v) for v in node]
    return node


def figures_of(page: str) -> dict[str, dict]:
    return {fid: _decode(json.loads(text)) for fid, text in _FIGURE.findall(page)}


def trace(fig: dict, name: str) -> dict:
    (found,) = [t for t in fig["data"] if t.get("name") == name]
    return found


def not_measured(page: str) -> dict[str, str]:
    return dict(re.findall(r'class="not-measured" data-fig-id="([^"]+)">([^<]*)<', page))


def segments_of(tr: dict) -> list[tuple[float, float]]:
    """(start, end) of each NaN-separated segment of a timeline trace."""
    x = np.asarray(tr["x"], dtype=float)
    return [(float(a), float(b)) for a, b in zip(x[0::3], x[1::3], strict=True)]


def assert_self_contained(page: str) -> None:
    assert not re.search(r"<script\b[^>]*\bsrc\s*=", page, re.I)  # no script fetched from anywhere
    assert not re.search(r"<link\b[^>]*\bhref\s*=\s*[\"']?(https?:)?//", page, re.I)
    assert not re.search(r"<(img|iframe)\b[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", page, re.I)
    # plotly.js inlined exactly once, gzip-compressed: unpacked, it is plotly's own file
    blobs = re.findall(
        r'<script type="application/octet-stream" id="mrv2-plotly-gz">([^<]*)</script>', page
    )
    assert len(blobs) == 1
    assert gzip.decompress(base64.b64decode(blobs[0])).decode() == get_plotlyjs()
    assert "DecompressionStream('gzip')" in page


# ---- a synthetic GPU run, worked by hand -------------------------------------------------------
#  step  cpu ms   gpu ms   tokens  mode       host prep  hidden  overlap  bubble        kind
#   0    0-10     2-12     100     piecewise  2          0       0        NULL          NULL
#   1    10-18    12-20    4       full       2          1       0.5      0 (12-12)     other
#   2    18-30    25-33    4       full       4          1       0.25     5 (25-20)     host_bound
#   3    30-40    35-41    2       full       1          1       1.0      2 (35-33)     other
# run overlap = (0+1+1+1) / (2+2+4+1) = 1/3; bubbles: host_bound 5 ms, other 0+2 = 2 ms.
CPU_MS = [(0, 10), (10, 18), (18, 30), (30, 40)]
GPU_MS = [(2, 12), (12, 20), (25, 33), (35, 41)]
# CPU phases at offsets (ms) from the step's start; 'step' and 'execute' are containers.
CPU_PHASES = {"schedule": (0, 1), "execute": (1, 6), "prepare": (1, 2), "forward": (2, 5),
              "sample": (5, 6), "output_wait": (6, 7), "update": (7, 8)}  # fmt: skip
GPU_PHASES = {"prepare": (0, 1), "forward": (1, 5), "sample": (5, 6)}
# Captures: full:8 was never replayed (no dispatch chose full with 8 tokens): 0.75 s, 3 MiB.
CAPTURES = {
    "key": ["full:2", "full:4", "full:8", "piecewise:104"],
    "mode": ["full", "full", "full", "piecewise"],
    "num_tokens": [2, 4, 8, 104],
    "capture_s": [0.5, 0.25, 0.75, 1.0],
    "mem_bytes": [1 * 2**20, 2 * 2**20, 3 * 2**20, 4 * 2**20],
    "step": [-1, -1, -1, 2],  # piecewise:104 captured on first use, by step 2
}
# Speculative decoding per step: k 3, 3, 2, 0 queued with 6, 3, 2, 0 draft slots; the verifies
# read in steps 1-3 (below) give back 0 + 2, 3 and 0 slots -> 5 of 11 reclaimed; one request
# sat out in steps 1 and 2; dynamic k decided in steps 1-3: expected tokens / cost ratio
# 2.5 / 1.25 = 2.0, 1.2 / 1.5 = 0.8, 1.5 / 2.0 = 0.75 (k 0 chosen in step 3).
SPEC_STEPS = {
    "spec_k": [3, 3, 2, 0], "spec_reserved": [6, 3, 2, 0], "spec_reclaimed": [0, 2, 3, 0],
    "spec_sat_out": [0, 1, 1, 0], "spec_expected_tokens": [None, 2.5, 1.2, 1.5],
    "spec_cost_ratio": [None, 1.25, 1.5, 2.0],
}  # fmt: skip
# Requests (ms after T0); r2 is aborted, so it is left out of every latency.
#   req arrival first finish out reason  token times
#   r0    0      10    40    4  stop     10 20 30 40
#   r1    5      25    85    3  length   25 45 85
#   r2   20      50    60    2  abort    50 60
#   r4   40      45    45    1  stop     45
# TTFT 10, 20, 5 -> sorted 5, 10, 20        CDF from (5, 1/3) to (20, 1)
# TPOT r0 30/3 = 10, r1 60/2 = 30           CDF from (10, 1/2) to (30, 1)
# ITL  r0 10 10 10, r1 20 40                CDF from (10, 1/5) to (40, 1)
# E2E  40, 80, 5                            CDF from (5, 1/3) to (80, 1)
TOKEN_MS = {"r0": [10, 20, 30, 40], "r1": [25, 45, 85], "r2": [50, 60], "r4": [45]}


def _begin(store: Store, run_id: str, *, name="gpu-demo", combo=None, started_ns=T0 - 1000 * MS):
    store.begin_run(
        run_id, scenario_name=name, label=name, matrix_combo=combo,
        scenario_yaml=f"name: {name}\nprobes: {{cuda_events: true, nvml_hz: 20}}\n",
        device="cuda:0", versions={}, started_ns=started_ns,
        info={"dtype": "bfloat16", "num_graphs": 4, "capture_s": 2.5, "graph_keys_replayed": 3,
              "unused_capture_s": 0.75, "unused_graph_bytes": 3 * 2**20,
              "notes": ["synthetic run for the report tests"],
              "step_cost": ROOFLINE_COST, "machine_peaks": ROOFLINE_PEAKS},
    )  # fmt: skip


def fill_gpu_run(store: Store, run_id: str) -> None:
    a = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    store.append(run_id, "steps", {
        "step": a(range(4)),
        "cpu_start_ns": a([T0 + s * MS for s, _ in CPU_MS]),
        "cpu_end_ns": a([T0 + e * MS for _, e in CPU_MS]),
        "gpu_start_ns": a([T0 + s * MS for s, _ in GPU_MS]),
        "gpu_end_ns": a([T0 + e * MS for _, e in GPU_MS]),
        "num_tokens": [100, 4, 4, 2], "num_reqs": [2, 3, 2, 1],
        "num_prefill_tokens": [100, 0, 0, 0], "context_tokens": [100, 40, 44, 30],
        "attn_pairs": [5050, 40, 44, 30],
        "graph_mode": ["piecewise", "full", "full", "full"],
        "overlap_frac": [0.0, 0.5, 0.25, 1.0],
        "host_prep_ns": a([2 * MS, 2 * MS, 4 * MS, 1 * MS]),
        "hidden_prep_ns": a([0, 1 * MS, 1 * MS, 1 * MS]),
        "bubble_ns": [None, 0, 5 * MS, 2 * MS],
        "bubble_kind": [None, "other", "host_bound", "other"],
        "num_waiting": [1, 0, 0, 0], "num_running": [2, 3, 2, 1],
        "kv_used_blocks": [3, 4, 4, 2], "num_preempted": [0, 0, 0, 0],
        **SPEC_STEPS,
    })  # fmt: skip
    rows = [(step, "cpu", "step", s, e) for step, (s, e) in enumerate(CPU_MS)]
    rows += [(step, "cpu", name, s + o0, s + o1) for step, (s, _) in enumerate(CPU_MS)
             for name, (o0, o1) in CPU_PHASES.items()]  # fmt: skip
    rows += [(step, "gpu", name, s + o0, s + o1) for step, (s, _) in enumerate(GPU_MS)
             for name, (o0, o1) in GPU_PHASES.items()]  # fmt: skip
    store.append(run_id, "spans", {
        "step": a([r[0] for r in rows]), "track": [r[1] for r in rows],
        "name": [r[2] for r in rows], "start_ns": a([T0 + r[3] * MS for r in rows]),
        "end_ns": a([T0 + r[4] * MS for r in rows]),
    })  # fmt: skip
    # syncs: output_wait x4 (0.1 ms each), implicit MR x3 (2+1+0.5 ms), SAMPLER x1 (4 ms),
    # copy INPUT x2 (0 ms)
    syncs = [(i, "output_wait", None, MS // 10) for i in range(4)]
    syncs += [(1, "implicit", MR, 2 * MS), (2, "implicit", MR, MS), (3, "implicit", MR, MS // 2)]
    syncs += [(2, "implicit", SAMPLER, 4 * MS), (0, "copy", INPUT, 0), (1, "copy", INPUT, 0)]
    store.append(run_id, "syncs", {
        "step": a([r[0] for r in syncs]), "t_ns": a([T0 + r[0] * MS for r in syncs]),
        "kind": [r[1] for r in syncs], "site": [r[2] for r in syncs],
        "blocked_ns": a([r[3] for r in syncs]),
    })  # fmt: skip
    store.append(run_id, "graph_dispatch", {
        "step": a(range(4)), "num_tokens": [100, 4, 4, 2], "padded_tokens": [104, 4, 4, 2],
        "requested_mode": ["full_and_piecewise"] * 4,
        "mode": ["piecewise", "full", "full", "full"], "hit": [True] * 4,
        "reason": ["mixed prefill/decode batch", "uniform decode, 4 → 4",
                   "uniform decode, 4 → 4", "uniform decode, 2 → 2"],
    })  # fmt: skip
    store.append(run_id, "graph_captures", CAPTURES)
    # staged writes: block_table 504 + 60 = 564 of 2 x 262144; num_computed_tokens 320 + 16
    # of 2 x 4096; per step 0: 824, 1: 60, 2: 16
    store.append(run_id, "staged_writes", {
        "step": a([0, 0, 1, 2]),
        "tensor": ["block_table", "num_computed_tokens", "block_table", "num_computed_tokens"],
        "rows": [16, 16, 3, 1], "elements": a([62, 16, 3, 1]),
        "staged_bytes": a([504, 320, 60, 16]), "dense_bytes": a([262144, 4096, 262144, 4096]),
    })  # fmt: skip
    store.append(run_id, "requests", {
        "req_id": ["r0", "r1", "r2", "r4"],
        "arrival_ns": a([T0 + ms * MS for ms in (0, 5, 20, 40)]),
        "first_token_ns": a([T0 + ms * MS for ms in (10, 25, 50, 45)]),
        "finish_ns": a([T0 + ms * MS for ms in (40, 85, 60, 45)]),
        "prompt_tokens": [10, 10, 10, 10], "output_tokens": [4, 3, 2, 1],
        "finish_reason": ["stop", "length", "abort", "stop"],
    })  # fmt: skip
    tokens = [(r, i, ms) for r, times in TOKEN_MS.items() for i, ms in enumerate(times)]
    store.append(run_id, "tokens", {
        "req_id": [t[0] for t in tokens], "idx": [t[1] for t in tokens],
        "t_ns": a([T0 + t[2] * MS for t in tokens]), "token_id": a(range(len(tokens))),
    })  # fmt: skip
    # NVML at 0, 50, 100 ms after step 0 = 1.0, 1.05, 1.1 s after the run started
    store.append(run_id, "gpu_samples", {
        "t_ns": a([T0, T0 + 50 * MS, T0 + 100 * MS]), "gpu_util": [10.0, 80.0, 95.0],
        "mem_used_bytes": a([2**30, 2 * 2**30, 3 * 2**30]), "power_w": [100.0, 250.0, 300.0],
        "sm_clock_mhz": [1000.0, 1980.0, 1980.0],
    })  # fmt: skip
    # spec decode: verifies (drafted, accepted) 3/3 3/1 3/0 2/2 -> 4 drafts, per position
    # 3/4 2/4 1/4, accepted-length counts [1, 1, 1, 1], mean acceptance length 1 + 6/4 = 2.5
    store.append(run_id, "spec_verifies", {
        "step": a([1, 1, 2, 3]), "req_id": ["r0", "r1", "r0", "r1"],
        "num_draft_tokens": [3, 3, 3, 2], "num_accepted_tokens": [3, 1, 0, 2],
    })  # fmt: skip
    # host samples: 2 in schedule (one stack), 1 in update
    store.append(run_id, "host_samples", {
        "step": a([0, 1, 1]), "t_ns": a([T0 + MS, T0 + 11 * MS, T0 + 12 * MS]),
        "phase": ["schedule", "schedule", "update"],
        "stack": ["main;sched", "main;sched", "main;upd"],
        "depth": [2, 2, 2],
    })  # fmt: skip


@pytest.fixture
def gpu_db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _begin(store, "9a0001")
        fill_gpu_run(store, "9a0001")
    return path


@pytest.fixture
def gpu_page(gpu_db: Path) -> str:
    with Store.open(gpu_db, read_only=True) as store:
        return render_run_report(store, "9a0001")


# ---- the synthetic GPU run ---------------------------------------------------------------------


def test_gpu_report_is_self_contained_with_every_figure(gpu_page):
    assert_self_contained(gpu_page)
    figs = figures_of(gpu_page)
    assert sorted(figs) == sorted(RUN_FIGURES)
    assert set(not_measured(gpu_page)) == {"kernel_ops"}  # no kernel-trace window in it
    for fid, fig in figs.items():
        assert fig["layout"]["meta"]["id"] == fid
        assert f'id="plot-{fid}"' in gpu_page and f'href="#sec-{fid}"' in gpu_page
    assert "name: gpu-demo" in gpu_page  # the scenario, in its <pre>
    assert "synthetic run for the report tests" in gpu_page  # the run's notes


def test_timeline_lanes_carry_the_stored_spans(gpu_page):
    fig = figures_of(gpu_page)["timeline"]
    names = {t["name"] for t in fig["data"]}
    assert names == {
        "CPU step",
        "GPU step",
        "schedule (CPU)",
        "prepare (CPU)",
        "forward (CPU)",
        "sample (CPU)",
        "output_wait (CPU)",
        "update (CPU)",
        "prepare (GPU)",
        "forward (GPU)",
        "sample (GPU)",
    }  # fmt: skip  ('step' and 'execute' contain the others: no bars of their own)
    assert segments_of(trace(fig, "CPU step")) == [(s, e) for s, e in CPU_MS]
    assert segments_of(trace(fig, "GPU step")) == [(s, e) for s, e in GPU_MS]
    assert segments_of(trace(fig, "forward (CPU)")) == [(s + 2, s + 5) for s, _ in CPU_MS]
    assert segments_of(trace(fig, "forward (GPU)")) == [(s + 1, s + 5) for s, _ in GPU_MS]
    custom = np.asarray(trace(fig, "forward (GPU)")["customdata"])
    assert custom[0::3, 0].tolist() == [0, 1, 2, 3]  # step
    assert custom[0::3, 1].tolist() == [4, 4, 4, 4]  # duration ms
    assert fig["layout"]["meta"]["detail_window"] is None  # 4 steps: all in detail
    lanes = fig["layout"]["yaxis"]
    assert dict(zip(lanes["ticktext"], lanes["tickvals"], strict=True))["GPU step"] == 0


def test_overlap_and_bubbles(gpu_page):
    figs = figures_of(gpu_page)
    overlap = figs["overlap"]
    (series,) = overlap["data"]
    assert np.asarray(series["y"]).tolist() == [0.0, 50.0, 25.0, 100.0]
    assert overlap["layout"]["meta"]["run_overlap"] == pytest.approx(1 / 3)
    bubbles = figs["bubbles"]
    assert bubbles["layout"]["meta"]["totals_ms"] == {"host_bound": 5.0, "other": 2.0}
    scatter = {t["name"]: t for t in bubbles["data"] if t["type"] == "scattergl"}
    assert np.asarray(scatter["host_bound"]["x"]).tolist() == [2]
    assert np.asarray(scatter["other"]["x"]).tolist() == [1, 3]
    assert np.asarray(scatter["other"]["y"]).tolist() == [0.0, 2.0]


def test_sync_sites_by_file_and_line(gpu_page):
    fig = figures_of(gpu_page)["sync_sites"]
    bars = {}
    for t in fig["data"]:
        for label, count, blocked in zip(t["y"], t["x"], t["customdata"], strict=True):
            bars[label] = (int(count), float(blocked))
    assert bars == {
        "(output_wait)": (4, pytest.approx(0.4)),
        f"{MR} (implicit)": (3, pytest.approx(3.5)),
        f"{SAMPLER} (implicit)": (1, pytest.approx(4.0)),
        f"{INPUT} (copy)": (2, 0.0),
    }


def test_graph_modes_and_capture_cost_of_the_never_used_key(gpu_page):
    figs = figures_of(gpu_page)
    modes = figs["graph_modes"]
    assert modes["layout"]["meta"]["steps_per_mode"] == {"full": 3, "piecewise": 1}
    full = trace(modes, "full (3 steps)")
    assert np.asarray(full["x"]).tolist() == [1, 2, 3]
    assert np.asarray(full["y"]).tolist() == [4, 4, 2]
    capture = figs["graph_capture"]
    meta = capture["layout"]["meta"]
    assert meta["num_unused"] == 1
    assert meta["unused_capture_s"] == pytest.approx(0.75)
    assert meta["unused_mem_bytes"] == 3 * 2**20
    assert meta["capture_s"] == pytest.approx(2.5)
    never = [t for t in capture["data"] if t["name"] == "never replayed"]
    assert [list(t["x"]) for t in never] == [["full:8"], ["full:8"]]
    assert np.asarray(never[0]["y"]).tolist() == [0.75]
    assert np.asarray(never[1]["y"]).tolist() == [3.0]  # MiB
    assert meta["notes"][1] == (
        "1 of them captured on first use, inside step 2, in 1.000 s (graph_captures.step)"
    )


def test_staged_writes_per_tensor_and_step(gpu_page):
    fig = figures_of(gpu_page)["staged_writes"]
    staged, dense = trace(fig, "staged bytes"), trace(fig, "dense copy bytes")
    assert list(staged["x"]) == ["block_table", "num_computed_tokens"]
    assert np.asarray(staged["y"]).tolist() == [564, 336]
    assert np.asarray(dense["y"]).tolist() == [524288, 8192]
    per_step = trace(fig, "staged bytes per step")
    assert np.asarray(per_step["x"]).tolist() == [0, 1, 2]
    assert np.asarray(per_step["y"]).tolist() == [824, 60, 16]


def test_latency_cdf_end_points(gpu_page):
    fig = figures_of(gpu_page)["latency_cdf"]
    expected = {"TTFT": ((5, 1 / 3), (20, 1)), "TPOT": ((10, 1 / 2), (30, 1)),
                "ITL": ((10, 1 / 5), (40, 1)), "E2E": ((5, 1 / 3), (80, 1))}  # fmt: skip
    for name, (first, last) in expected.items():
        t = trace(fig, name)
        x, y = np.asarray(t["x"]), np.asarray(t["y"])
        assert (x[0], y[0]) == pytest.approx(first)
        assert (x[-1], y[-1]) == pytest.approx(last)
    assert fig["layout"]["meta"]["counts"] == {"ttft": 3, "tpot": 2, "itl": 5, "e2e": 3}


def test_nvml_series(gpu_page):
    fig = figures_of(gpu_page)["nvml"]
    util, mem, power, clock = fig["data"]
    assert np.asarray(util["x"]) == pytest.approx([1.0, 1.05, 1.1])
    assert np.asarray(util["y"]).tolist() == [10.0, 80.0, 95.0]
    assert np.asarray(mem["y"]).tolist() == [1.0, 2.0, 3.0]  # GiB
    assert np.asarray(power["y"]).tolist() == [100.0, 250.0, 300.0]
    assert np.asarray(clock["y"]).tolist() == [1000.0, 1980.0, 1980.0]


def test_spec_decode_figure_from_the_verifies(gpu_page):
    fig = figures_of(gpu_page)["spec_decode"]
    per_position, lengths, times = fig["data"]
    assert per_position["y"] == pytest.approx([75.0, 50.0, 25.0])
    assert list(per_position["x"]) == [1, 2, 3]
    assert list(lengths["y"]) == [1, 1, 1, 1]
    assert fig["layout"]["meta"]["mean_acceptance_length"] == pytest.approx(2.5)
    assert list(times["y"]) == [0.0, 0.0]  # no step of the synthetic run recorded its drafts
    assert fig["layout"]["meta"]["draft_time_share"] is None


def test_spec_steps_figure_draws_the_slots_and_dynamic_k(gpu_page):
    fig = figures_of(gpu_page)["spec_steps"]
    assert list(trace(fig, "slots reserved")["y"]) == [6, 3, 2, 0]
    assert list(trace(fig, "slots reclaimed")["y"]) == [0, 2, 3, 0]
    assert list(trace(fig, "requests sat out")["y"]) == [0, 1, 1, 0]
    assert list(trace(fig, "k chosen")["y"]) == [3, 3, 2, 0]
    pays = trace(fig, "expected tokens / cost ratio")
    assert list(pays["x"]) == [1, 2, 3]  # step 0 made no decision
    assert list(pays["y"]) == pytest.approx([2.0, 0.8, 0.75])
    meta = fig["layout"]["meta"]
    assert (meta["reserved_slots"], meta["reclaimed_slots"], meta["sat_out_requests"]) == (11, 5, 2)
    assert meta["decided_steps"] == 3
    assert meta["notes"][-1] == (
        "11 slots reserved, 5 reclaimed (45.5%); 2 requests sat out in 2 steps; "
        "k = 0 in 1 of 3 steps decided"
    )
