"""``mrv2-prof compare`` and ``mrv2-prof gate``: two stored runs, metric by metric."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mrv2_prof.cli.console import checked_db, fail, out
from mrv2_prof.store import StoreError
from mrv2_prof.views.safe_text import plain


def run_warnings(a, b) -> list[str]:
    """What makes two runs' numbers hard to compare (their environments differ), and the
    perturbed steps each one's figures leave out."""
    from mrv2_prof.run_environment import environment_differences

    lines = [
        f"warning: the runs differ in {d}"
        for d in environment_differences(a.environment or {}, b.environment or {})
    ]
    for run in (a, b):
        if run.perturbed_steps:
            lines.append(
                f"note: run {run.run_id}: {run.perturbed_steps} perturbed steps (kernel trace) "
                "left out of overlap, bubbles, syncs and ITL"
            )
    return lines


def _print_warnings(lines: list[str]) -> None:
    for line in lines:
        style = "yellow" if line.startswith("warning") else None
        out.print(line, style=style, markup=False, highlight=False, soft_wrap=True)


def compare(
    run_a: str = typer.Argument(
        ..., metavar="RUN_A", help="The reference run: an id, a unique prefix, or 'latest'."
    ),
    run_b: str = typer.Argument(..., metavar="RUN_B", help="The run compared against RUN_A."),
    db: Path = typer.Option(
        Path("runs.duckdb"),
        "--db",
        callback=checked_db,
        readable=False,
        help="DuckDB file of RUN_A (and RUN_B).",
    ),
    db_b: Path = typer.Option(
        None,
        "--db-b",
        callback=checked_db,
        readable=False,
        help="DuckDB file of RUN_B (default: --db).",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Two runs side by side: each gate metric, B - A, better or worse.

    Metrics: TTFT/TPOT/ITL p50/p95/p99, request and token throughput, peak
    GPU memory, overlap, host-bound bubble time, sync count, graph hit rate,
    capture and start-up time, errors, aborts, preemptions, speculative
    decoding's mean acceptance length and draft time share (names and units:
    mrv2-prof gate --help). '-' marks a metric the run did not measure
    (GPU-only metrics on a CPU run).

    Example:  mrv2-prof compare 3f2a1c latest --db runs.duckdb
    """
    from mrv2_prof.report.compare import compare_json, compare_table, load_runs

    db_b = db if db_b is None else db_b
    try:
        a, b = load_runs(db, run_a, db_b, run_b)
    except StoreError as exc:
        fail(str(exc))
    warnings = run_warnings(a, b)
    if as_json:
        data = compare_json(a, b, str(db), str(db_b))
        out.print_json(json.dumps({**data, "warnings": warnings}))
    else:
        out.print(compare_table(a, b, str(db), str(db_b)))
        _print_warnings(warnings)


def gate(
    baseline: str = typer.Option(
        ..., "--baseline", metavar="RUN", help="Baseline run: an id, a unique prefix, or 'latest'."
    ),
    candidate: str = typer.Option(..., "--candidate", metavar="RUN", help="Candidate run."),
    db: Path = typer.Option(
        Path("runs.duckdb"),
        "--db",
        callback=checked_db,
        readable=False,
        help="DuckDB file of both runs.",
    ),
    db_b: Path = typer.Option(
        None,
        "--db-b",
        callback=checked_db,
        readable=False,
        help="DuckDB file of the candidate (default: --db).",
        show_default=False,
    ),
    max_regression: list[str] = typer.Option(
        [],
        "--max-regression",
        metavar="METRIC=THRESHOLD",
        help="How far METRIC may worsen, e.g. p99_itl=5% or sync_count=+10 (repeatable; "
        "overrides --thresholds).",
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
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Exit 1 when the candidate regresses past a threshold (for CI).

    Prints a table, a line per failing metric, e.g.
      FAIL p99_itl: 12.40 ms -> 13.90 ms (+12.1% > 5%)
    and a verdict, e.g.  gate: FAIL (1 of 17 metrics).
    Exit codes: 0 pass, 1 fail, 2 bad input (unknown run or metric,
    malformed threshold or thresholds file).

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
    overlap         fraction, down      graph_hit_rate  fraction, down
    host_bound_bubble_ms  ms, up        sync_count      count, up
    mean_acceptance_length  tokens, down  draft_time_share  fraction, up

    With no --thresholds and no --max-regression the defaults apply: the
    deployment gate of the MRV2 migration guide (its metrics; the numbers
    are ours). Given thresholds replace the defaults. A metric not measured
    in a run fails when asked for; a default metric measured in neither run
    (GPU memory on a CPU run) is skipped; --allow-missing skips them all.

    A thresholds file is YAML, one  metric: threshold  a line, e.g.
      p99_itl: 5%
      sync_count: +10

    Example:
      mrv2-prof gate --baseline 3f2a1c --candidate latest \\
        --thresholds gate.yaml --max-regression p99_itl=5%
    """
    from mrv2_prof.report.compare import load_runs
    from mrv2_prof.report.gate import (
        GateError,
        default_thresholds,
        evaluate,
        gate_json,
        gate_lines,
        gate_table,
        load_thresholds,
        parse_flags,
        passed,
    )

    try:
        chosen = load_thresholds(thresholds) if thresholds is not None else {}
        chosen.update(parse_flags(max_regression))
    except GateError as exc:
        fail(str(exc))
    explicit = thresholds is not None or bool(max_regression)
    active = default_thresholds()
    if explicit:
        active = {name: t for name, t in chosen.items() if t is not None}
    if not active:
        fail("every threshold is off; nothing to gate")
    db_b = db if db_b is None else db_b
    try:
        base, cand = load_runs(db, baseline, db_b, candidate)
    except StoreError as exc:
        fail(str(exc))
    results = evaluate(active, base, cand, explicit=explicit, allow_missing=allow_missing)
    ok = passed(results)
    warnings = run_warnings(base, cand)
    if as_json:
        data = gate_json(results, base, cand, str(db), str(db_b))
        out.print_json(json.dumps({**data, "warnings": warnings}))
    else:
        out.print(gate_table(results, base, cand, str(db), str(db_b)))
        _print_warnings(warnings)
        for line, style in gate_lines(results):
            out.print(plain(line), style=style, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(0 if ok else 1)
