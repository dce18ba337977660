"""A contended host, from a run's stored environment (``host_contention``), and the runner's
default threads that do not oversubscribe a loaded host (``runner_threads``): the rules at their
edges on hand-made environments, and one spawned quickstart run that records its choice."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import duckdb
import pytest

from mrv2_prof.analysis.host_contention import assess
from mrv2_prof.pipeline.runner_threads import choose_threads

QUIET = {"cpu_count": 2, "cpu_affinity": 2, "torch_threads": 2, "runner_processes": 1}


def test_more_runner_threads_than_cores_is_contention_on_an_idle_host():
    # 2 ranks x 2 threads = 4 on 2 cores, no other load: 4 + 0 >= 2 + 1
    c = assess(dict(QUIET, runner_processes=2, load_avg_start=[0.0, 0, 0]))
    assert c.reasons == ("4 runner threads on 2 usable cores",)
    assert not assess(dict(QUIET, load_avg_start=[0.0, 0, 0])).contended  # 2 + 0 < 3


def test_busy_is_three_quarters_of_the_cores_beyond_the_run():
    # 8 cores, 1 thread, load read at 0 s (the run added nothing): 6.0 >= 0.75 x 8 = 6.0
    env = {"cpu_count": 8, "torch_threads": 1, "load_avg_start_after_s": 0.0}
    on = assess(dict(env, load_avg_start=[6.0, 1, 1]))
    assert on.reasons == ("load 6.00 beyond the run at the start on 8 cores (≥ 0.75 × cores)",)
    # 5.9 < 6.0, and 1 thread + 5.9 = 6.9 < 8 + 1: not contended
    assert not assess(dict(env, load_avg_start=[5.9, 1, 1])).contended


def test_stolen_cpu_time_is_contention_from_a_tenth():
    # (150 - 0) / (2000 - 1000) = 15 %; (90 - 0) / 1000 = 9 %
    env = dict(QUIET, cpu_steal_ticks_start=[0, 1000])
    c = assess(dict(env, cpu_steal_ticks_end=[150, 2000]))
    assert c.reasons == ("15 % of CPU time stolen by the hypervisor",)
    assert c.steal == pytest.approx(0.15)
    assert not assess(dict(env, cpu_steal_ticks_end=[90, 2000])).contended


def test_an_environment_without_a_cpu_count_is_not_judged():
    assert assess(None) is None and assess({}) is None
    assert assess({"cpu_count": "2"}) is None  # not a number


@pytest.mark.parametrize(
    ("environ", "cores", "load", "processes", "threads"),
    [
        ({}, 2, 0.3, 1, 2),  # round(1.7) = 2: a quiet host keeps every core
        ({}, 2, 3.0, 1, 1),  # nothing free: still 1
        ({}, 2, 0.6, 1, 1),  # round(1.4) = 1
        ({}, 16, 3.6, 1, 12),  # round(12.4)
        ({}, 8, 0.0, 2, 4),  # two ranks share 8 cores
        ({}, 2, None, 1, 2),  # load unknown: the cores
        ({"OMP_NUM_THREADS": "3"}, 2, 3.0, 1, None),  # the user's setting: left alone
    ],
)
def test_the_runner_threads_leave_the_loaded_cores(environ, cores, load, processes, threads):
    choice = choose_threads(environ, cores, load, processes)
    assert choice.threads == threads
    if threads is None:
        assert choice.reason == "OMP_NUM_THREADS=3 (given)"


def test_a_spawned_run_records_the_threads_it_chose_and_the_steal_time(tmp_path):
    db = tmp_path / "runs.duckdb"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", "--headless", "--db", str(db)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        (stored,) = con.execute("SELECT environment FROM runs").fetchone()
    run = json.loads(stored)
    cores = len(os.sched_getaffinity(0))
    chosen = re.fullmatch(
        rf"round\(\({cores} cores - load ([0-9.]+)\) / 1 process\(es\)\) = (\d+)",
        run["torch_threads_set_by"],
    )
    assert chosen, run["torch_threads_set_by"]
    load, threads = float(chosen[1]), int(chosen[2])
    expected = max(1, min(cores, int(cores - load + 0.5)))  # round half up, computed apart
    assert run["torch_threads"] == threads == expected
    assert run["OMP_NUM_THREADS"] is None and run["runner_processes"] == 1
    assert 0 < run["load_avg_start_after_s"] < run["load_avg_end_after_s"]
    start, end = run["cpu_steal_ticks_start"], run["cpu_steal_ticks_end"]
    assert end[0] >= start[0] and end[1] > start[1]
