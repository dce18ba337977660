"""``mrv2-prof compare``: two stored runs or groups of repeats, metric by metric (``gate``:
cli/gate.py). Shared with ``gate``: the run warnings and the ``--format`` option."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mrv2_prof.cli.console import db_b_option, db_option, fail, out
from mrv2_prof.store import StoreError

FORMATS = ("table", "markdown", "json")
FORMAT_HELP = "table (default), markdown (a GitHub table for a pull request) or json."
REF_HELP = "a run (id, unique prefix, 'latest'), group:ID (its repeats) or baseline:NAME"


def run_warnings(a, b) -> list[str]:
    """What makes two runs' numbers hard to compare (their environments differ), and the
    perturbed steps each one's figures leave out."""
    from mrv2_prof.views.environment import environment_differences

    lines = [
        f"warning: the runs differ in {d}"
        for d in environment_differences(a.environment or {}, b.environment or {})
    ]
    for run in (a, b):
        if run.perturbed_steps:
            lines.append(
                f"note: run {run.run_id}: {run.perturbed_steps} perturbed steps (traced or "
                "capturing) left out of overlap, bubbles, syncs and ITL"
            )
    return lines


def print_warnings(lines: list[str]) -> None:
    for line in lines:
        style = "yellow" if line.startswith("warning") else None
        out.print(line, style=style, markup=False, highlight=False, soft_wrap=True)


def chosen_format(fmt: str | None, as_json: bool) -> str:
    """``--format``, with ``--json`` as the older spelling of ``--format json``."""
    if fmt is not None and fmt not in FORMATS:
        fail(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if as_json and fmt not in (None, "json"):
        fail(f"--json and --format {fmt} ask for two formats; give one")
    return "json" if as_json else (fmt or "table")


def print_text(text: str) -> None:
    out.print(text, markup=False, highlight=False, soft_wrap=True, end="")


def compare(
    run_a: str = typer.Argument(..., metavar="RUN_A", help=f"The reference: {REF_HELP}."),
    run_b: str = typer.Argument(..., metavar="RUN_B", help="What is compared against RUN_A."),
    db: Path = db_option("DuckDB file of RUN_A (and RUN_B)."),
    db_b: Path = db_b_option("DuckDB file of RUN_B (default: --db)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    fmt: str = typer.Option(None, "--format", help=FORMAT_HELP, show_default=False),
) -> None:
    """Two runs (or groups of repeats) side by side: each gate metric, B - A,
    better or worse, and a verdict from the samples.

    Metrics: TTFT/TPOT/ITL p50/p95/p99, request and token throughput, peak
    GPU memory, overlap, host-bound bubble time, sync count, graph hit rate,
    capture and start-up time, errors, aborts, preemptions, KV-cache usage
    peak, runner CPU use, speculative decoding's mean acceptance length and
    draft time share (names and units: mrv2-prof gate --help). '-' marks a
    metric the run did not measure (GPU-only metrics on a CPU run).

    The verdict (better, worse, within noise, inconclusive) comes from a
    percentile bootstrap (95% interval, 2% noise floor): over the runs when a
    side is a group (mrv2-prof run --repeats N); over the requests' TTFT and
    TPOT and the inter-token gaps when one run a side is all there is, and
    then better/worse only with 3+ distinct values a side (requests served
    in one step are one sample), an interval of non-zero width wholly past
    the floor and a change larger than the runs' interquartile range; else
    inconclusive (1 run a side). Before
    comparing, the scenario as run, model, device, torch, GPU, driver, clocks
    and host are checked; what differs is listed.

    Example:  mrv2-prof compare baseline:main group:3f2a1c --format markdown
    """
    from mrv2_prof.analysis.run_sides import load_sides
    from mrv2_prof.report.ab_json import compare_document
    from mrv2_prof.report.ab_markdown import compare_markdown
    from mrv2_prof.report.comparability import check
    from mrv2_prof.report.compare import compare_table
    from mrv2_prof.report.metric_stats import metric_stats

    form = chosen_format(fmt, as_json)
    db_b = db if db_b is None else db_b
    try:
        a, b = load_sides(db, run_a, db_b, run_b)
    except StoreError as exc:
        fail(str(exc))
    comp = check(a, b)
    stats = metric_stats(a, b)
    warnings = run_warnings(a.as_run(), b.as_run())
    if form == "json":
        out.print_json(json.dumps(compare_document(a, b, stats, comp, warnings)))
    elif form == "markdown":
        print_text(compare_markdown(a, b, stats, comp))
    else:
        out.print(compare_table(a.as_run(), b.as_run(), str(db), str(db_b), stats))
        print_warnings(warnings)
        print_warnings([f"differs: {d.describe()}" for d in comp.differences])
        print_warnings([f"not checked: {u}" for u in comp.unchecked])
