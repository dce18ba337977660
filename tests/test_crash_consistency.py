"""SIGKILL of the runner process at a random point: the tables it leaves agree with each other.

Each flush is one transaction holding the steps and their spans, the tokens and the rows of
their requests; a request's row is there from its arrival. So whatever point the kill hits,
no token lacks its request, the steps are numbered without gaps, every span's step exists, and
each request's ``output_tokens`` is the number of its token rows.
"""

from __future__ import annotations

import os
import random
import signal
import time

import duckdb
import pytest

from mrv2_prof.pipeline.launcher import RunnerProcess


def _disagreements(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, int]:
    one = lambda sql: con.execute(sql, [run_id]).fetchone()[0]  # noqa: E731
    steps, lo, hi = con.execute(
        "SELECT count(*), min(step), max(step) FROM steps WHERE run_id = ?", [run_id]
    ).fetchone()
    return {
        "tokens without their request": one(
            "SELECT count(*) FROM tokens t WHERE run_id = ? AND NOT EXISTS "
            "(SELECT 1 FROM requests r WHERE r.run_id = t.run_id AND r.req_id = t.req_id)"
        ),
        "requests written twice": one(
            "SELECT count(*) - count(DISTINCT req_id) FROM requests WHERE run_id = ?"
        ),
        "gaps in the steps": 0 if steps == 0 else int(lo != 0) + (hi - lo + 1 - steps),
        "spans of a missing step": one(
            "SELECT count(*) FROM spans s WHERE run_id = ? AND NOT EXISTS "
            "(SELECT 1 FROM steps t WHERE t.run_id = s.run_id AND t.step = s.step)"
        ),
        "requests whose output_tokens are not their token rows": one(
            "SELECT count(*) FROM requests r LEFT JOIN "
            "(SELECT run_id, req_id, count(*) AS n FROM tokens GROUP BY ALL) t "
            "USING (run_id, req_id) WHERE r.run_id = ? AND r.output_tokens != coalesce(t.n, 0)"
        ),
        "finished requests whose tokens are not 0..n-1": one(
            "SELECT count(*) FROM (SELECT r.req_id, r.output_tokens, count(t.idx) AS n, "
            "max(t.idx) AS hi FROM requests r JOIN tokens t USING (run_id, req_id) "
            "WHERE r.run_id = ? AND r.finish_reason IS NOT NULL GROUP BY ALL) "
            "WHERE n != output_tokens OR hi != n - 1"
        ),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tables_agree_after_the_runner_is_killed(quickstart_job, seed):
    rng = random.Random(seed)
    job = quickstart_job(
        "workload.num_requests=64",
        "workload.output_len={dist: uniform, min: 8, max: 200}",
        "workload.arrival={pattern: poisson, rate: 40}",
    )
    runner = RunnerProcess(job)
    runner.start()
    deadline = time.monotonic() + 120
    while runner.facts is None:  # the model is loaded; the step loop starts
        runner.pump(0.05)
        assert time.monotonic() < deadline and not runner.done
    kill_at = time.monotonic() + rng.uniform(0.0, 2.5)  # before, during or after a flush
    while time.monotonic() < kill_at and not runner.done:
        runner.pump(0.01)
    os.kill(runner.process.pid, signal.SIGKILL)
    outcome = runner.join()
    assert outcome.status in ("failed", "completed"), outcome
    with duckdb.connect(job.db_path, read_only=True) as con:
        (status,) = con.execute(
            "SELECT status FROM runs WHERE run_id = ?", [runner.run_id]
        ).fetchone()
        assert status in ("failed", "completed")
        bad = _disagreements(con, runner.run_id)
        counts = con.execute(
            "SELECT (SELECT count(*) FROM steps), (SELECT count(*) FROM tokens), "
            "(SELECT count(*) FROM requests)"
        ).fetchone()
    assert bad == dict.fromkeys(bad, 0), (bad, counts)
