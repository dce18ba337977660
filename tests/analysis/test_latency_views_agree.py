"""Every view's latency figure for a run with a kernel-trace window is the one of ``store.latency``:
the summary (``show``), the report's data, compare's and gate's metric values and one-run samples,
and the run browser's headline. The figures are worked out by hand below.

Steps (ms after T0): 0 [0, 9], 1 [10, 19], 2 [21, 36] perturbed (the window: 21..36 ms),
3 [37, 60].

    req  arrival  first  tokens            finish  reason
    r0      0      10    10 20 35 45 55      55    stop
    r1      5      22    22 34 50            50    length
    r2      8      30    30                   -    abort   (not completed: counts nowhere)

TTFT: 10, 17 -> p50 13.5, p99 10 + 0.99 * 7 = 16.93.
ITL gaps: r0 10, 15 (ends at 35: inside the window), 10, 10; r1 12 (ends at 34: inside), 16.
Kept: 10 10 10 16 -> p50 10, p99 10 + 0.97 * 6 = 15.82. With the window's gaps the p50 would be
11 and the p99 15.95, so a view that keeps them disagrees.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mrv2_prof.analysis.gate_metrics import gate_metrics
from mrv2_prof.analysis.latency import latency_values, perturbed_window
from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.analysis.run_data import load_run_data
from mrv2_prof.analysis.run_queries import list_run_rows
from mrv2_prof.analysis.samples import latency_samples
from mrv2_prof.store import Store
from mrv2_prof.tui.run_figures import FROM_DATABASE, run_figures

MS = 1_000_000
T0 = 7_000_000_000_000
RUN = "kt1"
EXPECTED = {("ttft", 50): 13.5, ("ttft", 99): 16.93, ("itl", 50): 10.0, ("itl", 99): 15.82}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    path: Path = tmp_path_factory.mktemp("latency") / "runs.duckdb"
    with Store.open(path) as store:
        store.begin_run(
            RUN, scenario_name="kt", label="kt", matrix_combo=None, scenario_yaml="name: kt\n",
            device="cpu", versions={}, started_ns=T0,
        )  # fmt: skip
        store.append(RUN, "steps", {
            "step": [0, 1, 2, 3],
            "cpu_start_ns": [T0 + ms * MS for ms in (0, 10, 21, 37)],
            "cpu_end_ns": [T0 + ms * MS for ms in (9, 19, 36, 60)],
            "perturbed": [False, False, True, False],
        })  # fmt: skip
        store.append(RUN, "requests", {
            "req_id": ["r0", "r1", "r2"],
            "arrival_ns": [T0, T0 + 5 * MS, T0 + 8 * MS],
            "first_token_ns": [T0 + 10 * MS, T0 + 22 * MS, T0 + 30 * MS],
            "finish_ns": [T0 + 55 * MS, T0 + 50 * MS, T0 + 30 * MS],
            "prompt_tokens": [8, 8, 8], "output_tokens": [5, 3, 1], "num_preemptions": [0, 0, 0],
            "finish_reason": ["stop", "length", "abort"], "cached_tokens": [0, 0, 0],
        })  # fmt: skip
        tokens = {"r0": (10, 20, 35, 45, 55), "r1": (22, 34, 50), "r2": (30,)}
        rows = [(r, i, ms) for r, times in tokens.items() for i, ms in enumerate(times)]
        store.append(RUN, "tokens", {
            "req_id": [r for r, _, _ in rows],
            "idx": np.array([i for _, i, _ in rows], dtype=np.int32),
            "t_ns": np.array([T0 + ms * MS for _, _, ms in rows]),
            "token_id": np.arange(len(rows)),
        })  # fmt: skip
        store.finish_run(RUN, "completed", ended_ns=T0 + 60 * MS)
        yield store


def _pct(values, q: int) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def test_the_definitions_give_the_hand_worked_figures(store: Store):
    assert perturbed_window(store.connection, RUN) == (T0 + 21 * MS, T0 + 36 * MS)
    assert latency_values(store.connection, RUN, "itl") == [10.0, 10.0, 10.0, 16.0]
    kept_all = latency_values(store.connection, RUN, "itl", include_perturbed=True)
    assert kept_all == [10.0, 10.0, 10.0, 12.0, 15.0, 16.0]
    for (metric, q), expected in EXPECTED.items():
        assert _pct(latency_values(store.connection, RUN, metric), q) == pytest.approx(expected)


def test_every_view_shows_the_definitions_figures(store: Store):
    s = run_summary(store, RUN)  # what show prints and the report's summary table
    summary = {(m, q): getattr(getattr(s, f"{m}_ms"), f"p{q}") for m, q in EXPECTED}
    lat = load_run_data(store, RUN).latencies_ms  # the report's curves
    report = {(m, q): _pct(lat[m], q) for m, q in EXPECTED}
    gate = gate_metrics(store, RUN).values  # compare's and gate's metric values
    compare = {(m, q): gate[f"p{q}_{m}"] for m, q in EXPECTED}
    samples = latency_samples(store, RUN)  # compare's one-run-a-side samples
    one_run = {(m, q): _pct(samples[m], q) for m, q in EXPECTED}
    for view in (summary, report, compare, one_run):
        assert view == pytest.approx(EXPECTED)
    (row,) = list_run_rows(store)
    figures = run_figures(store, row)  # the run browser's headline
    assert figures.kind == FROM_DATABASE
    assert figures.numbers is not None
    assert figures.numbers.itl_ms_p99 == pytest.approx(EXPECTED[("itl", 99)])


def test_show_with_the_perturbed_steps_keeps_the_windows_gaps(store: Store):
    s = run_summary(store, RUN, include_perturbed=True)
    assert (s.itl_ms.p50, s.itl_ms.count) == (11.0, 6)
    assert s.itl_ms.p99 == pytest.approx(15.95)
