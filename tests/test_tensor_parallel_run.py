"""``runner.tensor_parallel_size: 2`` through the CLI on the CPU (gloo): the same greedy tokens as
one rank, both ranks' step rows in the store, and a size the model cannot split refused before
anything is written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
SMALL = ["--set", "runner.device=cpu", "--set", "workload.num_requests=4",
         "--set", "workload.output_len.value=8"]  # fmt: skip


def run(db: Path, *sets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", str(QUICKSTART), "--headless", "--db",
         str(db), *SMALL, *sets],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def tokens(db: Path) -> list[tuple[str, list[int]]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            "SELECT req_id, list(token_id ORDER BY idx) FROM tokens GROUP BY req_id ORDER BY 1"
        ).fetchall()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_two_ranks_give_one_ranks_tokens_and_both_ranks_rows(tmp_path, async_scheduling):
    a = f"runner.async_scheduling={str(async_scheduling).lower()}"
    one, two = tmp_path / "tp1.duckdb", tmp_path / "tp2.duckdb"
    for db, sets in ((one, [a]), (two, [a, "--set", "runner.tensor_parallel_size=2"])):
        proc = run(db, "--set", *sets)
        assert proc.returncode == 0, proc.stderr[-2000:]
    want = tokens(one)
    assert len(want) == 4 and all(len(t) == 8 for _, t in want)
    assert tokens(two) == want
    with duckdb.connect(str(two), read_only=True) as con:
        (steps,) = con.execute("SELECT count(*) FROM steps").fetchone()
        # every step a row per rank; a step that ran the model spent time in its collectives
        ranks = con.execute(
            "SELECT r.rank, count(*), min(r.end_ns - r.start_ns) > 0, "
            "min(r.comm_ns) FILTER (WHERE s.num_tokens > 0) > 0 "
            "FROM rank_steps r JOIN steps s USING (run_id, step) GROUP BY r.rank ORDER BY 1"
        ).fetchall()
        (info, run_id) = con.execute("SELECT info, run_id FROM runs").fetchone()
    assert ranks == [(0, steps, True, True), (1, steps, True, True)]
    assert "2 ranks over gloo" in info and "sampled other tokens" not in info
    if not async_scheduling:
        return  # the views of a two-rank run: once (they read the rows, whatever the schedule)
    show = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "show", run_id, "--db", str(two)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert show.returncode == 0 and "2 ranks; collectives rank 0 " in show.stdout, show.stdout
    trace = tmp_path / "trace.json"
    export = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "export", run_id, "--db", str(two), "-o", str(trace)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names[10] == "rank 0" and names[11] == "rank 1"  # a process track per rank
    for pid in (10, 11):
        assert sum(e.get("ph") == "X" for e in events if e["pid"] == pid) == steps
    page = tmp_path / "report.html"
    report = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "report", run_id, "--db", str(two), "-o", str(page)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    share = json.loads(re.search(r'"comm_share":(\{[^}]*\})', page.read_text()).group(1))
    with duckdb.connect(str(two), read_only=True) as con:
        want = dict(con.execute(
            "SELECT rank, sum(comm_ns) / sum(end_ns - start_ns) FROM rank_steps GROUP BY rank"
        ).fetchall())  # fmt: skip
    assert {int(k): v for k, v in share.items()} == pytest.approx(want, rel=1e-9)


def test_a_size_that_does_not_divide_the_model_is_refused_before_a_run(tmp_path):
    db = tmp_path / "r.duckdb"
    proc = run(db, "--set", "runner.tensor_parallel_size=3")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "runner.tensor_parallel_size: 3 does not divide the model's num_attention_heads (4)"
        )
    ), proc.stderr
    assert not db.exists()


def test_speculative_decoding_with_two_ranks_is_refused_before_a_run(tmp_path):
    db = tmp_path / "r.duckdb"
    proc = run(
        db, "--set", "runner.tensor_parallel_size=2", "--set", "runner.spec_decode.method=ngram"
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "runner.tensor_parallel_size: 2 ranks do not run speculative decoding yet; "
            "set runner.spec_decode.method: none"
        )
    ), proc.stderr
    assert not db.exists()
