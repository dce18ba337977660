"""The switchable probes through whole runs: off records nothing, on a CPU run each asked-for GPU
probe is a note, and on the GPU (``-m gpu``) the timeline, overlap, bubbles, drift and copy audit
of real runs, asserted from the stored tables."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
GPU_PROBES = ("probes.cuda_events=true", "probes.copy_audit=true", "probes.kernel_trace=true")


def _con(job):
    return duckdb.connect(job.db_path, read_only=True)


def test_disabled_probes_record_nothing(run_in_process):
    job, _ = run_in_process()  # the quickstart turns every switchable probe off
    con = _con(job)
    assert con.execute("SELECT count(*) FROM copies").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM kernels").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM spans WHERE track = 'gpu'").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM syncs WHERE kind <> 'output_wait'").fetchone() == (0,)
    info = json.loads(con.execute("SELECT info FROM runs").fetchone()[0])
    assert "gpu_timeline" not in info and not any("probes." in n for n in info["notes"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU side of the story")
def test_gpu_probes_on_a_cpu_run_are_notes_not_silence(run_in_process):
    job, _ = run_in_process(*GPU_PROBES)
    con = _con(job)
    notes = json.loads(con.execute("SELECT info FROM runs").fetchone()[0])["notes"]
    for key in ("cuda_events", "copy_audit", "kernel_trace"):
        assert any(n.startswith(f"probes.{key}: the run is on the CPU") for n in notes), key
    assert con.execute("SELECT count(*) FROM spans WHERE track = 'gpu'").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM steps WHERE overlap_frac IS NOT NULL").fetchone() == (
        0,
    )


GPU_RUN = (  # the decode-heavy scenario (1B, CUDA graphs), shortened
    "workload.num_requests=32",
    "workload.output_len.value=96",
    "probes.cuda_events=true",
    "probes.copy_audit=true",
    "probes.nvml_hz=0",
)


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    """The same decode-heavy run on the GPU with async scheduling off and on."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import queue
    import signal
    import threading

    from mrv2_prof.pipeline.harness import runner_main
    from mrv2_prof.pipeline.job import RunJob
    from mrv2_prof.scenario import load_scenario, scenario_yaml

    db = tmp_path_factory.mktemp("gpu") / "runs.duckdb"
    ids = {}
    for mode in ("false", "true"):
        s = load_scenario(
            ROOT / "scenarios/decode_heavy.yaml", [*GPU_RUN, f"runner.async_scheduling={mode}"]
        )
        data = s.model_dump(mode="json")
        job = RunJob(data, scenario_yaml(data), s.name, None, str(db))
        q: queue.Queue = queue.Queue()
        old = signal.getsignal(signal.SIGINT)
        try:
            runner_main(job, q, threading.Event())
        finally:
            signal.signal(signal.SIGINT, old)
        while not q.empty():
            kind, payload = q.get()
            if kind == "done":
                assert payload.status == "completed", payload.error
                ids[mode] = payload.run_id
    return duckdb.connect(str(db), read_only=True), ids


@pytest.mark.gpu
def test_the_gpu_timeline_has_one_span_per_phase_per_step(gpu_runs):
    con, ids = gpu_runs
    for run_id in ids.values():
        bad = con.execute(
            """
            SELECT s.step, count(g.name), count(DISTINCT g.name), min(g.end_ns - g.start_ns)
            FROM steps s LEFT JOIN spans g
              ON g.run_id = s.run_id AND g.step = s.step AND g.track = 'gpu'
            WHERE s.run_id = ? AND s.num_tokens > 0
            GROUP BY s.step HAVING count(g.name) <> 3 OR count(DISTINCT g.name) <> 3
                OR min(g.end_ns - g.start_ns) < 0
            """,
            [run_id],
        ).fetchall()
        assert bad == []
        n, ok = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE gpu_end_ns >= gpu_start_ns "
            "AND gpu_start_ns >= cpu_start_ns) FROM steps WHERE run_id = ? AND num_tokens > 0",
            [run_id],
        ).fetchone()
        assert n > 90 and ok == n


@pytest.mark.gpu
def test_async_scheduling_hides_host_work_and_shrinks_host_bound_bubbles(gpu_runs):
    con, ids = gpu_runs

    def run(run_id):
        return con.execute(
            "SELECT sum(hidden_prep_ns) / sum(host_prep_ns), "
            "coalesce(sum(bubble_ns) FILTER (WHERE bubble_kind = 'host_bound'), 0) "
            "FROM steps WHERE run_id = ?",
            [run_id],
        ).fetchone()

    sync_overlap, sync_bubble = run(ids["false"])
    async_overlap, async_bubble = run(ids["true"])
    print(f"overlap sync {sync_overlap:.3f} async {async_overlap:.3f}; host-bound bubble ms "
          f"sync {sync_bubble / 1e6:.2f} async {async_bubble / 1e6:.2f}")  # fmt: skip
    assert async_overlap > sync_overlap
    assert async_bubble < sync_bubble


@pytest.mark.gpu
def test_clock_anchor_drift_stays_under_50_us_and_copies_are_pinned(gpu_runs):
    con, ids = gpu_runs
    for run_id in ids.values():
        info = json.loads(
            con.execute("SELECT info FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        )
        tl = info["gpu_timeline"]
        assert tl["anchors"] >= 2 and tl["steps_dropped"] == 0
        assert tl["max_abs_drift_ns"] < 50_000, tl
        n, pinned, flagged = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE pinned), "
            "(SELECT count(*) FROM syncs WHERE run_id = $1 AND kind = 'copy') "
            "FROM copies WHERE run_id = $1",
            [run_id],
        ).fetchone()
        assert n > 100 and pinned == n and flagged == 0  # the runner's own copies are clean
