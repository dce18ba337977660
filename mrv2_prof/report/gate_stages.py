"""The gate in the migration guide's order: static, output contract, then load.

Equivalence before performance: (a) *static*, no note on the candidate; (b) *output contract*,
the stored tokens and finish reasons of the same seeded workload and the runs' leak counters
(``report.output_contract``); (c) *load*, the metrics against their thresholds
(``report.gate``: one run a side; ``report.gate_groups``: groups of repeats). The gate stops at
the first stage that fails unless ``all_stages``; a stage not run is ``not run``. Exit status:
0 pass, 1 a stage failed (a regression), 3 the load stage is inconclusive and nothing failed.
A static stage failed by a note names the ``--allow-note`` value that accepts it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from mrv2_prof.analysis.gate_metrics import METRICS
from mrv2_prof.analysis.run_sides import Side
from mrv2_prof.report.comparability import Comparability
from mrv2_prof.report.gate import INCONCLUSIVE, GateResult, Threshold, evaluate, exit_status
from mrv2_prof.report.gate_groups import evaluate_groups
from mrv2_prof.report.gate_one_run import judge_one_run
from mrv2_prof.report.output_contract import (
    FAIL,
    PASS,
    StageResult,
    contract_stage,
    static_stage,
)
from mrv2_prof.store import Store

NOT_RUN = "not run"
STAGES = ("static", "output contract", "load")
OUTCOMES = {0: "pass", 1: "regression", 3: "inconclusive"}


@dataclass(frozen=True)
class GateOptions:
    thresholds: dict[str, Threshold]
    explicit: bool | frozenset[str]  # the metrics the user asked for (True: all)
    allow_missing: bool = False
    allow_notes: tuple[str, ...] = ()  # a note holding one of these passes the static stage
    allow_all_notes: bool = False
    all_stages: bool = False
    summary: str = ""  # how the thresholds were chosen (``report.gate_selection``)


@dataclass(frozen=True)
class GateReport:
    baseline: Side
    candidate: Side
    comparability: Comparability
    stages: list[StageResult]
    results: list[GateResult]  # the load stage's, empty when it did not run
    exit_code: int
    allow_flags: tuple[str, ...] = ()  # the --allow-note flags that accept the failing notes

    @property
    def outcome(self) -> str:
        return OUTCOMES[self.exit_code]


def load_stage(base: Side, cand: Side, options: GateOptions) -> tuple[StageResult, list]:
    if base.single and cand.single:
        results = evaluate(
            options.thresholds,
            base.runs[0],
            cand.runs[0],
            explicit=options.explicit,
            allow_missing=options.allow_missing,
        )
        results = [judge_one_run(r, base, cand) for r in results]
        how = (
            "1 run a side: thresholds on the two values; past its limit, a counted metric "
            "fails, a latency percentile fails when its requests' 95% interval is wholly past "
            "it (compare's one-run rule), any other is inconclusive (run --repeats 3 decides)"
        )
    else:
        results = evaluate_groups(
            options.thresholds,
            base,
            cand,
            explicit=options.explicit,
            allow_missing=options.allow_missing,
        )
        how = "groups: thresholds on the 95% bootstrap interval of the change of the medians"
    code = exit_status(results)
    status = {0: PASS, 1: FAIL, 3: INCONCLUSIVE}[code]
    lines = [how, *([options.summary] if options.summary else [])]
    for name in ("peak_kv_usage", "host_cpu_util"):  # shown even when not gated
        if name not in options.thresholds:
            m = METRICS[name]
            a, b = base.value(name), cand.value(name)
            lines.append(
                f"{name}: {m.format(a)} -> {m.format(b)} (not gated; --max-regression "
                f"{name}=5% gates it)"
            )
    return StageResult("load", status, lines), results


def allow_flags(base: Side, cand: Side, options: GateOptions) -> tuple[str, ...]:
    """``--allow-note TEXT`` for each candidate note the static stage fails (as
    ``static_stage`` decides: not on the baseline, not allowed), TEXT the whole note, quoted for
    a shell."""
    if options.allow_all_notes:
        return ()
    before = {note for facts in base.facts for note in facts.notes}
    failing = [
        note
        for facts in cand.facts
        for note in facts.notes
        if note not in before and not any(text in note for text in options.allow_notes)
    ]
    return tuple(f"--allow-note {shlex.quote(note)}" for note in dict.fromkeys(failing))


def run_gate(
    db_a: Path, db_b: Path, base: Side, cand: Side, comp: Comparability, options: GateOptions
) -> GateReport:
    stages = [
        static_stage(cand.facts, list(options.allow_notes), options.allow_all_notes, base.facts)
    ]
    results: list[GateResult] = []
    if stages[-1].status != FAIL or options.all_stages:
        with Store.open(db_a, read_only=True) as store_a:
            if Path(db_b).resolve() == Path(db_a).resolve():
                stages.append(contract_stage(store_a, base.facts[0], store_a, cand.facts))
            else:
                with Store.open(db_b, read_only=True) as store_b:
                    stages.append(contract_stage(store_a, base.facts[0], store_b, cand.facts))
    if stages[-1].status != FAIL or options.all_stages:
        stage, results = load_stage(base, cand, options)
        stages.append(stage)
    ran = {s.name for s in stages}
    stages += [StageResult(name, NOT_RUN, ["an earlier stage failed"]) for name in STAGES
               if name not in ran]  # fmt: skip
    statuses = [s.status for s in stages]
    code = 1 if FAIL in statuses else 3 if INCONCLUSIVE in statuses else 0
    flags = allow_flags(base, cand, options) if stages[0].status == FAIL else ()
    if flags:
        how = "accepted by: " + " ".join(flags) + " (or --allow-notes for every note)"
        stages[0] = StageResult(stages[0].name, stages[0].status, [*stages[0].lines, how])
    return GateReport(base, cand, comp, stages, results, code, flags)


def verdict_text(report: GateReport) -> str:
    """The gate's last line: ``gate: PASS (…)``, ``gate: FAIL (static stage)``, …"""
    from mrv2_prof.report.gate import verdict_line

    failed = [s.name for s in report.stages if s.status == FAIL and s.name != "load"]
    if not failed:
        return verdict_line(report.results)
    tail = ""
    if report.results:
        tail = "; load: " + verdict_line(report.results).removeprefix("gate: ")
    names = [f"{name} stage" for name in failed]
    if report.allow_flags:  # the static stage: a note the baseline lacks, and how to accept it
        them = "it" if len(report.allow_flags) == 1 else "them"
        names[0] += f": a new note; {' '.join(report.allow_flags)} accepts {them}"
    return f"gate: FAIL ({', '.join(names)}{tail})"
