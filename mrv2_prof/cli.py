"""The ``mrv2-prof`` command line. Bad input ends with one line on stderr and exit code 2.

Exit codes of ``run``: 0 every run completed (or was stopped with ``q``), 1 a run failed,
2 bad input (scenario, overrides, trace, checkpoint, database), 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from mrv2_prof.scenario import (
    Scenario,
    ScenarioError,
    expand_matrix,
    load_quickstart,
    load_scenario,
)
from mrv2_prof.store import Store, StoreError
from mrv2_prof.summary import render_comparison, render_runs, render_summary

app = typer.Typer(
    help="Profile an embedded vLLM Model Runner V2 style runner: run a scenario, watch it live, "
    "then query the run in DuckDB.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped or logged output is not cut to 80 columns (tables of a matrix sweep are wide).
_WIDTH = None if sys.stdout.isatty() else 140
err = Console(stderr=True, width=_WIDTH)
out = Console(width=_WIDTH)

NSYS_SESSION_ENV = "NSYS_PROFILING_SESSION_ID"  # set in processes Nsight Systems profiles
DB_HELP = "DuckDB file holding the runs (default: the scenario's store.db, else runs.duckdb)."


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(2)


@app.callback()
def main() -> None:
    """mrv2-prof: what each MRV2 mechanism buys on your GPU and workload."""


def _combo(base: Scenario, scenario: Scenario) -> dict[str, Any] | None:
    if not base.matrix:
        return None
    data = scenario.model_dump(mode="json")
    combo = {}
    for key in base.matrix:
        node: Any = data
        for part in key.split("."):
            node = node[part]
        combo[key] = node
    return combo


def _preflight(scenario: Scenario) -> None:
    """Checks that need the model's shape: done before anything is written."""
    from mrv2_prof.probes.support import cpu_probe_notes, unavailable_probe_notes
    from mrv2_prof.runner.config import ConfigError
    from mrv2_prof.runner.model.loader import model_args_for
    from mrv2_prof.workload import build_workload

    config = scenario.runner_config()
    if scenario.probes.kernel_trace and os.environ.get(NSYS_SESSION_ENV):
        raise ConfigError(
            "probes.kernel_trace: cannot run under Nsight Systems (CUPTI takes one subscriber); "
            "set probes.kernel_trace: false and use mrv2-prof nsys import for the kernels"
        )
    notes = unavailable_probe_notes(scenario.probes.model_dump())
    if scenario.runner.strict and config.resolve_device().type != "cuda":
        notes += cpu_probe_notes(scenario.probes.model_dump())
    if notes and scenario.runner.strict:
        raise ConfigError(f"{notes[0]} (strict: true)")
    if config.strict:
        from mrv2_prof.runner.worker.switches import check_strict

        check_strict(config)
    args = model_args_for(scenario.model_spec())
    build_workload(
        scenario.workload,
        seed=scenario.seed,
        vocab_size=args.vocab_size,
        max_model_len=scenario.runner.max_model_len,
        source=scenario._source,
    )


@app.command()
def run(
    scenario_file: Path = typer.Argument(
        None,
        metavar="SCENARIO",
        help="Scenario YAML. Default: the embedded CPU-safe quickstart (tiny model, 16 requests).",
        show_default=False,
    ),
    db: Path = typer.Option(None, "--db", help=DB_HELP, show_default=False),
    overrides: list[str] = typer.Option(
        [],
        "--set",
        metavar="KEY=VALUE",
        help="Override a scenario key (repeatable), e.g. --set runner.async_scheduling=false.",
    ),
    headless: bool = typer.Option(
        False,
        "--headless",
        help="A progress bar instead of the live dashboard (implied w/o a TTY).",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Anything the runner cannot honour is an error, not a note."
    ),
) -> None:
    """Run a scenario (every combination of its matrix) and store it in DuckDB.

    The runner works in its own process; this one shows a live dashboard (q stops the run and
    keeps the data) or, with --headless or without a terminal, a progress bar. Each run ends
    with a summary table; query it later with `mrv2-prof runs` and `mrv2-prof show`.

    Example:  mrv2-prof run scenarios/decode_heavy.yaml --set workload.num_requests=64 --db a.duckdb
    """
    from mrv2_prof.harness import RunJob, scenario_yaml
    from mrv2_prof.runner.config import ConfigError
    from mrv2_prof.runner.model import CheckpointError

    sets = list(overrides) + (["runner.strict=true"] if strict else [])
    try:
        if scenario_file is None:
            if sets:
                fail("--set needs a SCENARIO file (the embedded quickstart takes no overrides)")
            base = load_quickstart()
        else:
            base = load_scenario(scenario_file, sets)
        runs = expand_matrix(base)
        for _, scenario in runs:
            _preflight(scenario)
    except (ScenarioError, ConfigError, CheckpointError) as exc:
        fail(str(exc))
    db_path = db if db is not None else Path(base.store.db)
    try:
        Store.open(db_path).close()
    except StoreError as exc:
        fail(str(exc))

    live = not headless and sys.stdout.isatty() and sys.stdin.isatty()
    outcomes = []
    for label, scenario in runs:
        data = scenario.model_dump(mode="json")
        job = RunJob(data, scenario_yaml(data), label, _combo(base, scenario), str(db_path))
        runner = _launch(job, live)
        outcome = runner.outcome
        outcomes.append(outcome)
        if outcome.run_id is not None:
            _print_summary(db_path, outcome.run_id)
        if outcome.exit_code == 2:
            fail(outcome.error or "bad input")
        if outcome.error and outcome.status == "failed":
            err.print(f"[bold red]run failed:[/] {outcome.error}", highlight=False)
        if runner.interrupted or outcome.status == "aborted":
            break
    if len(outcomes) > 1:
        with Store.open(db_path, read_only=True) as store:
            out.print(render_comparison(store, [o.run_id for o in outcomes if o.run_id]))
    last = outcomes[-1]
    if last.status == "aborted" and last.error and "SIGINT" in last.error:
        raise typer.Exit(130)
    if any(o.status == "failed" for o in outcomes):
        raise typer.Exit(1)


def _launch(job, live: bool):
    from mrv2_prof.launcher import run_dashboard, run_headless

    return run_dashboard(job) if live else run_headless(job, err)


def _print_summary(db_path: Path, run_id: str) -> None:
    try:
        with Store.open(db_path, read_only=True) as store:
            out.print(render_summary(store, run_id))
    except StoreError as exc:
        fail(str(exc))


@app.command()
def runs(db: Path = typer.Option(Path("runs.duckdb"), "--db", help="DuckDB file.")) -> None:
    """List the runs stored in a DuckDB file, newest first.

    Example:  mrv2-prof runs --db runs.duckdb
    """
    try:
        with Store.open(db, read_only=True) as store:
            out.print(render_runs(store.list_runs(), str(db)))
    except StoreError as exc:
        fail(str(exc))


@app.command()
def show(
    run_id: str = typer.Argument(
        ..., metavar="RUN_ID", help="A run id, a unique prefix of one, or 'latest'."
    ),
    db: Path = typer.Option(Path("runs.duckdb"), "--db", help="DuckDB file."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Print the summary of a stored run again.

    Example:  mrv2-prof show latest --db runs.duckdb
    """
    from dataclasses import asdict

    from mrv2_prof.store.metrics import run_summary

    try:
        with Store.open(db, read_only=True) as store:
            rid = store.resolve_run(run_id)
            if as_json:
                out.print_json(json.dumps(asdict(run_summary(store, rid)), default=str))
            else:
                out.print(render_summary(store, rid))
    except StoreError as exc:
        fail(str(exc))


@app.command()
def compare(
    run_a: str = typer.Argument(
        ..., metavar="RUN_A", help="The reference run: an id, a unique prefix, or 'latest'."
    ),
    run_b: str = typer.Argument(..., metavar="RUN_B", help="The run compared against RUN_A."),
    db: Path = typer.Option(Path("runs.duckdb"), "--db", help="DuckDB file of RUN_A (and RUN_B)."),
    db_b: Path = typer.Option(
        None, "--db-b", help="DuckDB file of RUN_B (default: --db).", show_default=False
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Two runs side by side: each gate metric, B - A, better or worse.

    Metrics: TTFT/TPOT/ITL p50/p95/p99, request and token throughput, peak
    GPU memory, overlap, host-bound bubble time, sync count, graph hit rate,
    capture and start-up time, errors, aborts, preemptions (names and units:
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
    if as_json:
        out.print_json(json.dumps(compare_json(a, b, str(db), str(db_b))))
    else:
        out.print(compare_table(a, b, str(db), str(db_b)))


@app.command()
def gate(
    baseline: str = typer.Option(
        ..., "--baseline", metavar="RUN", help="Baseline run: an id, a unique prefix, or 'latest'."
    ),
    candidate: str = typer.Option(..., "--candidate", metavar="RUN", help="Candidate run."),
    db: Path = typer.Option(Path("runs.duckdb"), "--db", help="DuckDB file of both runs."),
    db_b: Path = typer.Option(
        None, "--db-b", help="DuckDB file of the candidate (default: --db).", show_default=False
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
    if as_json:
        out.print_json(json.dumps(gate_json(results, base, cand, str(db), str(db_b))))
    else:
        out.print(gate_table(results, base, cand, str(db), str(db_b)))
        for line, style in gate_lines(results):
            out.print(line, style=style, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(0 if ok else 1)


@app.command()
def report(
    run_refs: list[str] = typer.Argument(
        ...,
        metavar="RUN...",
        help="A run id, a unique prefix, or 'latest'; several runs make a sweep comparison.",
    ),
    output: Path = typer.Option(
        None,
        "-o",
        "--output",
        help="HTML file to write (default: <run_id>.report.html, sweep-<first_id>.report.html).",
        show_default=False,
    ),
    db: Path = typer.Option(Path("runs.duckdb"), "--db", help="DuckDB file."),
    sweep: bool = typer.Option(
        False, "--sweep", help="Compare every run of the sweep (matrix) that RUN belongs to."
    ),
    window: str = typer.Option(
        None,
        "--window",
        metavar="A:B",
        help="Steps A..B get phase detail on the timeline (default: all steps up to 2,000, else "
        "2,000 around the slowest step).",
        show_default=False,
    ),
) -> None:
    """Write one self-contained HTML report (works offline) of a run, or compare several runs.

    One run: step timeline (CPU and GPU lanes), overlap, bubbles, sync sites, graph modes and
    capture cost, staged writes, latency CDFs, NVML series and the scenario. Several runs (or
    --sweep): the headline metrics of each run side by side.

    Example:  mrv2-prof report latest -o report.html --db runs.duckdb
    """
    from mrv2_prof.report.html_report import render_run_report, render_sweep_report
    from mrv2_prof.report.sweep import sweep_members
    from mrv2_prof.tui.format import format_bytes

    detail_window = None
    if window is not None:
        lo, sep, hi = window.partition(":")
        if not (sep and lo.strip().isdigit() and hi.strip().isdigit() and int(lo) <= int(hi)):
            fail(f"--window {window!r}: expected A:B with step numbers A <= B, e.g. 100:300")
        detail_window = (int(lo), int(hi))
    try:
        with Store.open(db, read_only=True) as store:
            run_ids = list(dict.fromkeys(store.resolve_run(ref) for ref in run_refs))
            if sweep:
                if len(run_ids) != 1:
                    fail("--sweep takes one RUN (a run of the sweep)")
                run_ids = sweep_members(store, run_ids[0])
            if len(run_ids) == 1 and not sweep:
                html_text = render_run_report(store, run_ids[0], detail_window=detail_window)
                default = Path(f"{run_ids[0]}.report.html")
            else:
                html_text = render_sweep_report(store, run_ids)
                default = Path(f"sweep-{run_ids[0]}.report.html")
    except StoreError as exc:
        fail(str(exc))
    path = output if output is not None else default
    try:
        path.write_text(html_text, encoding="utf-8")
    except OSError as exc:
        fail(f"{path}: cannot write the report ({exc.strerror or exc})")
    out.print(f"{path} ({format_bytes(path.stat().st_size)})", highlight=False, soft_wrap=True)


@app.command()
def export(
    run_ref: str = typer.Argument(
        ..., metavar="RUN", help="A run id, a unique prefix of one, or 'latest'."
    ),
    output: Path = typer.Option(
        None,
        "-o",
        "--output",
        help="Trace file to write (default: <run_id>.trace.json).",
        show_default=False,
    ),
    steps: str = typer.Option(
        None,
        "--steps",
        metavar="A:B",
        help="Only steps A..B-1 (a python slice: B excluded, either end may be left out, "
        "negatives count from the end, e.g. -200: for the last 200 steps). Default: all.",
        show_default=False,
    ),
    db: Path = typer.Option(Path("runs.duckdb"), "--db", help="DuckDB file."),
) -> None:
    """Export a run as a Chrome/Perfetto trace (JSON): CPU phases, GPU spans, counters, flows.

    Open it at https://ui.perfetto.dev (Open trace file) or chrome://tracing. Range names and
    step payloads are the NVTX ranges' (domain mrv2), so a step is found by its payload in an
    Nsight Systems capture of the same run; to line the clocks up, find the NVTX mark
    'mrv2 run <id> perf_counter_ns=<t>' in nsys: the trace's otherData has origin_ns and the
    formula (perf_counter_ns = origin_ns + ts*1000).

    Example:  mrv2-prof export latest --steps 100:200 -o trace.json --db runs.duckdb
    """
    from mrv2_prof.report.trace_export import ExportError, export_trace, parse_steps
    from mrv2_prof.tui.format import format_bytes

    try:
        window = None if steps is None else parse_steps(steps)
        with Store.open(db, read_only=True) as store:
            run_id = store.resolve_run(run_ref)
            path = output if output is not None else Path(f"{run_id}.trace.json")
            partial = path.with_name(path.name + ".partial")
            try:
                with partial.open("w", encoding="utf-8") as fp:
                    result = export_trace(store, run_id, fp, window)
                partial.replace(path)
            finally:
                partial.unlink(missing_ok=True)
    except (StoreError, ExportError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{path}: cannot write the trace ({exc.strerror or exc})")
    window_text = ""
    if window is not None:
        window_text = f", steps {result.first_step}..{result.last_step}"
    out.print(
        f"{path}: {result.num_events:,} events{window_text}, "
        f"{format_bytes(path.stat().st_size)} — open in https://ui.perfetto.dev",
        highlight=False,
        soft_wrap=True,
    )


nsys_app = typer.Typer(no_args_is_help=True)
app.add_typer(nsys_app, name="nsys")


@nsys_app.callback()
def nsys_main() -> None:
    """Nsight Systems captures of a run: import their kernels by step and phase."""


@nsys_app.command("import")
def nsys_import(
    run_id: str = typer.Argument(
        ..., metavar="RUN", help="A run id, a unique prefix of one, or 'latest'."
    ),
    report_sqlite: Path = typer.Argument(
        ..., metavar="REPORT_SQLITE", help="The capture exported to SQLite (rep.sqlite)."
    ),
    db: Path = typer.Option(Path("runs.duckdb"), "--db", help="DuckDB file."),
) -> None:
    """Store the kernels of an Nsight Systems capture of a run, by step and phase.

    Capture the run, then export the capture to SQLite:
    nsys profile --trace=cuda,nvtx -o rep mrv2-prof run s.yaml --headless
    nsys export --type sqlite rep.nsys-rep   (nsys stats rep.nsys-rep writes rep.sqlite too).

    The capture's clock is aligned with the run's by the run-start NVTX mark (else by the step
    ranges); each kernel gets the step and phase of the innermost mrv2 NVTX range around its
    launch call (a CUDA graph replay: every kernel of the cudaGraphLaunch). The run's rows in
    the kernels table are replaced, so importing again gives the same table. Prints the kernels
    imported and attributed, the unattributed ones, the clock offset and the alignment residual.

    Example:  mrv2-prof nsys import latest rep.sqlite --db runs.duckdb
    """
    from mrv2_prof.report.nsys_import import NsysImportError, import_nsys, summary_lines

    if not db.is_file():
        fail(f"{db}: no such run database (pass --db with a file runs wrote)")
    try:
        with Store.open(db) as store:
            result = import_nsys(store, run_id, report_sqlite)
    except (StoreError, NsysImportError) as exc:
        fail(str(exc))
    for line in summary_lines(result):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command()
def tui(db: Path = typer.Option(Path("runs.duckdb"), "--db", help="DuckDB file.")) -> None:
    """Browse the stored runs in a terminal UI: open a run's summary and step timeline, or
    mark two runs (c, then c on the other) to compare them side by side. ? lists the keys.

    Example:  mrv2-prof tui --db runs.duckdb
    """
    try:
        Store.open(db, read_only=True).close()
    except StoreError as exc:
        fail(str(exc))
    from mrv2_prof.tui.browser import BrowserApp

    BrowserApp(db).run()
