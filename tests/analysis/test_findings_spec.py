"""The speculative-decoding findings on hand-built runs: speculation that costs more than it saves
(measured from the verify and plain decode steps, or from dynamic k's decisions when too few
plain steps ran) and requests that sat out because drafting is on the host. Each number is
worked out in the comments; each rule is also shown staying quiet."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mrv2_prof.analysis.finding_facts import SpecStepFacts, finding_facts
from mrv2_prof.analysis.findings import findings, run_findings
from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.store import Store

MS = 1_000_000
T0 = 9_000_000_000_000
ASYNC = "name: spec\nrunner: {async_scheduling: true}\n"
SYNC = "name: spec\nrunner: {async_scheduling: false}\n"
REMEDY = "lower k, set dynamic_k, or turn speculation off"


# ---- the runs ------------------------------------------------------------------------------------
# Steps in order, each's host span its duration:
#   `plain` plain decode steps of 10 ms (k 0, no slots, no verifies read);
#   10 verify steps of `verify_ms` (k 2, 4 slots, two verifies read: 0 and 1 of 2 drafts accepted
#     -> 1 + 2 tokens for 2 verifies = 1.5 tokens per verify), with dynamic k's `decisions`
#     (expected tokens, cost ratio) on each, or none;
#   and three steps every rule leaves out, each 100 ms: a verify step with a prefill chunk (its
#   verifies accept 2 and 2), the same perturbed (a kernel-trace window), and a plain step with a
#   prefill chunk.
# `sat_out`: requests that sat out, by step.


def fill_spec_run(
    store: Store,
    run_id: str,
    *,
    plain: int = 10,
    verify_ms: float = 20.0,
    decisions: tuple[float, float] | None = None,
    sat_out: dict[int, int] | None = None,
    scenario: str = ASYNC,
) -> None:
    store.begin_run(run_id, scenario_name="spec", label="spec", matrix_combo=None,
                    scenario_yaml=scenario, device="cpu", versions={},
                    started_ns=T0)  # fmt: skip
    kinds = ["plain"] * plain + ["verify"] * 10 + ["verify_prefill", "verify_perturbed"]
    kinds += ["plain_prefill"]
    durations = {"plain": 10.0, "verify": verify_ms}
    rows, t, verifies = [], T0, []
    for step, kind in enumerate(kinds):
        end = t + round(durations.get(kind, 100.0) * MS)
        verify = kind.startswith("verify")
        decided = decisions if kind == "verify" else None
        rows.append({
            "step": step, "cpu_start_ns": t, "cpu_end_ns": end,
            "num_prefill_tokens": 64 if kind.endswith("prefill") else 0,
            "perturbed": kind == "verify_perturbed", "spec_k": 2 if verify else 0,
            "spec_reserved": 4 if verify else 0, "spec_sat_out": (sat_out or {}).get(step, 0),
            "spec_expected_tokens": decided[0] if decided else None,
            "spec_cost_ratio": decided[1] if decided else None,
        })  # fmt: skip
        if verify:
            accepted = (0, 1) if kind == "verify" else (2, 2)
            verifies += [(step, f"r{j}", 2, a) for j, a in enumerate(accepted)]
        t = end
    store.append(run_id, "steps", {name: [r[name] for r in rows] for name in rows[0]})
    names = ("step", "req_id", "num_draft_tokens", "num_accepted_tokens")
    columns = {n: [v[i] for v in verifies] for i, n in enumerate(names)}
    store.append(run_id, "spec_verifies", columns)
    store.finish_run(run_id, "completed", ended_ns=t)


RUNS = {
    # 1.5 tokens per verify, 20 / 10 = 2.00x the plain step: 0.75 < 1, fires
    "costly": {},
    # 12 / 10 = 1.20x: 1.5 / 1.2 = 1.25, pays; and dynamic k's own estimates would not count
    "paying": {"verify_ms": 12.0, "decisions": (1.2, 2.0)},
    # dynamic k says pays (3 tokens at 1.5x) but the measured steps say not: the measure wins
    "measured_wins": {"decisions": (3.0, 1.5)},
    # 7 plain steps, too few: the decisions over the 10 verify steps, 1.2 / 1.5 = 0.8, fire
    "decided_costly": {"plain": 7, "decisions": (1.2, 1.5)},
    # the same, 1.8 / 1.5 = 1.2: pays
    "decided_paying": {"plain": 7, "decisions": (1.8, 1.5)},
    # too few plain steps and no decisions: nothing to say
    "undecided": {"plain": 7},
    # requests sat out in steps 3, 12 and 22 (2, 1, 4: 7 request-steps; step 22 is the plain
    # prefill step, 21 the perturbed one); speculation pays here
    "sat_out": {"verify_ms": 12.0, "sat_out": {3: 2, 12: 1, 22: 4, 21: 5}},
    # one step, sync scheduling: a sit-out there is no drafting on the host in the way
    "sat_out_once": {"verify_ms": 12.0, "sat_out": {3: 2}},
    "sat_out_sync": {"verify_ms": 12.0, "sat_out": {3: 2}, "scenario": SYNC},
}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "runs.duckdb"
    with Store.open(path) as store:
        for run_id, kwargs in RUNS.items():
            fill_spec_run(store, run_id, **kwargs)
    return path


def _by_rule(db: Path, run_id: str) -> dict:
    with Store.open(db, read_only=True) as store:
        return {f.rule: f for f in run_findings(store, run_id)}


# ---- the facts -----------------------------------------------------------------------------------


def test_the_step_classes_leave_out_prefill_and_perturbed_steps(db):
    with Store.open(db, read_only=True) as store:
        f = finding_facts(store, "costly").spec
        with_perturbed = finding_facts(store, "costly", include_perturbed=True).spec
    assert (f.verify_steps, f.plain_steps) == (10, 10)
    assert f.tokens_per_verify == pytest.approx(1.5)  # the prefill verify's 3 + 3 left out
    assert (f.verify_step_ms, f.plain_step_ms) == (pytest.approx(20.0), pytest.approx(10.0))
    assert f.decided_steps == 0 and f.mean_expected_tokens is None
    # the perturbed verify step counted: 11 steps, (10 x 20 + 100) / 11 ms, (30 + 3 + 3) / 22
    assert with_perturbed.verify_steps == 11
    assert with_perturbed.verify_step_ms == pytest.approx(300 / 11)
    assert with_perturbed.tokens_per_verify == pytest.approx(36 / 22)


def test_the_decisions_and_sit_outs(db):
    with Store.open(db, read_only=True) as store:
        decided = finding_facts(store, "decided_costly").spec
        sat = finding_facts(store, "sat_out").spec
    assert (decided.plain_steps, decided.decided_steps) == (7, 10)
    assert decided.mean_expected_tokens == pytest.approx(1.2)
    assert decided.mean_cost_ratio == pytest.approx(1.5)
    assert (sat.sat_out_steps, sat.sat_out_requests) == (3, 7)  # step 21 perturbed: left out


# ---- speculation costs more than it saves --------------------------------------------------------


def test_measured_speculation_that_costs_more_than_it_saves(db):
    found = _by_rule(db, "costly")["spec_costs_more"]
    assert found.text == (
        "speculation costs more than it saves: a verify step emits 1.50 tokens per request but "
        f"takes 2.00× a plain decode step (10 verify, 10 plain steps); {REMEDY}"
    )
    assert found.severity == 2
    assert found.weight == pytest.approx(10 / 22)  # 10 verify steps of 22 considered
    assert "runner.spec_decode.dynamic_k" in found.where
    assert _by_rule(db, "measured_wins")["spec_costs_more"].text == found.text


def test_speculation_that_pays_is_no_finding(db):
    assert "spec_costs_more" not in _by_rule(db, "paying")
    assert "spec_costs_more" not in _by_rule(db, "decided_paying")
    assert "spec_costs_more" not in _by_rule(db, "undecided")


def test_too_few_plain_steps_fall_back_on_dynamic_ks_decisions(db):
    found = _by_rule(db, "decided_costly")["spec_costs_more"]
    assert found.text == (
        "speculation costs more than it saves: dynamic k expects 1.20 tokens per verifying "
        f"request at 1.50× a plain decode step's time (mean of 10 decisions); {REMEDY}"
    )
    assert found.weight == pytest.approx(10 / 19)  # 7 plain, 10 verify, 2 prefill steps


@pytest.fixture(scope="module")
def costly(db):
    with Store.open(db, read_only=True) as store:
        return run_summary(store, "costly"), finding_facts(store, "costly")


def _costs_more(summary, facts, **spec) -> bool:
    facts = dataclasses.replace(facts, spec=dataclasses.replace(facts.spec, **spec))
    return any(f.rule == "spec_costs_more" for f in findings(summary, facts))


def test_costs_more_at_its_edges(costly):
    s, f = costly
    # 8 of each kind is enough, 7 verify steps is not (and the decisions are not asked then)
    assert _costs_more(s, f, verify_steps=8, plain_steps=8)
    assert not _costs_more(s, f, verify_steps=7, plain_steps=8, decided_steps=20,
                           mean_expected_tokens=1.0, mean_cost_ratio=2.0)  # fmt: skip
    # exactly 1 pays for itself: 1.5 tokens at 15 / 10 = 1.5x
    assert not _costs_more(s, f, verify_step_ms=15.0)
    assert _costs_more(s, f, verify_step_ms=15.1)
    # 8 decisions are enough, 7 are not
    few = {"plain_steps": 7, "mean_expected_tokens": 1.0, "mean_cost_ratio": 1.1}
    assert _costs_more(s, f, decided_steps=8, **few)
    assert not _costs_more(s, f, decided_steps=7, **few)
    # a run without verifies did not speculate: nothing to say whatever its steps
    assert not _costs_more(dataclasses.replace(s, spec_decode=None), f)


# ---- sit-outs ------------------------------------------------------------------------------------


def test_steps_where_requests_sat_out_because_drafting_is_on_the_host(db):
    found = _by_rule(db, "sat_out")["spec_sat_out"]
    assert found.text == (
        "3 steps had requests sit out because drafting is on the host (7 request-steps); "
        "set runner.spec_decode.draft_on: device"
    )
    assert (found.severity, found.weight) == (2, pytest.approx(3 / 22))
    assert "spec_costs_more" not in _by_rule(db, "sat_out")
    assert _by_rule(db, "sat_out_once")["spec_sat_out"].text.startswith(
        "1 step had requests sit out because drafting is on the host (2 request-steps)"
    )


def test_no_sit_out_finding_without_sit_outs_or_async_scheduling(db):
    assert "spec_sat_out" not in _by_rule(db, "sat_out_sync")
    assert "spec_sat_out" not in _by_rule(db, "paying")
    with Store.open(db, read_only=True) as store:
        s, f = run_summary(store, "paying"), finding_facts(store, "paying")
    one = dataclasses.replace(f, spec=SpecStepFacts(sat_out_steps=1, sat_out_requests=1))
    # one step is enough (the perturbed step is context: it is in every run here)
    assert [x.rule for x in findings(s, one)] == ["spec_sat_out", "perturbed"]
