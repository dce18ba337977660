"""A run whose output is not a terminal prints a progress line every ``--heartbeat`` seconds and
ends with the whole run's rate: output tokens / serving time, as computed here from the stored
rows (not from the summary's SQL)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from mrv2_prof.pipeline.headless_progress import Heartbeat, eta_s, heartbeat_line
from mrv2_prof.views.snapshot import Snapshot

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\S+) s  requests (\d+)/(\d+)  output tokens ([\d,]+)  ([\d,.]+) tok/s  ETA ")
FINAL = re.compile(
    r"^done: requests (\d+)/(\d+) done, ([\d,.]+) tok/s over the run \(([\d,]+) output tokens / "
    r"([\d.]+) s serving time, first arrival to last finish\)$"
)


def _cli(*args: str, db: Path) -> subprocess.CompletedProcess:
    """``mrv2-prof run`` with stdout and stderr piped (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", "--db", str(db), *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.fixture(scope="module")
def piped_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    db = tmp_path_factory.mktemp("heartbeat") / "runs.duckdb"
    done = _cli(
        "--heartbeat", "0.2", "--set", "workload.num_requests=48",
        "--set", "workload.output_len={dist: fixed, value: 64}", db=db,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done, db


def test_a_piped_run_prints_a_progress_line_every_interval(piped_run):
    done, _ = piped_run
    lines = done.stderr.splitlines()
    legend = [i for i, line in enumerate(lines) if line.startswith("progress every 0.2 s: ")]
    assert len(legend) == 1, done.stderr
    beats = [m for line in lines if (m := LINE.match(line))]
    assert len(beats) >= 2, done.stderr  # 48 x 64 tokens take well over 0.4 s on a CPU
    assert all(int(m[3]) == 48 for m in beats)
    tokens = [int(m[4].replace(",", "")) for m in beats]
    assert tokens == sorted(tokens) and tokens[-1] > 0
    assert "━" not in done.stderr  # no progress bar drawn into a log


def test_the_final_line_is_the_whole_runs_rate(piped_run):
    done, db = piped_run
    (final,) = [m for line in done.stderr.splitlines() if (m := FINAL.match(line))]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT arrival_ns, finish_ns FROM requests").fetchall()
        (tokens,) = con.execute("SELECT count(*) FROM tokens").fetchone()
    serving_s = (max(f for _, f in rows) - min(a for a, _ in rows)) / 1e9
    assert (int(final[1]), int(final[2])) == (48, 48)
    assert int(final[4].replace(",", "")) == tokens == 48 * 64
    assert final[5] == f"{serving_s:.2f}"
    assert final[3] == f"{tokens / serving_s:,.1f}"
    # the summary on stdout shows the same rate
    assert f"{tokens / serving_s:,.1f} output tok/s" in done.stdout


def _snap(elapsed_s: float, output_tokens: int, tokens_left: int | None, done: int) -> Snapshot:
    return Snapshot(
        run_id="r", label="l", elapsed_s=elapsed_s, steps=1, steps_per_s=1.0,
        output_tokens=output_tokens, tokens_per_s=9999.0, num_requests=4, num_waiting=0,
        num_running=4 - done, num_finished=done, num_aborted=0, ttft_ms_p50=None,
        ttft_ms_p99=None, itl_ms_p50=None, itl_ms_p99=None, kv_usage=0.0, num_preemptions=0,
        staged_bytes=0, dense_bytes=0, tokens_left=tokens_left,
    )  # fmt: skip


def test_heartbeat_lines_hand_worked():
    now = [100.0]
    beat = Heartbeat(10.0, clock=lambda: now[0])
    assert not beat.due()
    now[0] = 112.5
    assert beat.due() and not beat.due()  # once per interval
    assert beat.lines(None) == ["starting: 12.5 s since launch (loading the model)"]
    # 100 tokens in 2 s: 50 tok/s (the run's, not the last interval's 9999); 300 left: 6 s
    snap = _snap(2.0, 100, 300, 1)
    assert eta_s(snap) == 6.0
    first = beat.lines(snap)
    assert first[0].startswith("progress every 10.0 s: ") and len(first) == 2
    assert first[1] == "2.0 s  requests 1/4  output tokens 100  50.0 tok/s  ETA 6.0 s"
    assert beat.lines(snap) == []  # no new snapshot since the last line: no line
    assert beat.lines(_snap(4.0, 100, None, 1)) == [
        "4.0 s  requests 1/4  output tokens 100  25.0 tok/s  ETA -"
    ]
    assert heartbeat_line(_snap(0.5, 0, 50, 0)).endswith("0.0 tok/s  ETA -")
    assert not Heartbeat(0.0, clock=lambda: now[0]).due()  # 0: no lines


@pytest.mark.parametrize("value", ["-1", "nan", "100000"])
def test_a_bad_heartbeat_is_one_line_exit_2_nothing_written(tmp_path, value):
    db = tmp_path / "runs.duckdb"
    done = _cli("--heartbeat", value, db=db)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: --heartbeat {value!r}: expected seconds between progress lines, a number from "
        "0 (none) to 86,400"
    ]
    assert list(tmp_path.iterdir()) == []
