"""A stopped run's summary covers what it produced, labelled partial: the serving time to the
last token before the stop, tokens/s over it, TTFT and ITL over the requests completed or in
flight at the stop, TPOT and E2E over the completed ones. A completed run keeps its meaning."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest

from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.store import Store

ROOT = Path(__file__).resolve().parents[1]
MS = 1_000_000


def _hand_made_run(db: Path, status: str) -> None:
    """Four requests (ns from 1 s): ``a`` completed, ``b`` in flight with two tokens, ``c``
    arrived without a token, ``d`` aborted by its client after one token."""
    s = 1_000_000_000
    with Store.open(db) as store:
        store.begin_run("p0p0p0", scenario_name="p", label="p", matrix_combo=None,
                        scenario_yaml="", device="cpu", versions={}, started_ns=1)  # fmt: skip
        store.append("p0p0p0", "requests", {
            "req_id": ["a", "b", "c", "d"],
            "arrival_ns": [s, s, s + 40 * MS, s],
            "first_token_ns": [s + 10 * MS, s + 20 * MS, None, s + 15 * MS],
            "finish_ns": [s + 30 * MS, None, None, s + 16 * MS],
            "prompt_tokens": [4, 4, 4, 4],
            "output_tokens": [3, 2, 0, 1],
            "finish_reason": ["length", None, None, "abort"],
        })  # fmt: skip
        store.append("p0p0p0", "tokens", {
            "req_id": ["a", "a", "a", "b", "b", "d"],
            "idx": [0, 1, 2, 0, 1, 0],
            "t_ns": [s + 10 * MS, s + 20 * MS, s + 30 * MS, s + 20 * MS, s + 50 * MS, s + 15 * MS],
            "token_id": [1, 2, 3, 4, 5, 6],
        })  # fmt: skip
        store.finish_run("p0p0p0", status, ended_ns=s + 60 * MS)


def test_a_stopped_runs_figures_hand_worked(tmp_path):
    db = tmp_path / "runs.duckdb"
    _hand_made_run(db, "aborted")
    with Store.open(db, read_only=True) as store:
        s = run_summary(store, "p0p0p0")
    assert s.partial
    # first arrival 1.000 s to b's last token at 1.050 s (after a's finish at 1.030 s)
    assert s.duration_s == pytest.approx(0.050)
    assert s.output_tokens_per_s == pytest.approx(6 / 0.050)
    # TTFT of a (10 ms) and b (20 ms); d was aborted by its client, c has no first token
    assert (s.ttft_ms.count, s.ttft_ms.p50, s.ttft_ms.mean) == (2, 15.0, 15.0)
    # ITL: a's gaps 10 and 10 ms, b's 30 ms
    assert (s.itl_ms.count, s.itl_ms.p50) == (3, 10.0)
    assert s.itl_ms.mean == pytest.approx(50 / 3)
    # TPOT and E2E of the completed a: (30 - 10) / 2 and 30 ms
    assert (s.tpot_ms.count, s.tpot_ms.p50, s.e2e_ms.count, s.e2e_ms.p50) == (1, 10.0, 1, 30.0)


def test_a_completed_run_keeps_first_arrival_to_last_finish(tmp_path):
    db = tmp_path / "runs.duckdb"
    _hand_made_run(db, "completed")
    with Store.open(db, read_only=True) as store:
        s = run_summary(store, "p0p0p0")
    assert not s.partial
    assert s.duration_s == pytest.approx(0.030)  # a's finish; tokens after it do not count
    assert (s.ttft_ms.count, s.itl_ms.count) == (1, 2)  # completed requests only


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> tuple[str, str, Path]:
    """``mrv2-prof run`` (piped) with many long requests, SIGINT once tokens are stored."""
    db = tmp_path_factory.mktemp("partial") / "runs.duckdb"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "mrv2_prof", "run", "--db", str(db), "--heartbeat", "0.2",
            "--set", "workload.num_requests=32",
            "--set", "workload.output_len={dist: fixed, value: 900}",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    lines: list[str] = []
    producing = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if re.search(r"output tokens [1-9]", line):
                producing.set()

    out: list[str] = []
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # stdout in its own reader: communicate() would read stderr too, and take lines from `read`
    out_reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    out_reader.start()
    try:
        assert producing.wait(180), "".join(lines)
        time.sleep(1.5)  # past a flush: steps and tokens are stored
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    out_reader.join(10)
    stdout = "".join(out)
    assert proc.returncode == 130, "".join(lines)
    return stdout, "".join(lines), db


def _rows(db: Path) -> tuple[list, list]:
    with duckdb.connect(str(db), read_only=True) as con:
        requests = con.execute(
            "SELECT req_id, arrival_ns, first_token_ns, finish_ns, finish_reason FROM requests"
        ).fetchall()
        tokens = con.execute("SELECT req_id, t_ns FROM tokens ORDER BY req_id, idx").fetchall()
    return requests, tokens


def _latency_row(text: str, metric: str) -> list[str]:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"│ {metric} ")]
    return [cell.strip() for cell in line.strip("│").split("│")][1:]


def test_a_stopped_run_is_summarised_over_what_it_produced(stopped_run):
    stdout, stderr, db = stopped_run
    requests, tokens = _rows(db)
    assert any(r[4] is None for r in requests)  # requests were in flight at the stop
    end = max([t for _, t in tokens] + [r[3] for r in requests if r[3] is not None])
    serving_s = (end - min(r[1] for r in requests)) / 1e9
    rate = len(tokens) / serving_s
    assert rate > 0
    words = " ".join(stdout.split())
    assert (
        f"serving time {serving_s:,.2f} s (partial: first arrival to the last token before the "
        "stop)" in words
    )
    assert f"{rate:,.1f} output tok/s" in words
    assert "latency (ms), partial run:" in words
    counted = {r[0] for r in requests if r[4] in ("stop", "length", None)}
    ttft = [(r[2] - r[1]) / MS for r in requests if r[0] in counted and r[2] is not None]
    times: dict[str, list[int]] = {}
    for rid, t in tokens:
        if rid in counted:
            times.setdefault(rid, []).append(t)
    itl = [g / MS for ts in times.values() for g in np.diff(ts)]
    for metric, values in (("TTFT", ttft), ("ITL", itl)):
        p50, *_, mean, n = _latency_row(stdout, metric)
        assert int(n) == len(values) > 0, metric
        assert p50 == f"{np.percentile(values, 50):,.1f}", metric
        assert mean == f"{np.mean(values):,.1f}", metric
    # the progress ends with the same rate, and says the run is partial
    assert (
        f"stopped (aborted, partial): requests 0/32 done, {rate:,.1f} tok/s over the run "
        f"({len(tokens):,} output tokens / {serving_s:.2f} s serving time, first arrival to the "
        "last token before the stop)" in stderr
    )


def test_show_prints_the_partial_summary_again(stopped_run):
    _, _, db = stopped_run
    shown = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "show", "latest", "--db", str(db)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    words = " ".join(shown.stdout.split())
    assert "(partial: first arrival to the last token before the stop)" in words
    assert "latency (ms), partial run:" in words
