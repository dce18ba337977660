"""``mrv2-prof run``: validate a scenario (every matrix combination), run each in the runner
process under the live dashboard or a progress bar, and print the summaries."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import typer

from mrv2_prof import entry_messages
from mrv2_prof.analysis.summary import render_comparison, render_summary
from mrv2_prof.cli import metrics_port as metrics_option
from mrv2_prof.cli.console import checked_db, err, fail, out
from mrv2_prof.cli.preflight import preflight
from mrv2_prof.cli.repeats import repeated
from mrv2_prof.cli.run_checks import heartbeat_seconds, refuse_a_flag_value
from mrv2_prof.pipeline.executors.cells import CellRun, Executor, ExecutorError
from mrv2_prof.pipeline.job import RunJob
from mrv2_prof.pipeline.lifetime import exit_code
from mrv2_prof.pipeline.resume import memo_key, resume_plan
from mrv2_prof.scenario import (
    Scenario,
    ScenarioError,
    expand_matrix,
    load_quickstart,
    load_scenario,
    scenario_yaml,
)
from mrv2_prof.store import Store, StoreError
from mrv2_prof.views.safe_text import markup_safe

DB_HELP = "DuckDB file holding the runs (default: the scenario's store.db, else runs.duckdb)."


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


def run(
    scenario_file: Path = typer.Argument(
        None,
        metavar="SCENARIO",
        help="Scenario YAML. Default: the embedded CPU-safe quickstart (tiny model, 16 requests), "
        "which takes --set and --strict as a file does.",
        show_default=False,
    ),
    db: Path = typer.Option(
        None, "--db", callback=checked_db, readable=False, help=DB_HELP, show_default=False
    ),
    overrides: list[str] = typer.Option(
        [],
        "--set",
        metavar="KEY=VALUE",
        help="Override a scenario key (repeatable), e.g. --set runner.async_scheduling=false.",
    ),
    headless: bool = typer.Option(
        False,
        "--headless",
        help="A progress bar instead of the live dashboard (implied w/o a TTY). A flag: it "
        "takes no value.",
    ),
    heartbeat: str = typer.Option(
        "10",
        "--heartbeat",
        metavar="SECONDS",
        help="When the output is not a terminal (CI logs, a file): a progress line every "
        "SECONDS (requests done, output tokens, tok/s over the run so far, ETA); 0: none.",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Anything the runner cannot honour is an error, not a note."
    ),
    repeats: int = typer.Option(
        None,
        "--repeats",
        metavar="N",
        help="Run each combination N times, interleaved (A B A B), each combination's runs one "
        "group (compare/gate group:ID). Default: the scenario's repeats (1).",
        show_default=False,
    ),
    executor_name: str = typer.Option(
        "local",
        "--executor",
        metavar="local|ray",
        help="Where the cells run: local (this host) or ray (tasks on a Ray cluster; "
        "pip install 'mrv2-prof[ray]').",
    ),
    max_parallel: int = typer.Option(
        None,
        "--max-parallel",
        metavar="N",
        help="Cells at once: local, up to N, one device id (GPU) each; ray, at most N tasks "
        "out. Default: local 1, ray every cell.",
        show_default=False,
    ),
    ray_address: str = typer.Option(
        None,
        "--ray-address",
        metavar="ADDR",
        help="The Ray cluster (--executor ray). Default: RAY_ADDRESS, else auto.",
        show_default=False,
    ),
    stage_dir: Path = typer.Option(
        None,
        "--stage-dir",
        metavar="DIR",
        help="A directory shared by the Ray workers and this host, for run files too large to "
        "return through Ray's object store (--executor ray).",
        show_default=False,
    ),
    metrics_port: int = typer.Option(
        None,
        "--metrics-port",
        metavar="PORT",
        min=1,
        max=65535,
        help=metrics_option.PORT_HELP,
        show_default=False,
    ),
    metrics_linger: float = typer.Option(
        0.0,
        "--metrics-linger",
        metavar="SECONDS",
        min=0,
        max=metrics_option.LINGER_MAX_S,
        help=metrics_option.LINGER_HELP,
        show_default=False,
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Skip each cell (combination and repeat) that already has a completed run in the "
        "database of the same scenario, code version, GPU model, driver and torch; a failed or "
        "stopped one runs again.",
    ),
) -> None:
    """Run a scenario (every combination of its matrix) and store it in DuckDB.

    The runner works in its own process; this one shows a live dashboard (q stops the run and
    keeps the data) or, with --headless, a progress bar; without a terminal, a progress line
    every --heartbeat seconds. Each run ends with a summary table (a stopped run's: partial);
    query it later with `mrv2-prof runs` and `mrv2-prof show`.

    Example:  mrv2-prof run scenarios/decode_heavy.yaml --set workload.num_requests=64 --db a.duckdb
    """
    if threading.current_thread() is threading.main_thread():  # until a run is live (then the
        signal.signal(signal.SIGINT, _exit_interrupted)  # launcher's handler takes over)
    from mrv2_prof.runner.config import ConfigError
    from mrv2_prof.runner.model import CheckpointError

    refuse_a_flag_value(scenario_file)
    heartbeat_s = heartbeat_seconds(heartbeat)
    metrics_option.serve_metrics(metrics_port, metrics_linger)  # bound before anything is written
    sets = list(overrides) + (["runner.strict=true"] if strict else [])
    try:
        if scenario_file is None:
            base = load_quickstart(sets)
        else:
            base = load_scenario(scenario_file, sets)
        # (label, (as given, as the runner takes it: max_model_len auto resolved))
        combos = [(label, (given, preflight(given))) for label, given in expand_matrix(base)]
        times = base.repeats if repeats is None else repeats
        runs = repeated(combos, times, base.source)
    except (ScenarioError, ConfigError, CheckpointError) as exc:
        fail(str(exc))
    db_path = db if db is not None else checked_db(Path(base.store.db))
    executor = _executor(
        executor_name, max_parallel, ray_address, stage_dir, combos, headless, heartbeat_s
    )
    try:
        with Store.open(db_path) as store:  # the one writable open before the runs: it upgrades
            _say_what_opening_did(store)
    except StoreError as exc:
        fail(str(exc))
    # every cell's memo key is stored, so a sweep run without --resume can be resumed later
    keys = [memo_key(s.model_dump(mode="json"), index) for _, (_, s), _, index in runs]
    skipped: list = []  # --resume: the cells skipped, with their completed runs
    if resume:
        runs, keys, skipped = _cells_not_done(db_path, runs, keys, executor)
        if not runs:
            return

    live = not headless and sys.stdout.isatty() and sys.stdin.isatty()
    cells: dict[int, CellRun] = {}  # the landed cells by index, in the order they landed
    unstored: list[str] = []  # runs left in their side files (the database refused the merge)

    spawned: list[int] = []  # the jobs made so far

    def make_job(index: int) -> RunJob:
        label, (given, scenario), group, repeat_index = runs[index]
        data, given_yaml = (
            scenario.model_dump(mode="json"),
            scenario_yaml(given.model_dump(mode="json")),
        )
        combo = _combo(base, scenario)
        # the first local runner only: a Ray worker's clock is not this machine's
        first = not spawned and executor_name == "local"
        command_at = entry_messages.command_started_at if first else None
        spawned.append(index)  # later jobs' spawns wait on earlier runs, not on the command
        return RunJob(
            data, given_yaml, label, combo, str(db_path), group, repeat_index, given.notes,
            known_peaks=_known_peaks(db_path), memo_key=keys[index], command_at=command_at,
        )  # fmt: skip

    def landed(cell: CellRun) -> bool:
        """One cell's run is in the database (or in its side file): its summary and errors;
        False stops the sweep."""
        cells[cell.index] = cell
        outcome = cell.outcome
        kept = _kept_in_side_file(db_path, outcome.run_id)
        if kept is not None:  # the run is whole in its side file, not in the database
            unstored.append(outcome.run_id)
        if outcome.run_id is not None and _ran_steps(db_path, outcome.run_id):
            # (a run that failed at start-up has no steps); the notes the headless start line
            # printed are printed once
            shown = () if live or not cell.facts else tuple(cell.facts.get("notes", ()))
            _print_summary(db_path, outcome.run_id, shown)
        if outcome.exit_code == 2:  # before its row existed (the database could not be opened)
            fail(outcome.error or "bad input")
        if outcome.error and outcome.status == "failed":
            text = markup_safe(outcome.error)
            err.print(f"[bold red]run failed:[/] {text}", highlight=False, soft_wrap=True)
        if kept is not None:
            err.print(f"[bold red]error:[/] {markup_safe(kept)}", highlight=False, soft_wrap=True)
        elif cell.store_error:
            err.print(f"note: {cell.store_error}", markup=False, highlight=False, soft_wrap=True)
        return not (cell.interrupted or outcome.status == "aborted")

    stopped_by = executor.run(len(runs), make_job, landed)  # the sweep: every cell lands here
    outcomes = [cells[i].outcome for i in sorted(cells)]
    stored = [o.run_id for o in outcomes if o.run_id and o.run_id not in unstored]
    if len(outcomes) > 1 and stored:
        try:
            with Store.open(db_path, read_only=True) as store:
                out.print(render_comparison(store, stored))
        except StoreError as exc:
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
    _print_groups(skipped + [(runs[i], cells[i].outcome) for i in sorted(cells)])
    if stopped_by is not None:  # Ctrl-C, SIGTERM, SIGHUP: 130, 143, 129
        raise typer.Exit(exit_code(stopped_by))
    last = outcomes[-1]
    if last.status == "aborted" and last.exit_code > 128:  # a signal to the runner itself
        raise typer.Exit(last.exit_code)
    if unstored or any(o.status == "failed" for o in outcomes):
        raise typer.Exit(1)


def _print_groups(landed) -> None:
    """With repeats, each combination's group, to compare or gate as group:ID; ``landed``:
    (run, outcome) of each cell that ran, in the sweep's order."""
    groups: dict[str, tuple[str, int]] = {}
    for (label, _, group, _), outcome in landed:
        if group is not None and outcome.run_id is not None:
            groups[group] = (label, groups.get(group, (label, 0))[1] + 1)
    for group, (label, n) in groups.items():
        out.print(f"group:{group}  {n} runs  {label}", markup=False, highlight=False)


def _executor(
    name, max_parallel, ray_address, stage_dir, combos, headless, heartbeat_s
) -> Executor:
    """The executor of ``--executor`` and its options, refused in one line (exit 2) before
    anything is written."""
    from mrv2_prof.pipeline.executors.choice import choose_executor

    live = not headless and sys.stdout.isatty() and sys.stdin.isatty()
    try:
        return choose_executor(
            name,
            max_parallel=max_parallel,
            ray_address=ray_address,
            stage_dir=stage_dir,
            gpu=any(str(s.runner.device).startswith("cuda") for _, (_, s) in combos),
            launch=lambda job: _launch(job, live, heartbeat_s),
            console=err,
        )
    except ExecutorError as exc:
        fail(str(exc))


def _exit_interrupted(signum, frame) -> None:
    """Ctrl-C before or after the runs: nothing is being written; exit 130, no traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # once: more while it exits change nothing
    metrics_option.stop_lingering()  # a signal ends --metrics-linger too
    err.print("interrupted", markup=False, highlight=False)
    raise typer.Exit(exit_code(signal.SIGINT))


def _say_what_opening_did(store: Store) -> None:
    """A schema upgrade, and runs found orphaned, are told (the file changed)."""
    from mrv2_prof.store import SCHEMA_VERSION

    if store.upgraded_from is not None:
        err.print(
            f"{store.path}: run database upgraded from schema version {store.upgraded_from} "
            f"to {SCHEMA_VERSION} (columns added, nothing rewritten)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for run_id in store.orphans_failed:
        err.print(
            f"{store.path}: run {run_id} was left running by a process that is gone; marked failed",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _launch(job, live: bool, heartbeat_s: float):
    from mrv2_prof.pipeline.launcher import run_dashboard, run_headless
    from mrv2_prof.store.opening import disk_full

    try:
        return run_dashboard(job) if live else run_headless(job, err, heartbeat_s)
    except OSError as exc:  # the runner could not be started: no run row exists
        full = disk_full(Path("a temporary file"), exc)
        if full is None:
            raise
        fail(f"cannot start the runner process: {full}")


def _kept_in_side_file(db_path: Path, run_id: str | None) -> str | None:
    """Why run ``run_id`` is still in its side file and not in the database (the disk refused
    its merge), once more tried now; None when it is in the database."""
    from mrv2_prof.store.live_runs import live_file

    if run_id is None or not live_file(db_path, run_id).exists():
        return None
    try:
        Store.merge_ended_runs(db_path)
    except StoreError as exc:
        cause = str(exc)
    else:
        if not live_file(db_path, run_id).exists():
            return None
        cause = "its side file could not be merged"
    side = live_file(db_path, run_id)
    return (
        f"run {run_id} did not reach {db_path}: {cause}. The run is kept in {side}; the next "
        f"writable open of {db_path} merges it once the database can be written (the next "
        f"mrv2-prof run --db {db_path}, or mrv2-prof baseline set/rm)"
    )


def _cells_not_done(db_path: Path, runs: list, keys: list[str], executor) -> tuple:
    """``--resume``: the cells without a completed run of their memo key (on Ray: under any
    node's class), their keys, the skipped cells, and the line saying how many were skipped."""
    try:
        plan = resume_plan(db_path, runs, getattr(executor, "node_classes", None))
    except StoreError as exc:
        fail(str(exc))
    if plan.line is not None:
        out.print(plan.line, markup=False, highlight=False, soft_wrap=True)
    return plan.runs, [keys[i] for i in plan.kept], plan.skipped


def _known_peaks(db_path: Path) -> dict[str, list]:
    """The database's measured HBM bandwidths by GPU UUID (a run on a known GPU skips the
    measurement); none when the file cannot be read now."""
    from mrv2_prof.analysis.roofline import measured_peaks

    try:
        with Store.open(db_path, read_only=True) as store:
            return measured_peaks(store)
    except StoreError:
        return {}


def _ran_steps(db_path: Path, run_id: str) -> bool:
    """Whether the run took a step (else its summary is only zeros); True if it cannot tell."""
    try:
        with Store.open(db_path, read_only=True) as store:
            return store.num_steps(run_id) > 0
    except StoreError:
        return True  # the summary then says what is wrong with the file


def _print_summary(db_path: Path, run_id: str, shown_notes: tuple[str, ...] = ()) -> None:
    try:
        with Store.open(db_path, read_only=True) as store:
            out.print(render_summary(store, run_id, shown_notes))
    except StoreError as exc:
        fail(str(exc))
