"""The commands that turn a stored run into something to look at: ``report`` (HTML),
``export`` (Perfetto trace), ``tui`` (the run browser) and ``nsys import`` (an Nsight Systems
capture's kernels, by step and phase)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from mrv2_prof.cli.console import db_b_option, db_option, fail, out
from mrv2_prof.cli.help_text import Command
from mrv2_prof.cli.output_file import OutputError, check_output, write_output
from mrv2_prof.inputs.input_file import InputError, check_regular_file
from mrv2_prof.store import Store, StoreError
from mrv2_prof.views.safe_text import plain


def report(
    run_refs: list[str] = typer.Argument(
        ...,
        metavar="RUN...",
        help="A run id, a unique prefix, 'latest', group:ID (its repeats) or baseline:NAME; "
        "several runs make a sweep comparison.",
    ),
    output: Path = typer.Option(
        None,
        "-o",
        "--output",
        help="HTML file to write (default: <run_id>.report.html, sweep-<first_id>.report.html).",
        show_default=False,
    ),
    db: Path = db_option(),
    db_b: Path = db_b_option(
        "DuckDB file of the last RUN (as compare's --db-b): a comparison across two files."
    ),
    sweep: bool = typer.Option(
        False, "--sweep", help="Compare every run of the sweep (matrix) that RUN belongs to."
    ),
    window: str = typer.Option(
        None,
        "--window",
        metavar="A:B",
        help="Steps A..B-1 get phase detail on the timeline (A included, B excluded, as "
        "export --steps; either end may be left out, negatives count from the end). Default: "
        "all steps up to 2,000, else 2,000 around the slowest step.",
        show_default=False,
    ),
) -> None:
    """Write one self-contained HTML report (works offline) of a run, or compare several runs.

    One run: step timeline (CPU and GPU lanes), overlap, bubbles, sync sites, graph modes and
    capture cost, staged writes, latency CDFs, NVML series and the scenario. Several runs (or
    --sweep): the headline metrics of each run side by side.

    Example:  mrv2-prof report latest -o report.html --db runs.duckdb
    """
    from mrv2_prof.analysis.sweep_runs import sweep_members
    from mrv2_prof.report.html_report import render_run_report, render_sweep_report
    from mrv2_prof.report.trace_export import ExportError, parse_steps

    try:
        window_steps = None if window is None else parse_steps(window)
    except ExportError:
        fail(f"--window {window!r}: expected A:B (A included, B excluded), e.g. 100:300")
    detail_window = None
    if db_b is not None:
        if sweep or len(run_refs) < 2:
            fail("--db-b takes two or more RUNs (the last from --db-b) and no --sweep")
        _report_two_files(run_refs, db, db_b, output)
        return
    try:
        with Store.open(db, read_only=True) as store:
            run_ids = list(dict.fromkeys(_resolved(store, run_refs)))
            if window_steps is not None:
                detail_window = _window_of(store, run_ids[0], window, window_steps)
            if sweep:
                if len(run_ids) != 1:
                    fail("--sweep takes one RUN (a run of the sweep)")
                run_ids = sweep_members(store, run_ids[0])
            one = len(run_ids) == 1 and not sweep
            default = Path(
                f"{run_ids[0]}.report.html" if one else f"sweep-{run_ids[0]}.report.html"
            )
            path = output if output is not None else default
            check_output(path, [db], "report")  # before the work of rendering
            if one:
                html_text = render_run_report(store, run_ids[0], detail_window=detail_window)
            else:
                html_text = render_sweep_report(store, run_ids)
        write_output(path, [db], "report", lambda fp: fp.write(html_text))
    except (StoreError, OutputError) as exc:
        fail(str(exc))
    _print_written(path)


def _print_written(path: Path) -> None:
    """The written report's path and size, one line (a path from outside printed as text)."""
    from mrv2_prof.views.format import format_bytes

    out.print(
        f"{plain(path)} ({format_bytes(path.stat().st_size)})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _window_of(store: Store, run_id: str, text: str, steps: slice) -> tuple[int, int]:
    """The first and last step (inclusive) that ``--window`` selects; none is bad input."""
    ids = store.step_ids(run_id)
    chosen = ids[steps]
    if not len(chosen):
        have = f"{len(ids):,} steps ({ids[0]}..{ids[-1]})" if len(ids) else "no steps"
        fail(f"--window {text!r} selects no steps: run {run_id} has {have}")
    return int(chosen[0]), int(chosen[-1])


def _resolved(store: Store, refs: list[str]) -> list[str]:
    from mrv2_prof.store.run_refs import resolve_runs

    return [run_id for ref in refs for run_id in resolve_runs(store, ref).run_ids]


def _report_two_files(run_refs: list[str], db: Path, db_b: Path, output: Path | None) -> None:
    """The comparison page of runs in two databases: every RUN but the last from ``db``."""
    from mrv2_prof.report.html_report import render_sweep_page, sweep_parts

    try:
        with Store.open(db, read_only=True) as store:
            runs, yamls = sweep_parts(store, list(dict.fromkeys(_resolved(store, run_refs[:-1]))))
        with Store.open(db_b, read_only=True) as store:
            more = sweep_parts(store, _resolved(store, run_refs[-1:]))
        path = output if output is not None else Path(f"sweep-{runs[0].run_id}.report.html")
        check_output(path, [db, db_b], "report")
        html_text = render_sweep_page(runs + more[0], yamls + more[1])
        write_output(path, [db, db_b], "report", lambda fp: fp.write(html_text))
    except (StoreError, OutputError) as exc:
        fail(str(exc))
    _print_written(path)


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
    db: Path = db_option(),
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
    from mrv2_prof.views.format import format_bytes

    try:
        window = None if steps is None else parse_steps(steps)
        with Store.open(db, read_only=True) as store:
            run_id = store.resolve_run(run_ref)
            path = output if output is not None else Path(f"{run_id}.trace.json")
            result = write_output(
                path, [db], "trace", lambda fp: export_trace(store, run_id, fp, window)
            )
    except (StoreError, ExportError, OutputError) as exc:
        fail(str(exc))
    window_text = ""
    if window is not None:
        window_text = f", steps {result.first_step}..{result.last_step}"
    out.print(
        f"{plain(path)}: {result.num_events:,} events{window_text}, "
        f"{format_bytes(path.stat().st_size)} — open in https://ui.perfetto.dev",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def tui(
    db: Path = db_option(),
) -> None:
    """Browse the stored runs in a terminal UI: open a run's summary and step timeline, or
    mark two runs (c, then c on the other) to compare them side by side. ? lists the keys.

    Example:  mrv2-prof tui --db runs.duckdb
    """
    try:
        Store.open(db, read_only=True).close()
    except StoreError as exc:
        fail(str(exc))
    if not _on_a_terminal():
        fail(
            "tui needs a terminal (stdin and stdout must both be a TTY); without one, use "
            "`mrv2-prof runs`, `show` or `report`"
        )
    from mrv2_prof.tui.browser import BrowserApp

    BrowserApp(db).run()


def _on_a_terminal() -> bool:
    """Whether stdin and stdout are both a terminal: the full-screen browser needs one to draw
    on and read keys from (without it, it would start and never end)."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def nsys_main() -> None:
    """Nsight Systems captures of a run: import their kernels by step and phase."""


def nsys_import(
    run_id: str = typer.Argument(
        ..., metavar="RUN", help="A run id, a unique prefix of one, or 'latest'."
    ),
    report_sqlite: Path = typer.Argument(
        ..., metavar="REPORT_SQLITE", help="The capture exported to SQLite (rep.sqlite)."
    ),
    db: Path = db_option(),
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
    from mrv2_prof.analysis.nsys_import import NsysImportError, import_nsys, summary_lines

    if not db.is_file():
        fail(f"{db}: no such run database (pass --db with a file runs wrote)")
    try:
        check_regular_file(report_sqlite, "capture (SQLite export)")
    except InputError as exc:
        fail(str(exc))
    try:
        with Store.open(db) as store:
            result = import_nsys(store, run_id, report_sqlite)
    except (StoreError, NsysImportError) as exc:
        fail(str(exc))
    for line in summary_lines(result):
        out.print(plain(line), markup=False, highlight=False, soft_wrap=True)


nsys_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)
nsys_app.callback()(nsys_main)
nsys_app.command("import", cls=Command)(nsys_import)
