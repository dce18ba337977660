"""``mrv2-prof runs`` and ``mrv2-prof show``: the stored runs of a DuckDB file, printed."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mrv2_prof.analysis.summary import render_runs, render_summary
from mrv2_prof.cli.console import db_option, fail, out
from mrv2_prof.store import Store, StoreError


def runs(
    db: Path = db_option(),
) -> None:
    """List the runs stored in a DuckDB file, newest first.

    Example:  mrv2-prof runs --db runs.duckdb
    """
    from mrv2_prof.analysis.run_infos import run_infos
    from mrv2_prof.store.run_refs import runs_with_groups

    try:
        with Store.open(db, read_only=True) as store:  # a repeat's label names its group
            rows = runs_with_groups(store)
            infos = run_infos(store)
            for row in rows:  # the model column: its name, from the start-up facts
                row["info"] = infos.get(row["run_id"])
            out.print(render_runs(rows, str(db)))
    except StoreError as exc:
        fail(str(exc))


def show(
    run_id: str = typer.Argument(
        ..., metavar="RUN_ID", help="A run id, a unique prefix of one, or 'latest'."
    ),
    db: Path = db_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Print the summary of a stored run again.

    Example:  mrv2-prof show latest --db runs.duckdb
    """
    from dataclasses import asdict

    from mrv2_prof.analysis.metrics import run_summary

    try:
        with Store.open(db, read_only=True) as store:
            rid = store.resolve_run(run_id)
            if as_json:  # the summary's fields, and its findings (ranked) under "findings"
                from mrv2_prof.analysis.findings import run_findings

                summary = run_summary(store, rid)
                found = [asdict(f) for f in run_findings(store, rid, summary)]
                out.print_json(json.dumps({**asdict(summary), "findings": found}, default=str))
            else:
                out.print(render_summary(store, rid))
                _print_top_host_frames(store, rid)
    except StoreError as exc:
        fail(str(exc))


def _print_top_host_frames(store: Store, run_id: str) -> None:
    """The host sampler's top frames (self samples) while the run served, then where its
    start-up went (wall time per innermost frame of the package's code, with the stalls the
    sampler could not see into), when the run was sampled."""
    from mrv2_prof.analysis.host_samples import (
        STALL_PERIODS,
        startup_host_frames,
        startup_stalls,
        top_host_frames,
    )

    served = [
        f"  {t['share']:6.1%}  {t['self_samples']:6d}  {t['phase']:<9} {t['frame']}"
        for t in top_host_frames(store, run_id)
    ]
    start = [
        f"  {t['share']:6.1%}  {t['seconds']:6.2f} s  {t['samples']:6d}  {t['frame']}"
        for t in startup_host_frames(store, run_id)
    ]
    stalls = startup_stalls(store, run_id)
    startup_title = (
        "start-up host samples (before the first step), by the package's innermost frame: "
        "share and seconds of the sampled span, each sample standing for the time since the "
        "one before"
    )
    if stalls is not None:
        startup_title += (
            f" ({stalls['span_s']:.2f} s sampled; {stalls['stalled_s']:.2f} s of it in "
            f"{stalls['stalls']} stalls, intervals over {STALL_PERIODS}x the median: a C call "
            "held the GIL, and the sample after names the frame)"
        )
    for title, lines in (
        ("top host frames (self samples, probes.host_sampling_hz):", served),
        (startup_title, start),
    ):
        if lines:
            out.print(title, highlight=False, soft_wrap=True)
        for line in lines:
            out.print(line, markup=False, highlight=False, soft_wrap=True)
