"""The findings rules on hand-built runs: each number in a finding is worked out by hand in the
comments, and each rule is also shown not firing on a run that gives it nothing to say."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from mrv2_prof.analysis.finding_facts import FindingFacts, finding_facts
from mrv2_prof.analysis.findings import RULES, findings, run_findings
from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.store import Store
from mrv2_prof.views.downgrades import downgrades, runner_downgrades

MS = 1_000_000
T0 = 7_000_000_000_000
SITE_A = "mrv2_prof/runner/worker/model_runner.py:357"
SITE_B = "mrv2_prof/runner/worker/sampler.py:45"
GIVEN = "name: busy\nrunner: {kernels: triton, uva: true, cudagraph_mode: full_and_piecewise}\n"
AS_RUN = (
    "name: busy\nrunner: {kernels: torch, uva: false, cudagraph_mode: full_and_piecewise}\n"
    "workload: {shared_prefix: null}\n"
)


def a(values) -> np.ndarray:
    return np.array(list(values), dtype=np.int64)


# ---- the busy run: every rule fires -------------------------------------------------------------
# 10 steps of 20 ms; step 9 is perturbed (kernel trace), so the step figures count steps 0-8.
#   host-bound: bubble_kind host_bound at 2, 5, 7 (2 ms each) and starved 1 ms inside step 8
#     -> 4 of 9 timed steps = 44 %; host-bound bubble time 3 x 2 + 1 = 7.0 ms (step 9's 5 ms out)
#   CPU phases per step: schedule 1, prepare 3 in steps 2 and 5 else 0.5, forward 1,
#     output_wait 10 (a wait, not host work), update 1. Over steps 2, 5, 7, 8:
#     schedule 4, prepare 3 + 3 + 0.5 + 0.5 = 7, forward 4, update 4 -> mostly prepare
#   implicit syncs: SITE_A in steps 0-8 (9), SITE_B in steps 3 and 4 (2), SITE_A in step 9
#     (perturbed, out) -> 11 in 9 steps = 1.2 per step, most at SITE_A (9)
#   graph dispatch: full x6, piecewise x3 (mixed prefill/decode batch), none x1 -> 4 of 10 =
#     40 % fell back from FULL, most to PIECEWISE
#   captures: 4 keys, 1 replayed -> 3 never replayed, 1.5 s and 3 MiB
#   KV: 64 blocks; used 8 per step up to 64 at step 6; preempted 2 at step 6, 1 at step 7;
#     requests hold 1 + 2 + 0 + 0 = 3 preemptions -> "KV cache full at step 6: 3 preemptions"
#   prefix cache: 4 prompts of 50 tokens, 50 cached -> 50 / 200 = 25 %
#   downgrades: kernels triton -> torch, uva true -> false (cudagraph_mode unchanged)
HOST_BOUND = {2: 2 * MS, 5: 2 * MS, 7: 2 * MS, 9: 5 * MS}
KV_USED = [8, 16, 24, 32, 40, 48, 64, 64, 56, 48]
PREEMPTED = [0, 0, 0, 0, 0, 0, 2, 1, 0, 0]


def _begin(store: Store, run_id: str, info: dict, given: str, as_run: str) -> None:
    store.begin_run(
        run_id, scenario_name="busy", label="busy", matrix_combo=None, scenario_yaml=as_run,
        device="cuda:0", versions={}, started_ns=T0 - 1000 * MS, info=info,
    )  # fmt: skip
    store.update_run(run_id, scenario_given_yaml=given)


def _requests(store: Store, run_id: str, preemptions: list[int], cached: list[int]) -> None:
    n = len(preemptions)
    store.append(run_id, "requests", {
        "req_id": [f"r{i}" for i in range(n)], "arrival_ns": a(T0 + i * MS for i in range(n)),
        "first_token_ns": a(T0 + (10 + i) * MS for i in range(n)),
        "finish_ns": a(T0 + (100 + i) * MS for i in range(n)),
        "prompt_tokens": [50] * n, "output_tokens": [8] * n, "num_preemptions": preemptions,
        "finish_reason": ["stop"] * n, "cached_tokens": cached,
    })  # fmt: skip


def fill_busy_run(store: Store, run_id: str) -> None:
    info = {"num_kv_blocks": 64, "num_graphs": 4, "graph_keys_replayed": 1,
            "unused_capture_s": 1.5, "unused_graph_bytes": 3 * 2**20, "capture_s": 2.0}  # fmt: skip
    _begin(store, run_id, info, GIVEN, AS_RUN)
    steps = range(10)
    store.append(run_id, "steps", {
        "step": a(steps), "cpu_start_ns": a(T0 + 20 * s * MS for s in steps),
        "cpu_end_ns": a(T0 + 20 * (s + 1) * MS for s in steps),
        "bubble_ns": a(HOST_BOUND.get(s, 0) for s in steps),
        "bubble_kind": ["host_bound" if s in HOST_BOUND else "other" for s in steps],
        "starved_ns": a(MS if s == 8 else 0 for s in steps),
        "perturbed": [s == 9 for s in steps],
        "kv_used_blocks": KV_USED, "num_preempted": PREEMPTED,
        "num_waiting": [0, 0, 0, 0, 0, 0, 2, 3, 1, 0], "num_running": [4] * 10,
    })  # fmt: skip
    rows = []
    for s in steps:
        t = T0 + 20 * s * MS
        prepare = 3 * MS if s in (2, 5) else MS // 2
        for name, dur in (("schedule", MS), ("prepare", prepare), ("forward", MS),
                          ("output_wait", 10 * MS), ("update", MS)):  # fmt: skip
            rows.append((s, name, t, t + dur))
            t += dur
    store.append(run_id, "spans", {
        "step": a(r[0] for r in rows), "track": ["cpu"] * len(rows),
        "name": [r[1] for r in rows], "start_ns": a(r[2] for r in rows),
        "end_ns": a(r[3] for r in rows),
    })  # fmt: skip
    syncs = [(s, "implicit", SITE_A) for s in range(10)] + [(3, "implicit", SITE_B),
             (4, "implicit", SITE_B)] + [(s, "output_wait", None) for s in steps]  # fmt: skip
    store.append(run_id, "syncs", {
        "step": a(r[0] for r in syncs), "t_ns": a(T0 + r[0] * 20 * MS for r in syncs),
        "kind": [r[1] for r in syncs], "site": [r[2] for r in syncs],
        "blocked_ns": a(MS for _ in syncs),
    })  # fmt: skip
    modes = ["full"] * 6 + ["piecewise"] * 3 + ["none"]
    reasons = ["uniform decode, 4 → 4"] * 6 + ["mixed prefill/decode batch"] * 3
    reasons += ["num_tokens 600 > largest capture size 8"]
    store.append(run_id, "graph_dispatch", {
        "step": a(steps), "num_tokens": [4] * 10, "padded_tokens": [4] * 10,
        "requested_mode": ["full_and_piecewise"] * 10, "mode": modes,
        "hit": [m != "none" for m in modes], "reason": reasons,
    })  # fmt: skip
    store.append(run_id, "graph_captures", {
        "key": ["full:1", "full:2", "full:4", "piecewise:8"],
        "mode": ["full", "full", "full", "piecewise"], "num_tokens": [1, 2, 4, 8],
        "capture_s": [0.5, 0.5, 0.5, 0.5], "mem_bytes": a([2**20] * 4),
    })  # fmt: skip
    _requests(store, run_id, [1, 2, 0, 0], [50, 0, 0, 0])
    store.finish_run(run_id, "completed", ended_ns=T0 + 300 * MS)


# ---- the quiet run: a CPU-like run that gives no rule anything to say ---------------------------
# 4 steps with no GPU timeline, eager by request, no implicit syncs, 10 of 64 KV blocks at most,
# no preemptions, no prefix hits and no shared prefix, nothing perturbed, run as asked.
QUIET = "name: quiet\nrunner: {kernels: torch, cudagraph_mode: none, num_kv_blocks: auto}\n"


def fill_quiet_run(store: Store, run_id: str) -> None:
    as_run = QUIET.replace("auto", "64")
    _begin(store, run_id, {"num_kv_blocks": 64, "num_graphs": 0}, QUIET, as_run)
    store.append(run_id, "steps", {
        "step": a(range(4)), "cpu_start_ns": a(T0 + s * MS for s in range(4)),
        "cpu_end_ns": a(T0 + (s + 1) * MS for s in range(4)),
        "kv_used_blocks": [4, 8, 10, 10], "num_preempted": [0] * 4,
        "perturbed": [False] * 4,
    })  # fmt: skip
    store.append(run_id, "graph_dispatch", {
        "step": a(range(4)), "num_tokens": [4] * 4, "padded_tokens": [4] * 4,
        "requested_mode": ["none"] * 4, "mode": ["none"] * 4, "hit": [False] * 4,
        "reason": ["mode none requested"] * 4,
    })  # fmt: skip
    store.append(run_id, "syncs", {
        "step": a(range(4)), "t_ns": a(T0 + s * MS for s in range(4)),
        "kind": ["output_wait"] * 4, "site": [None] * 4, "blocked_ns": a([MS] * 4),
    })  # fmt: skip
    _requests(store, run_id, [0, 0], [0, 0])
    store.finish_run(run_id, "completed", ended_ns=T0 + 10 * MS)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        fill_busy_run(store, "b00001")
        fill_quiet_run(store, "a00001")
    return path


def _by_rule(db: Path, run_id: str) -> dict:
    with Store.open(db, read_only=True) as store:
        return {f.rule: f for f in run_findings(store, run_id)}


def test_the_busy_run_fires_every_rule_with_its_number(db):
    found = _by_rule(db, "b00001")
    assert found["host_bound"].text == (
        "host-bound: the GPU waited for the host in 44 % of steps (bubbles 7.0 ms, mostly prepare)"
    )
    assert found["host_bound"].weight == pytest.approx(4 / 9)
    assert found["implicit_syncs"].text == (
        f"1.2 implicit syncs per step (11 in 9 steps), most at {SITE_A} (9)"
    )
    assert found["graph_fallback"].text == (
        "40 % of steps (4 of 10) fell back from FULL: most to PIECEWISE "
        "(mixed prefill/decode batch)"
    )
    assert found["unused_graphs"].text == (
        "3 of 4 captured graph keys were never replayed (1.5 s of start-up, 3.0 MiB of graph pool)"
    )
    assert found["kv_pressure"].text == (
        "KV cache full at step 6: 3 preemptions (peak 64 of 64 blocks in use)"
    )
    assert found["kv_pressure"].weight == pytest.approx(3 / 4)
    assert found["prefix_cache"].text == "prefix cache: 25 % of prompt tokens hit (50 of 200)"
    assert found["perturbed"].text == (
        "1 step perturbed by the kernel trace, left out of overlap, bubbles, syncs and ITL"
    )
    assert found["downgraded"].text == (
        "2 settings did not run as asked: kernels triton→torch, uva true→false"
    )
    assert "not_completed" not in found  # the run completed
    assert all(f.where for f in found.values())


def test_findings_are_ranked_by_severity_then_share(db):
    with Store.open(db, read_only=True) as store:
        ranked = [f.rule for f in run_findings(store, "b00001")]
    # severity 2: implicit min(1, 11/9) = 1, kv 3/4, host-bound 4/9; severity 1: unused 3/4,
    # downgraded 2/4, fallback 4/10; severity 0: prefix 1/4, perturbed 1/10
    assert ranked == [
        "implicit_syncs", "kv_pressure", "host_bound", "unused_graphs", "downgraded",
        "graph_fallback", "prefix_cache", "perturbed",
    ]  # fmt: skip


def test_no_rule_fires_on_the_quiet_run(db):
    assert _by_rule(db, "a00001") == {}


def test_the_facts_of_the_busy_run(db):
    with Store.open(db, read_only=True) as store:
        f = finding_facts(store, "b00001")
        with_perturbed = finding_facts(store, "b00001", include_perturbed=True)
    assert (f.considered_steps, f.timed_steps, f.host_bound_steps) == (9, 9, 4)
    assert f.host_phase_ms == pytest.approx(
        {"schedule": 4.0, "prepare": 7.0, "forward": 4.0, "update": 4.0}
    )
    assert f.implicit_sites == [(SITE_A, 9), (SITE_B, 2)]
    assert (f.first_preemption_step, f.peak_kv_blocks, f.peak_kv_step) == (6, 64, 6)
    assert f.peak_waiting == 3
    # step 9 counted: 5 of 10 host-bound, SITE_A 10 times
    assert (with_perturbed.host_bound_steps, with_perturbed.timed_steps) == (5, 10)
    assert with_perturbed.implicit_sites[0] == (SITE_A, 10)


# ---- each rule at its edge, on hand-made facts --------------------------------------------------


@pytest.fixture
def quiet(db):
    with Store.open(db, read_only=True) as store:
        return run_summary(store, "a00001"), finding_facts(store, "a00001")


def _fired(summary, facts) -> set[str]:
    return {f.rule for f in findings(summary, facts)}


def test_host_bound_needs_a_tenth_of_the_timed_steps(quiet):
    s, f = quiet
    s = dataclasses.replace(s, host_bound_bubble_ms=2.0, bubble_ms=5.0)
    # 1 of 11 = 9.1 %: below the 10 % line; 2 of 20 = 10 %: on it
    assert "host_bound" not in _fired(s, dataclasses.replace(f, timed_steps=11, host_bound_steps=1))
    on = findings(s, dataclasses.replace(f, timed_steps=20, host_bound_steps=2))
    assert [x.text for x in on] == [
        "host-bound: the GPU waited for the host in 10 % of steps (bubbles 2.0 ms)"
    ]


def test_kv_pressure_without_preemptions_needs_95_percent_of_the_blocks(quiet):
    s, f = quiet  # 64 blocks
    assert _fired(s, dataclasses.replace(f, peak_kv_blocks=60, peak_kv_step=3)) == set()  # 93.75 %
    (found,) = findings(s, dataclasses.replace(f, peak_kv_blocks=61, peak_kv_step=3))  # 95.3 %
    assert (found.rule, found.severity) == ("kv_pressure", 1)
    assert found.text == (
        "KV cache 95 % full at step 3, no preemptions (peak 61 of 64 blocks in use)"
    )


def test_prefix_cache_speaks_at_zero_hits_only_when_the_workload_shares_a_prefix(quiet):
    s, f = quiet
    shared = {"workload": {"shared_prefix": {"len": 32}},
              "runner": {"enable_prefix_caching": False}}  # fmt: skip
    (found,) = findings(s, dataclasses.replace(f, scenario_as_run=shared))
    assert found.text == (
        "prefix cache: 0 % of prompt tokens hit although the workload shares a prefix "
        "(runner.enable_prefix_caching is off)"
    )
    assert _fired(s, dataclasses.replace(f, scenario_as_run={"workload": {}})) == set()


def test_graph_fallback_against_the_best_mode_captured(quiet):
    s, f = quiet
    dispatches = [("piecewise", "mixed prefill/decode batch", 3), ("none", "too big", 1)]
    # only piecewise captured: piecewise steps are its best, the one eager step fell back
    (found,) = findings(
        s, dataclasses.replace(f, captured_modes=("piecewise",), dispatches=dispatches)
    )
    assert found.text == "25 % of steps (1 of 4) fell back from PIECEWISE: most to eager (too big)"
    # nothing captured (eager by request or on a CPU): no fallback to speak of
    assert _fired(s, dataclasses.replace(f, dispatches=dispatches)) == set()


def test_unused_graphs_and_implicit_syncs_stay_quiet_at_zero(quiet):
    s, f = quiet
    s_all_used = dataclasses.replace(s, info={**s.info, "num_graphs": 4, "graph_keys_replayed": 4})
    assert _fired(s_all_used, f) == set()
    assert _fired(s, dataclasses.replace(f, implicit_sites=[])) == set()


def test_a_failed_run_leads(quiet):
    s, f = quiet
    failed = dataclasses.replace(s, status="failed", error="CUDA out of memory")
    found = findings(failed, dataclasses.replace(f, implicit_sites=[(SITE_A, 8)]))
    assert [x.rule for x in found] == ["not_completed", "implicit_syncs"]
    assert found[0].text == "the run failed (CUDA out of memory): 2 of 2 requests completed"


def test_every_rule_is_a_pure_function_of_summary_and_facts(quiet):
    s, _ = quiet
    for rule in RULES:  # an empty run: nothing to say
        assert rule(dataclasses.replace(s, steps=0), FindingFacts()) is None


def test_downgrades_compare_what_was_asked_with_what_ran():
    given = {
        "runner": {"device": "auto", "kernels": "triton", "uva": True, "num_kv_blocks": "auto",
                   "cudagraph_capture_sizes": [1, 2], "cudagraph_mode": "full"},
        "probes": {"cuda_events": True, "nvml_hz": 10.0},
    }  # fmt: skip
    ran = {
        "runner": {"device": "cpu", "kernels": "torch", "uva": False, "num_kv_blocks": 512,
                   "cudagraph_capture_sizes": [1], "cudagraph_mode": "none"},
        "probes": {"cuda_events": False, "nvml_hz": 10.0},
    }  # fmt: skip
    assert [d.short for d in downgrades(given, ran)] == [
        "kernels triton→torch",
        "uva true→false",
        "cudagraph_mode full→none",
        "cuda_events true→false",
    ]  # fmt: skip  (device auto and the block count were resolved, not downgraded)
    assert [d.key for d in runner_downgrades(given, ran)] == [
        "runner.kernels", "runner.uva", "runner.cudagraph_mode",
    ]  # fmt: skip
    assert downgrades(given, given) == []


# ---- show and the report open with them ---------------------------------------------------------


def test_show_opens_with_the_ranked_findings(db):
    from typer.testing import CliRunner

    from mrv2_prof.cli import app

    result = CliRunner().invoke(app, ["show", "b00001", "--db", str(db)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "findings"
    assert lines[1] == f" 1. ! 1.2 implicit syncs per step (11 in 9 steps), most at {SITE_A} (9)"
    assert lines[2].strip() == "look at: report: Sync sites; syncs WHERE kind = 'implicit'"
    assert lines[3].startswith(" 2. ! KV cache full at step 6")
    assert result.output.index("findings") < result.output.index("status")
    quiet = CliRunner().invoke(app, ["show", "a00001", "--db", str(db)], env={"COLUMNS": "200"})
    assert quiet.output.splitlines()[0] == "findings: nothing stands out (no rule fired)"


def test_the_report_opens_with_the_ranked_findings(db):
    import re

    from mrv2_prof.report.html_report import render_run_report

    with Store.open(db, read_only=True) as store:
        page = render_run_report(store, "b00001")
        quiet = render_run_report(store, "a00001")
    assert page.index('<ol id="findings">') < page.index("<table>")
    rules = re.findall(r'<li class="finding sev-\d" data-rule="([a-z_]+)">', page)
    assert rules[:3] == ["implicit_syncs", "kv_pressure", "host_bound"]
    assert len(rules) == 8
    assert "KV cache full at step 6: 3 preemptions" in page
    assert '<p id="findings">Nothing stands out: no rule fired.</p>' in quiet


def test_show_json_carries_the_ranked_findings(db):
    import json

    from typer.testing import CliRunner

    from mrv2_prof.cli import app

    result = CliRunner().invoke(app, ["show", "b00001", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [f["rule"] for f in data["findings"]][:3] == [
        "implicit_syncs", "kv_pressure", "host_bound",
    ]  # fmt: skip
    assert data["findings"][1]["text"].startswith("KV cache full at step 6: 3 preemptions")
    assert data["num_preemptions"] == 3  # the summary's own fields stay as they were


# ---- host contention (mrv2_prof.analysis.host_contention: the rules) ----------------------
# 2 cores, torch 2 threads, 1 runner process: the run's own threads R = 2 + 1 (the parent) = 3.
#   start: load 3.00 read 1.2 s in: the run added at most 3 (1 - e^(-1.2/60)) = 0.0594 -> 2.94
#   end:   load 3.20 read 4.8 s in: 3 (1 - e^(-4.8/60)) = 0.2307 -> 2.97
#   busy: 2.97 >= 0.75 x 2 = 1.5; oversubscribed: 2 threads + 2.97 >= 2 cores + 1
#   steal: (1010 - 1000) / (100400 - 100000) = 2.5 %
LOADED_ENV = {
    "cpu_count": 2, "cpu_affinity": 2, "torch_threads": 2, "runner_processes": 1,
    "load_avg_start": [3.0, 2.5, 2.0], "load_avg_start_after_s": 1.2,
    "load_avg_end": [3.2, 2.6, 2.0], "load_avg_end_after_s": 4.8,
    "cpu_steal_ticks_start": [1000, 100000], "cpu_steal_ticks_end": [1010, 100400],
}  # fmt: skip


def test_a_loaded_host_is_a_finding_that_names_the_fix(quiet):
    s, f = quiet
    (found,) = findings(dataclasses.replace(s, environment=LOADED_ENV), f)
    assert (found.rule, found.severity) == ("host_contention", 2)
    assert found.text == (
        "host contended: load 2.97 beyond the run at the end on 2 cores (≥ 0.75 × cores); "
        "2 runner threads + load 2.97 on 2 usable cores; steal 2.5 % of CPU time; the step "
        "times measure the host's other work too: run on a quiet host, or give the runner "
        "fewer threads (OMP_NUM_THREADS=1 on a small host)"
    )


def test_a_quiet_host_and_the_runs_own_load_are_no_finding(quiet):
    s, f = quiet
    # start 0.30 at 1.2 s -> 0.24; end 2.50 after a 60 s run: 3 (1 - e^-1) = 1.90 its own -> 0.60
    # busy: 0.60 < 1.5; oversubscribed: 2 + 0.60 = 2.60 < 3; steal 0 %
    quiet_env = dict(
        LOADED_ENV, load_avg_start=[0.3, 0.2, 0.1], load_avg_end=[2.5, 1.0, 0.4],
        load_avg_end_after_s=60.0, cpu_steal_ticks_end=[1000, 112000],
    )  # fmt: skip
    assert _fired(dataclasses.replace(s, environment=quiet_env), f) == set()
    assert _fired(dataclasses.replace(s, environment=None), f) == set()  # not recorded
