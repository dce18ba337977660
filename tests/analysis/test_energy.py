"""Energy per output token and per decode step from NVML's energy counter, against a hand-worked
run: the counter's difference between the first and the last sample inside the serving window,
over the tokens and decode steps between those two samples."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from mrv2_prof.analysis.energy import energy_line, energy_rows, run_energy
from mrv2_prof.analysis.metrics import run_summary, serving_window
from mrv2_prof.analysis.summary import summary_tables
from mrv2_prof.store import Store

MS = 1_000_000  # ns
T0 = 5_000_000_000_000

# Run "e1", times in ms after T0. Requests r0, r1, r2 arrive at 0; the last finishes at 100:
# the serving window is [0, 100].
#   tokens  r0: 10 20 30 40   r1: 25 45 85 95   r2: 60 70
#   samples (ms, energy mJ): (-10, 500) outside, (5, NULL) no counter, (10, 1000) first,
#           (50, 1400), (90, 2200) last, (110, 2600) outside
#   -> t0 = 10, t1 = 90: energy (2200 - 1000) mJ = 1.2 J over 80 ms -> 15 W mean
#   tokens in (10, 90]: r0 20 30 40, r1 25 45 85, r2 60 70 = 8 (10 is t0's, 95 after t1)
#   -> 1.2 / 8 = 0.15 J per output token
#   steps (cpu start-end ms, prefill tokens): (0-8, 16) starts before t0; (12-18, 0) in;
#           (20-28, 4) a prefill; (30-38, 0) in; (40-48, 0) in; (50-58, 0) in; (85-95, 0) ends
#           after t1 -> 4 decode steps -> 1.2 / 4 = 0.3 J per decode step
TOKEN_MS = {"r0": [10, 20, 30, 40], "r1": [25, 45, 85, 95], "r2": [60, 70]}
SAMPLES = [(-10, 500), (5, None), (10, 1000), (50, 1400), (90, 2200), (110, 2600)]
STEPS = [(0, 8, 16), (12, 18, 0), (20, 28, 4), (30, 38, 0), (40, 48, 0), (50, 58, 0), (85, 95, 0)]


def _ns(ms: float) -> int:
    return T0 + round(ms * MS)


def add_run(
    store: Store,
    run_id: str,
    samples: list[tuple[float, int | None]],
    *,
    finish_ms: float | None = 100,
    device: str = "cuda:0",
) -> None:
    store.begin_run(
        run_id, scenario_name="energy", label="energy", matrix_combo=None,
        scenario_yaml="name: energy\n", device=device, versions={}, started_ns=T0,
    )  # fmt: skip
    reqs = list(TOKEN_MS)
    store.append(
        run_id,
        "requests",
        {
            "req_id": reqs,
            "arrival_ns": [_ns(0)] * len(reqs),
            "first_token_ns": [_ns(TOKEN_MS[r][0]) for r in reqs],
            "finish_ns": [None if finish_ms is None else _ns(finish_ms)] + [_ns(95)] * 2,
            "output_tokens": [len(TOKEN_MS[r]) for r in reqs],
            "finish_reason": [None if finish_ms is None else "stop"] + ["stop"] * 2,
        },
    )
    rows = [(r, i, ms) for r, times in TOKEN_MS.items() for i, ms in enumerate(times)]
    store.append(
        run_id,
        "tokens",
        {"req_id": [r for r, _, _ in rows], "idx": [i for _, i, _ in rows],
         "t_ns": [_ns(ms) for _, _, ms in rows]},
    )  # fmt: skip
    store.append(
        run_id,
        "steps",
        {"step": list(range(len(STEPS))), "cpu_start_ns": [_ns(a) for a, _, _ in STEPS],
         "cpu_end_ns": [_ns(b) for _, b, _ in STEPS], "num_prefill_tokens": [p for *_, p in STEPS],
         "num_tokens": [p or 3 for *_, p in STEPS]},
    )  # fmt: skip
    if samples:
        store.append(
            run_id,
            "gpu_samples",
            {"t_ns": [_ns(ms) for ms, _ in samples], "energy_mj": [e for _, e in samples]},
        )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "runs.duckdb")
    add_run(store, "e1", SAMPLES)
    yield store
    store.close()


def test_energy_per_token_and_per_decode_step_by_hand(store):
    e = run_energy(store, "e1", serving_window(store, "e1", partial=False))
    assert e.sampled and e.reason is None
    assert e.joules == pytest.approx(1.2) and e.seconds == pytest.approx(0.08)
    assert (e.output_tokens, e.decode_steps) == (8, 4)
    assert e.joules_per_output_token == pytest.approx(0.15)
    assert e.joules_per_decode_step == pytest.approx(0.3)
    assert e.mean_power_w == pytest.approx(15.0)
    assert energy_line(e) == (
        "0.15 J per output token, 0.3 J per decode step, 15 W mean over 0.1 s (NVML energy counter)"
    )


def test_the_run_summary_carries_it_and_the_summary_prints_one_row(store):
    s = run_summary(store, "e1")
    assert s.energy is not None and s.energy.joules_per_output_token == pytest.approx(0.15)
    out = io.StringIO()
    Console(file=out, width=200).print(summary_tables(s))
    (line,) = [ln for ln in out.getvalue().splitlines() if ln.startswith("energy")]
    assert line.split(None, 1)[1].strip() == energy_line(s.energy)


def test_a_partial_run_counts_to_its_last_token(tmp_path):
    # r0 in flight at the stop: the window ends at the last token or finish (95), not at 100;
    # the sample at 90 stays the last one inside it: the same figures
    with Store.open(tmp_path / "runs.duckdb") as store:
        add_run(store, "p1", SAMPLES, finish_ms=None)
        store.finish_run("p1", "aborted", ended_ns=_ns(200))
        assert serving_window(store, "p1", partial=True) == (_ns(0), _ns(95))
        e = run_summary(store, "p1").energy
        assert e.joules_per_output_token == pytest.approx(0.15) and e.decode_steps == 4


@pytest.mark.parametrize(
    ("samples", "device", "reason", "rows"),
    [
        ([], "cpu", "no GPU samples (a CPU run, or probes.nvml_hz 0)", []),
        ([(10, None), (90, None)], "cuda:0", "the GPU does not report NVML's energy counter",
         [("energy", "- (the GPU does not report NVML's energy counter)")]),
        ([(-10, 500), (10, 1000), (110, 2600)], "cuda:0",
         "fewer than 2 NVML energy samples in the serving window",
         [("energy", "- (fewer than 2 NVML energy samples in the serving window)")]),
        ([(10, 1000), (90, 400)], "cuda:0",
         "NVML's energy counter went back (the driver reloaded)",
         [("energy", "- (NVML's energy counter went back (the driver reloaded))")]),
    ],
)  # fmt: skip
def test_not_measured_says_why_and_a_cpu_run_shows_nothing(tmp_path, samples, device, reason, rows):
    with Store.open(tmp_path / "runs.duckdb") as store:
        add_run(store, "x1", samples, device=device)
        s = run_summary(store, "x1")
    assert s.energy.reason == reason and s.energy.joules_per_output_token is None
    assert energy_rows(s.energy) == rows
    out = io.StringIO()
    Console(file=out, width=200).print(summary_tables(s))
    assert any(ln.startswith("energy") for ln in out.getvalue().splitlines()) == bool(rows)


def test_no_token_or_decode_step_between_the_samples_leaves_that_figure_out(tmp_path):
    with Store.open(tmp_path / "runs.duckdb") as store:
        add_run(store, "n1", [(86, 1000), (94, 1100)])  # (86, 94]: r1's 95 is after it
        e = run_energy(store, "n1", serving_window(store, "n1", partial=False))
    assert e.reason is None and e.joules == pytest.approx(0.1) and e.output_tokens == 0
    assert e.joules_per_output_token is None and e.joules_per_decode_step is None
    assert e.mean_power_w == pytest.approx(12.5)
    assert energy_line(e).startswith("- per output token, - per decode step, 12 W mean")
