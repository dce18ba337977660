"""The runner process's bookkeeping when things go wrong: nothing already recorded is lost."""

from __future__ import annotations

import json
import os
import signal
import time

import duckdb

from mrv2_prof.pipeline.launcher import RunnerProcess
from mrv2_prof.runner.engine import Engine


def test_a_runner_crash_marks_the_run_failed_and_keeps_its_steps(run_in_process, monkeypatch):
    original = Engine.step

    def failing_step(self):
        if self.step_index == 5:
            raise RuntimeError("injected failure in step 5")
        return original(self)

    monkeypatch.setattr(Engine, "step", failing_step)
    job, sent = run_in_process()
    kinds = [k for k, _ in sent]
    assert kinds[0] == "begun" and kinds[-1] == "done" and "started" in kinds
    outcome = sent[-1][1]
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.error == "RuntimeError: injected failure in step 5"
    with duckdb.connect(job.db_path, read_only=True) as con:
        status, error, info = con.execute("SELECT status, error, info FROM runs").fetchone()
        steps = con.execute("SELECT list(step ORDER BY step) FROM steps").fetchone()[0]
        tokens, outputs = con.execute(
            "SELECT (SELECT count(*) FROM tokens), (SELECT sum(output_tokens) FROM requests)"
        ).fetchone()
        unfinished = con.execute(
            "SELECT count(*) FROM requests WHERE finish_ns IS NULL"
        ).fetchone()[0]
    assert (status, error) == ("failed", "RuntimeError: injected failure in step 5")
    assert "injected failure" in json.loads(info)["traceback"]
    assert steps == [0, 1, 2, 3, 4]  # every step before the failure
    assert tokens == outputs == 16 * 5  # steps 0-4 each gave every request one token
    assert unfinished == 16


def test_a_killed_runner_is_marked_failed_by_the_parent(quickstart_job):
    job = quickstart_job(
        "workload.num_requests=300", "workload.output_len={dist: fixed, value: 300}"
    )
    runner = RunnerProcess(job)
    runner.start()
    deadline = time.monotonic() + 120
    snapshots = 0
    while snapshots < 6:  # past the first store flush (one a second)
        runner.pump(0.2)
        snap, _ = runner.poll()
        snapshots += snap is not None
        assert time.monotonic() < deadline and not runner.done
    os.kill(runner.process.pid, signal.SIGKILL)
    outcome = runner.join()
    assert outcome.status == "failed" and outcome.error == "runner process died (exit code -9)"
    with duckdb.connect(job.db_path, read_only=True) as con:
        status, error = con.execute("SELECT status, error FROM runs").fetchone()
        steps, hi = con.execute("SELECT count(*), max(step) FROM steps").fetchone()
    assert status == "failed" and "exit code -9" in error
    assert steps > 0 and hi == steps - 1  # what was flushed before the kill is kept


def test_a_crash_while_the_writer_is_busy_keeps_the_error_and_the_steps(
    run_in_process, monkeypatch
):
    """A step fails while the writer thread is inside a long append: the failure is still the
    run's error (the connection is not used from two threads at once) and every step is kept."""
    from mrv2_prof.pipeline import open_loop
    from mrv2_prof.store.db import Store

    original_step, original_append = Engine.step, Store.append_batches

    def failing_step(self):
        if self.step_index == 5:
            time.sleep(0.05)  # the writer is now inside the slow append of an earlier flush
            raise RuntimeError("injected failure in step 5")
        return original_step(self)

    def slow_append(self, run_id, batches):
        rows = original_append(self, run_id, batches)
        self.connection.execute("SELECT count(*) FROM range(150000000)").fetchall()  # ~0.3 s
        return rows

    monkeypatch.setattr(open_loop, "FLUSH_INTERVAL_NS", 0)  # a flush after every step
    monkeypatch.setattr(Engine, "step", failing_step)
    monkeypatch.setattr(Store, "append_batches", slow_append)
    job, sent = run_in_process()
    outcome = sent[-1][1]
    assert (outcome.status, outcome.error) == ("failed", "RuntimeError: injected failure in step 5")
    with duckdb.connect(job.db_path, read_only=True) as con:
        status, error, info = con.execute("SELECT status, error, info FROM runs").fetchone()
        steps = con.execute("SELECT list(step ORDER BY step) FROM steps").fetchone()[0]
    assert (status, error) == ("failed", "RuntimeError: injected failure in step 5")
    assert "injected failure" in json.loads(info)["traceback"]
    assert steps == [0, 1, 2, 3, 4]
