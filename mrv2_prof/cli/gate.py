"""``mrv2-prof gate``: the migration gate for CI, stage by stage (``report.gate_stages``)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mrv2_prof.cli.compare import (
    FORMAT_HELP,
    REF_HELP,
    chosen_format,
    print_text,
    print_warnings,
    run_warnings,
)
from mrv2_prof.cli.console import db_b_option, db_option, fail, out
from mrv2_prof.store import StoreError
from mrv2_prof.views.safe_text import plain

_STATUS_STYLE = {"pass": "bold green", "FAIL": "bold red", "inconclusive": "bold yellow"}


def gate(
    baseline: str = typer.Option(..., "--baseline", metavar="RUN", help=f"Baseline: {REF_HELP}."),
    candidate: str = typer.Option(..., "--candidate", metavar="RUN", help="Candidate, the same."),
    db: Path = db_option("DuckDB file of both runs."),
    db_b: Path = db_b_option("DuckDB file of the candidate (default: --db)."),
    max_regression: list[str] = typer.Option(
        [],
        "--max-regression",
        metavar="METRIC=THRESHOLD",
        help="How far METRIC may worsen, e.g. p99_itl=5% or sync_count=+10 (repeatable; "
        "overrides --thresholds and METRIC's default; the other defaults stay).",
    ),
    only: list[str] = typer.Option(
        [],
        "--only",
        metavar="METRIC[,METRIC]",
        help="Gate these metrics alone, each with its given or default threshold (repeatable).",
    ),
    replace_defaults: bool = typer.Option(
        False,
        "--replace-defaults",
        help="Gate only the metrics of --thresholds and --max-regression, no default.",
    ),
    thresholds: Path = typer.Option(
        None,
        "--thresholds",
        metavar="FILE",
        help="YAML mapping of metric: threshold, e.g. 'p99_itl: 5%'.",
        show_default=False,
    ),
    allow_missing: bool = typer.Option(
        False, "--allow-missing", help="Skip a metric not measured in a run instead of failing."
    ),
    allow_different: bool = typer.Option(
        False,
        "--allow-different",
        help="Gate runs whose scenario, model, device, torch, GPU or host differ (listed).",
    ),
    allow_note: list[str] = typer.Option(
        [],
        "--allow-note",
        metavar="TEXT",
        help="A candidate note holding TEXT passes the static stage (repeatable).",
    ),
    allow_notes: bool = typer.Option(
        False, "--allow-notes", help="Every note on the candidate passes the static stage."
    ),
    all_stages: bool = typer.Option(
        False, "--all-stages", help="Run every stage, not stopping at the first that fails."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    fmt: str = typer.Option(None, "--format", help=FORMAT_HELP, show_default=False),
) -> None:
    """Exit 1 when the candidate fails a stage or regresses past a threshold (CI).

    Stages, in the MRV2 migration guide's order, each a section of the
    output; the gate stops at the first that fails unless --all-stages:
      static           a note on the candidate the baseline lacks (a fallback,
                       a switch it could not honour) fails, unless
                       --allow-note/-notes; one on both sides is reported
      output contract  same seeded workload: the same requests, finish
                       reasons and (greedy) token sequences, no request slot
                       or KV block left held; names the first difference
      load             the metrics below against their thresholds

    Exit codes: 0 pass, 1 fail, 2 bad input (unknown run or metric,
    malformed threshold, runs that are not comparable), 3 inconclusive
    (a group's interval straddles a threshold, under 3 runs a side, or one
    run a side that cannot tell a timed metric's crossing from noise).

    Prints, e.g.,  FAIL p99_itl: 12.40 ms -> 13.90 ms (+12.1% > 5%)  and a
    verdict, e.g.  gate: FAIL (1 of 18 metrics).  With one run a side a
    threshold is checked on the two values: within passes; past it, a
    count (errors, aborts, preemptions, syncs, ...) fails, a latency
    percentile fails only when its requests' 95% interval is wholly past
    the limit under compare's one-run rule, and any other timed metric
    (throughput, start-up, ...) is inconclusive. With a group on either
    side (group:ID, from mrv2-prof run --repeats N) on the 95% bootstrap
    interval of the change of the per-run medians: wholly within the limit
    passes, wholly past it fails, straddling it is inconclusive.

    Before gating, the scenario as run, model, device, torch/CUDA, GPU,
    driver, clocks and host are compared; a difference refuses (exit 2, one
    line naming it) unless --allow-different, which lists them.

    THRESHOLD is how far a metric may move the worse way: N% of the baseline
    value, or an amount in the metric's unit (+10, -0.05; the sign may be
    left out, and when written must point the worse way); 'off' drops a
    metric. A change exactly at the limit passes.

    Metrics (unit, the worse way), default thresholds in parentheses:
    p50_ttft p95_ttft p99_ttft  ms, up  (5%, 10%, 10%)  time to 1st token
    p50_tpot p95_tpot p99_tpot  ms, up  (5%, 10%, 10%)  time per out token
    p50_itl  p95_itl  p99_itl   ms, up  (5%, 10%, 10%)  inter-token latency
    req_throughput  req/s, down  (5%)   tok_throughput  tok/s, down  (5%)
    peak_gpu_mem    MiB, up      (5%)   startup_s       s, up        (20%)
    capture_s       s, up        (20%)  errors          count, up    (+0)
    aborts          count, up    (+0)   preemptions     count, up    (10%)
    compiles_after_warmup  count, up  (+0)  Triton compiles in a step
    overlap         fraction, down      graph_hit_rate  fraction, down
    host_bound_bubble_ms  ms, up        sync_count      count, up
    peak_kv_usage   fraction, up        host_cpu_util   cores, up
    mean_acceptance_length  tokens, down  draft_time_share  fraction, up
    spec_sat_out_steps  count, up         spec_reclaimed_share  fraction, up
    decode_roofline  fraction, down     joules_per_output_token  J, up

    The defaults apply: the deployment gate of the MRV2 migration guide
    (its metrics; the numbers are ours). --thresholds, then --max-regression
    replace a metric's default (or add a metric; 'off' drops it); the other
    defaults stay. --only METRIC,... gates those metrics alone;
    --replace-defaults gates only the metrics given. A metric not measured
    in a run fails when asked for; a default metric measured in neither run
    (GPU memory on a CPU run) is skipped; --allow-missing skips them all.

    A thresholds file is YAML, one  metric: threshold  a line, e.g.
      p99_itl: 5%
      sync_count: +10

    Example:
      mrv2-prof gate --baseline baseline:main --candidate group:3f2a1c \\
        --thresholds gate.yaml --max-regression p99_itl=5% --format markdown
    """
    from mrv2_prof.analysis.run_sides import load_sides
    from mrv2_prof.report.ab_json import gate_document
    from mrv2_prof.report.ab_markdown import gate_markdown
    from mrv2_prof.report.comparability import check
    from mrv2_prof.report.gate import GateError, load_thresholds, parse_flags
    from mrv2_prof.report.gate_selection import parse_only, select
    from mrv2_prof.report.gate_stages import GateOptions, run_gate, verdict_text

    form = chosen_format(fmt, as_json)
    try:
        chosen = load_thresholds(thresholds) if thresholds is not None else {}
        chosen.update(parse_flags(max_regression))
        selection = select(chosen, only=parse_only(only), replace_defaults=replace_defaults)
    except GateError as exc:
        fail(str(exc))
    db_b = db if db_b is None else db_b
    try:
        base, cand = load_sides(db, baseline, db_b, candidate)
        comp = check(base, cand)
        if comp.blocking and not allow_different:
            fail(comp.refusal())
        options = GateOptions(
            selection.thresholds,
            selection.asked,
            allow_missing,
            tuple(allow_note),
            allow_notes,
            all_stages,
            selection.summary,
        )
        report = run_gate(db, db_b, base, cand, comp, options)
    except StoreError as exc:
        fail(str(exc))
    verdict = verdict_text(report)
    warnings = run_warnings(base.as_run(), cand.as_run())
    if form == "json":
        data = gate_document(report, verdict, report.exit_code == 0, warnings)
        out.print_json(json.dumps(data))
    elif form == "markdown":
        print_text(gate_markdown(report, verdict))
    else:
        _print_table(report, verdict, warnings, str(db), str(db_b))
    raise typer.Exit(report.exit_code)


def _say(line: str, style: str | None = None) -> None:
    out.print(plain(line), style=style, markup=False, highlight=False, soft_wrap=True)


def _print_table(report, verdict: str, warnings: list[str], db: str, db_b: str) -> None:
    from mrv2_prof.report.gate import PASS, gate_table

    for stage in report.stages:
        _say(f"== {stage.name}: {stage.status} ==", _STATUS_STYLE.get(stage.status, "dim"))
        for line in stage.lines:
            _say(f"  {line}")
        if stage.name == "load" and report.results:
            base, cand = report.baseline.as_run(), report.candidate.as_run()
            out.print(gate_table(report.results, base, cand, db, db_b))
    print_warnings(warnings)
    for d in report.comparability.differences:
        _say(f"differs: {d.describe()}", "yellow")
    for line in report.comparability.unchecked:
        _say(f"not checked: {line}")
    for r in report.results:
        if r.status != PASS:
            _say(r.message, _STATUS_STYLE.get(r.status, "dim"))
    _say(verdict, _STATUS_STYLE.get("pass" if report.exit_code == 0 else "FAIL"))
