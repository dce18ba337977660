"""A run stopped partway (Ctrl-C's stop request) still ends ``--metrics-port``'s counters and
histograms at the stored run's totals: the runner sends one last snapshot once its step loop has
ended, whatever ended it, carrying every latency not yet handed over
(pipeline/harness.py, pipeline/live_stats.py)."""

from __future__ import annotations

import signal
import time

import pytest

from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.pipeline.launcher import RunnerProcess
from mrv2_prof.pipeline.live_stats import LiveStats
from mrv2_prof.pipeline.metrics_exporter import serve
from mrv2_prof.store import Store
from tests.test_metrics_exporter import NS, Engine, free_port
from tests.test_metrics_run import scrape
from tests.tui.test_live_stats import Req, Result

parser = pytest.importorskip("prometheus_client.parser")


def test_the_last_snapshot_of_a_stopped_loop_carries_every_latency_left():
    live = LiveStats("r", "label", num_requests=3, num_kv_blocks=10)
    reqs = [Req(f"q{i}", 1.0, 1, num_prompt_tokens=4) for i in range(3)]
    live.on_step(Result(reqs), 2 * NS)  # three TTFTs of 1 s
    live.new.batch = 1  # a snapshot carries one value of each kind
    engine = Engine()  # requests still to run: the run was stopped
    assert live.snapshot(engine).new_ttft_s == (1.0,)
    final = live.snapshot(engine, final=True)
    assert final.new_ttft_s == (1.0, 1.0)
    assert live.snapshot(engine, final=True).new_ttft_s == ()  # each value handed over once


def test_a_stopped_run_ends_its_metrics_at_the_stored_totals(quickstart_job):
    port = free_port()
    exporter = serve(port)
    job = quickstart_job(
        "workload.num_requests=64", "workload.output_len={dist: uniform, min: 2, max: 600}"
    )
    try:
        runner = RunnerProcess(job)
        assert runner.metrics is exporter
        runner.start()
        deadline = time.monotonic() + 240
        while not runner.done and time.monotonic() < deadline:
            snap, _ = runner.poll()
            if snap is not None and snap.num_finished > 0:
                break
            time.sleep(0.05)
        runner.request_stop(signal.SIGINT)  # what Ctrl-C asks of a live run
        outcome = runner.join()
        assert outcome.status == "aborted", outcome
        end = scrape(port)
    finally:
        exporter.close()
    with Store.open(job.db_path, read_only=True) as store:
        s = run_summary(store, outcome.run_id)
        (requested,) = store.connection.execute(
            "SELECT count(DISTINCT req_id) FROM tokens WHERE run_id = ?", [outcome.run_id]
        ).fetchone()
    assert 0 < s.num_completed < 64 and s.num_unfinished > 0  # stopped partway
    assert end["vllm:generation_tokens_total"] == s.output_tokens
    assert end["mrv2_prof:steps_total"] == s.steps
    assert end["vllm:prompt_tokens_total"] == s.prompt_tokens
    assert end["mrv2_prof:requests_finished_total"] == s.num_completed
    assert end["vllm:time_to_first_token_seconds_count"] == requested
    assert end["vllm:e2e_request_latency_seconds_count"] == s.num_completed
    assert end["vllm:inter_token_latency_seconds_count"] == s.itl_ms.count
    assert end["mrv2_prof:syncs_total"] == s.num_syncs
