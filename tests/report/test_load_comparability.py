"""``compare``/``gate`` set the hosts' load against each other (``report.comparability``): two
hand-made sides whose runs' environments hold known loads."""

from __future__ import annotations

from mrv2_prof.analysis.run_sides import RunFacts, Side
from mrv2_prof.report.comparability import check

SCENARIO = "name: q\nseed: 0\n"


def _side(run_id: str, load: float) -> Side:
    # the load read at 0 s into the run: the run added nothing to it, all of it is beyond the run
    env = {"cpu_count": 2, "cpu_affinity": 2, "torch_threads": 1, "runner_processes": 1,
           "load_avg_start": [load, 1.0, 1.0], "load_avg_start_after_s": 0.0}  # fmt: skip
    facts = RunFacts(run_id, "cpu", SCENARIO, env, {}, "host")
    return Side(run_id, "db", None, [], [facts])


def test_a_contended_side_is_a_non_blocking_load_difference_with_both_figures():
    # 3.60 vs 2.70 on 2 cores: both busy (>= 1.5), 1 thread + load >= 3 on both
    comp = check(_side("a", 3.6), _side("b", 2.7))
    (d,) = comp.differences
    assert (d.what, d.key, d.blocking, d.run_id) == ("host", "load", False, "b")
    assert d.baseline == (
        "load 3.60 beyond the run on 2 cores (1.80 per core), contended: load 3.60 beyond the run "
        "at the start on 2 cores (≥ 0.75 × cores); 1 runner thread + load 3.60 on 2 usable cores"
    )
    assert d.candidate.startswith("load 2.70 beyond the run on 2 cores (1.35 per core), contended")
    assert comp.blocking == []


def test_quiet_hosts_differ_in_load_from_a_quarter_per_core():
    # 0.20 vs 0.60 on 2 cores: 0.10 vs 0.30 per core, 0.20 apart < 0.25: the same
    assert check(_side("a", 0.2), _side("b", 0.6)).differences == []
    # 0.20 vs 0.80: 0.10 vs 0.40 per core, 0.30 apart; neither contended (0.8 < 1.5, 1.8 < 3)
    (d,) = check(_side("a", 0.2), _side("b", 0.8)).differences
    assert (d.baseline, d.candidate) == (
        "load 0.20 beyond the run on 2 cores (0.10 per core)",
        "load 0.80 beyond the run on 2 cores (0.40 per core)",
    )


def _threads(side: Side, threads: int, set_by: str) -> Side:
    env = side.facts[0].environment
    env.update(torch_threads=threads, torch_threads_set_by=set_by)
    return side


def test_threads_the_load_chose_differ_without_blocking_and_given_ones_block():
    # the default follows the load: 2 threads on a quiet host, 1 on a busy one (runner_threads)
    quiet = "round((2 cores - load 0.20) / 1 process(es)) = 2"
    busy = "round((2 cores - load 1.40) / 1 process(es)) = 1"
    comp = check(_threads(_side("a", 0.2), 2, quiet), _threads(_side("b", 1.4), 1, busy))
    threads = [d for d in comp.differences if d.key == "torch_threads"]
    assert [(d.baseline, d.candidate, d.blocking) for d in threads] == [(2, 1, False)]
    assert comp.blocking == []
    # one side's count given by OMP_NUM_THREADS: a difference in what was asked, blocking
    given = "OMP_NUM_THREADS=2 (given)"
    comp = check(_threads(_side("a", 0.2), 2, given), _threads(_side("b", 1.4), 1, busy))
    assert [d.key for d in comp.blocking] == ["torch_threads"]
