"""What the report must show beyond the step figures: the scheduler panel, downgrade labels in
every sweep view, log axes for long tails, a reason in place of an empty chart, and a sweep
table that fits the page. Checked in the figure JSON read back from the page; every expected
number is worked out by hand in the comments."""

from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from test_html_report import figures_of, not_measured, trace

from mrv2_prof.analysis.run_data import load_run_data
from mrv2_prof.analysis.summary import render_comparison
from mrv2_prof.report import figures
from mrv2_prof.report.html_report import render_run_report, render_sweep_report
from mrv2_prof.report.scheduler_panel import scheduler
from mrv2_prof.report.sweep import HEADLINE_METRICS
from mrv2_prof.store import Store

MS = 1_000_000
T0 = 9_000_000_000_000


def a(values) -> np.ndarray:
    return np.array(list(values), dtype=np.int64)


def _begin(store: Store, run_id: str, *, device="cpu", combo=None, given=None, as_run=None):
    as_run = as_run or "name: sched\n"
    store.begin_run(
        run_id, scenario_name="sched", label="sched", matrix_combo=combo, scenario_yaml=as_run,
        device=device, versions={}, started_ns=T0 - 100 * MS,
        info={"num_kv_blocks": 16, "num_graphs": 0},
    )  # fmt: skip
    if given is not None:
        store.update_run(run_id, scenario_given_yaml=given)


# ---- the scheduler panel ------------------------------------------------------------------------
# 5 steps ending at 10, 20, 30, 40, 50 ms after T0.
#   waiting 3 2 1 0 0, running 1 2 3 4 4, KV blocks 4 8 12 16 10 of 16, preempted 0 0 1 2 0
#   -> 3 preemptions, the first at step 2; so far 0 0 1 3 3; peak 16 blocks, 3 waiting, 4 running
# Requests (first token ms, prompt, cached): r0 (5, 100, 0) -> step 0; r1 (15, 100, 50) and
#   r2 (18, 100, 100) -> step 1; r3 (41, 100, 50) -> step 4. Hit rate so far: step 0 0/100 = 0,
#   step 1 150/300 = 50 %, step 4 200/400 = 50 %.
def fill_scheduler_run(store: Store, run_id: str) -> None:
    steps = range(5)
    store.append(run_id, "steps", {
        "step": a(steps), "cpu_start_ns": a(T0 + 10 * s * MS for s in steps),
        "cpu_end_ns": a(T0 + 10 * (s + 1) * MS for s in steps),
        "num_waiting": [3, 2, 1, 0, 0], "num_running": [1, 2, 3, 4, 4],
        "kv_used_blocks": [4, 8, 12, 16, 10], "num_preempted": [0, 0, 1, 2, 0],
        "graph_mode": ["none"] * 5,
    })  # fmt: skip
    store.append(run_id, "requests", {
        "req_id": ["r0", "r1", "r2", "r3"], "arrival_ns": a([T0] * 4),
        "first_token_ns": a(T0 + ms * MS for ms in (5, 15, 18, 41)),
        "finish_ns": a(T0 + ms * MS for ms in (20, 30, 40, 50)),
        "prompt_tokens": [100] * 4, "output_tokens": [2] * 4, "num_preemptions": [0, 1, 2, 0],
        "finish_reason": ["stop"] * 4, "cached_tokens": [0, 50, 100, 50],
    })  # fmt: skip
    store.finish_run(run_id, "completed", ended_ns=T0 + 60 * MS)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _begin(store, "5c0001")
        fill_scheduler_run(store, "5c0001")
    return path


def test_the_scheduler_panel_carries_queue_kv_preemptions_and_prefix_hits(db):
    with Store.open(db, read_only=True) as store:
        page = render_run_report(store, "5c0001")
    fig = figures_of(page)["scheduler"]
    assert list(trace(fig, "waiting")["y"]) == [3, 2, 1, 0, 0]
    assert list(trace(fig, "running")["y"]) == [1, 2, 3, 4, 4]
    assert list(trace(fig, "KV blocks used")["y"]) == [4, 8, 12, 16, 10]
    assert list(trace(fig, "preempted in the step")["x"]) == [2, 3]
    assert list(trace(fig, "preempted in the step")["y"]) == [1, 2]
    assert list(trace(fig, "preemptions so far")["y"]) == [0, 0, 1, 3, 3]
    hits = trace(fig, "prefix-cache hit rate so far")
    assert list(hits["x"]) == [0, 1, 4]
    assert np.allclose(hits["y"], [0, 50, 50])
    meta = fig["layout"]["meta"]
    assert (meta["num_preemptions"], meta["first_preemption_step"]) == (3, 2)
    assert (meta["peak_kv_blocks"], meta["num_kv_blocks"]) == (16, 16)
    assert (meta["peak_waiting"], meta["peak_running"]) == (3, 4)
    assert meta["prefix_hit_rate"] == pytest.approx(0.5)
    assert "3 preemptions, the first at step 2" in meta["notes"]
    assert "KV blocks: peak 16 of 16 (100.0%)" in meta["notes"]
    assert page.index('id="sec-scheduler"') < page.index('id="sec-overlap"')


def test_the_scheduler_panel_says_why_when_the_steps_have_no_counts(tmp_path):
    with Store.open(tmp_path / "runs.duckdb") as store:
        _begin(store, "5c0002")
        store.append("5c0002", "steps", {"step": a([0, 1]), "cpu_start_ns": a([T0, T0 + MS]),
                                         "cpu_end_ns": a([T0 + MS, T0 + 2 * MS])})  # fmt: skip
        _begin(store, "5c0003")
        page = render_run_report(store, "5c0002")
        empty = scheduler(load_run_data(store, "5c0003"))
    assert not_measured(page)["scheduler"] == (
        "not measured on this run: the steps carry no scheduler counts (a run database from "
        "before they were stored)"
    )
    assert empty.why == "the run has no steps"


# ---- log axes for long tails --------------------------------------------------------------------


def test_a_long_tailed_cdf_gets_a_log_axis_and_a_short_one_does_not(db):
    with Store.open(db, read_only=True) as store:
        data = load_run_data(store, "5c0001")
    # ITL 0, 1, 1, 1, 50: positive median 1, max 50 -> 50x: log, and the zero gap is said.
    # TTFT 10, 12, 15: max 1.5x the median -> linear. TPOT 2 .. 19 (9.5x): linear.
    lat = {"ttft": np.array([10.0, 12, 15]), "tpot": np.array([2.0, 2, 19]),
           "itl": np.array([0.0, 1, 1, 1, 50]), "e2e": np.array([20.0, 30, 40])}  # fmt: skip
    fig = figures.latency_cdf(dataclasses.replace(data, latencies_ms=lat)).to_plotly_json()
    layout = fig["layout"]
    assert layout["meta"]["log_x"] == {"ttft": False, "tpot": False, "itl": True, "e2e": False}
    assert layout["xaxis3"]["type"] == "log"  # ITL: row 2, column 1
    assert all(layout[ax].get("type") != "log" for ax in ("xaxis", "xaxis2", "xaxis4"))
    assert layout["meta"]["notes"] == [
        "ITL: log x axis (the largest value is 50x the median)",
        "ITL: 1 value of 0 ms not drawn on the log axis",
    ]


# ---- sweeps: downgrades named, empty panels replaced by why, a table that fits ------------------
GIVEN = "name: sched\nrunner: {{device: cpu, kernels: {k}, uva: false}}\n"
AS_RUN = "name: sched\nrunner: {device: cpu, kernels: torch, uva: false}\n"


@pytest.fixture
def sweep_db(tmp_path: Path) -> Path:
    """Two CPU runs of a kernels matrix: the triton row ran torch (a downgrade), the torch
    row ran as asked."""
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        for rid, k in (("d00001", "triton"), ("d00002", "torch")):
            _begin(store, rid, combo={"runner.kernels": k}, given=GIVEN.format(k=k), as_run=AS_RUN)
            fill_scheduler_run(store, rid)
    return path


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_the_sweep_report_names_each_downgrade(sweep_db):
    with Store.open(sweep_db, read_only=True) as store:
        page = render_sweep_report(store, ["d00001", "d00002"])
    fig = figures_of(page)["sweep"]
    meta = fig["layout"]["meta"]
    assert meta["downgrades"] == {"d00001": ["kernels triton→torch"], "d00002": []}
    legend = {t["name"] for t in fig["data"] if t.get("showlegend")}
    assert legend == {"d00001 kernels=\"triton\" [ran kernels triton→torch]",
                      "d00002 kernels=\"torch\""}  # fmt: skip
    assert meta["notes"] == ["d00001 ran kernels triton→torch"]
    runs = re.search(r'<table id="runs">(.*?)</table>', page, re.S).group(1)
    rows = [_text(r) for r in re.findall(r"<tr>(.*?)</tr>", runs)[1:]]
    assert rows == ["d00001completedtriton (ran torch)", "d00002completedtorchas asked"]


def test_the_matrix_table_names_each_downgrade(sweep_db):
    console = Console(width=160, record=True)
    with Store.open(sweep_db, read_only=True) as store:
        console.print(render_comparison(store, ["d00001", "d00002"]))
    text = console.export_text()
    (row1,) = [line for line in text.splitlines() if "d00001" in line]
    (row2,) = [line for line in text.splitlines() if "d00002" in line]
    assert "triton (ran torch)" in row1
    assert "torch" in row2 and "ran" not in row2


def test_a_panel_no_run_measured_says_why_instead_of_an_empty_axis(sweep_db):
    with Store.open(sweep_db, read_only=True) as store:
        page = render_sweep_report(store, ["d00001", "d00002"])
    layout = figures_of(page)["sweep"]["layout"]
    why = layout["meta"]["not_measured"]
    assert why["graph_hit_pct"] == "no CUDA graphs captured (a cpu run)"
    assert why["overlap_pct"] == "no GPU timeline (a cpu run)"
    assert layout["meta"]["values"]["d00001"]["graph_hit_pct"] is None  # not a 0 % bar
    i = [k for k, _, _ in HEADLINE_METRICS].index("graph_hit_pct") + 1
    assert layout[f"xaxis{i}"]["visible"] is False and layout[f"yaxis{i}"]["visible"] is False
    texts = [an["text"] for an in layout["annotations"]]
    assert "not measured:<br>no CUDA graphs captured (a cpu run)" in texts


SWEEP_GIVEN = (
    "name: sched\nrunner: {{device: cpu, kernels: {k}, uva: true, "
    "cudagraph_mode: full_and_piecewise}}\n"
)
SWEEP_AS_RUN = (
    "name: sched\nrunner: {device: cpu, kernels: torch, uva: false, cudagraph_mode: none}\n"
)
CHAR_PX, CELL_PAD_PX, PAGE_PX = 8.5, 26, 1400 - 32  # a generous glyph width, 2 x .8em, body


def _min_table_px(table_html: str) -> float:
    """The narrowest the table can be laid out: per column, its longest unbreakable piece of
    text (broken at spaces and <wbr>) at CHAR_PX a character, plus the cell padding."""
    rows = re.findall(r"<tr>(.*?)</tr>", table_html, re.S)
    widths: dict[int, float] = {}
    for row in rows:
        for i, cell in enumerate(re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)):
            pieces = re.split(r"\s+|<wbr>", cell)
            longest = max(len(_text(p)) for p in pieces)
            widths[i] = max(widths.get(i, 0), longest * CHAR_PX + CELL_PAD_PX)
    return sum(widths.values())


def test_the_sweep_tables_of_an_eight_run_ablation_fit_a_1400px_page(tmp_path):
    keys = ("runner.kernels", "runner.staged_writes", "runner.async_scheduling")
    with Store.open(tmp_path / "runs.duckdb") as store:
        ids = []
        for n in range(8):
            combo = dict(zip(keys, ["triton" if n < 4 else "torch", n % 4 < 2, n % 2 == 0],
                             strict=True))  # fmt: skip
            rid = f"e0000{n}"
            kernels = combo["runner.kernels"]
            given = SWEEP_GIVEN.format(k=kernels)
            as_run = SWEEP_AS_RUN
            _begin(store, rid, combo=combo, given=given, as_run=as_run)
            fill_scheduler_run(store, rid)
            ids.append(rid)
        page = render_sweep_report(store, ids)
    for table_id in ("runs", "headlines"):
        table = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S).group(1)
        assert _min_table_px(table) <= PAGE_PX, table_id
    headlines = re.search(r'<table id="headlines">(.*?)</table>', page, re.S).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", headlines, re.S)
    assert len(rows) == 1 + len(HEADLINE_METRICS)  # a row per metric, a column per run
    assert len(re.findall(r"<th", rows[0])) == 1 + 8


def test_the_matrix_table_breaks_headers_between_words_only(tmp_path):
    keys = ("runner.kernels", "runner.staged_writes", "runner.async_scheduling")
    with Store.open(tmp_path / "runs.duckdb") as store:
        ids = []
        for n, kernels in enumerate(("triton", "torch")):
            combo = dict(zip(keys, [kernels, True, False], strict=True))
            rid = f"f0000{n}"
            _begin(
                store, rid, combo=combo, given=SWEEP_GIVEN.format(k=kernels), as_run=SWEEP_AS_RUN
            )
            fill_scheduler_run(store, rid)
            ids.append(rid)
        console = Console(width=100, record=True)
        console.print(render_comparison(store, ids))
    shown = console.export_text()
    words = set(shown.replace("│", " ").replace("┃", " ").split())
    # a long snake_case key breaks after its "_", every other header between words
    for word in ("kernels", "staged_", "writes", "async_", "scheduling", "tok/s", "TTFT", "p50"):
        assert word in words, word
    assert {"triton", "(ran", "torch)"} <= words  # the downgraded value, whole words
    # keys outside the matrix, said once under the table for the runs they concern
    ran_as = "ran as uva true→false, cudagraph_mode full_and_piecewise→none: f00000, f00001"
    assert ran_as in " ".join(shown.split())
