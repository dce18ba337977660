"""``mrv2-prof baseline set|list|rm``: named baselines kept in the run database, so a CI job
gates against ``--baseline baseline:main`` with one file (``store.baselines``)."""

from __future__ import annotations

from pathlib import Path

import typer

from mrv2_prof.cli.console import db_option, fail, out
from mrv2_prof.store import Store, StoreError
from mrv2_prof.views.safe_text import plain

DB_OPTION = db_option()


def baseline_main() -> None:
    """Named baselines: a run or a group of repeats that gates compare against."""


def baseline_set(
    name: str = typer.Argument(..., metavar="NAME", help="The name, e.g. main."),
    target: str = typer.Argument(
        ...,
        metavar="RUN_OR_GROUP",
        help="A run (id, unique prefix, 'latest') or group:ID (the repeats of one combination).",
    ),
    db: Path = DB_OPTION,
) -> None:
    """Name a run or a group NAME (setting NAME again moves it).

    Example:  mrv2-prof baseline set main group:3f2a1c --db runs.duckdb
    """
    from mrv2_prof.store.baselines import GROUP, RUN, check_name, set_baseline
    from mrv2_prof.store.run_refs import GROUP_PREFIX, resolve_runs

    if not Path(db).exists():
        fail(f"{db}: no such run database (pass --db with a file runs wrote)")
    try:
        check_name(name)
        with Store.open(db, read_only=True) as store:
            if target.startswith("baseline:"):
                fail(f"{target}: name a run or group:ID, not another baseline")
            resolved = resolve_runs(store, target)
        kind, what = (GROUP, resolved.group) if target.startswith(GROUP_PREFIX) else (RUN, None)
        what = what if kind == GROUP else resolved.run_ids[0]
        with Store.open(db) as store:
            set_baseline(store, name, kind, what)
    except StoreError as exc:
        fail(str(exc))
    runs = f"{len(resolved.run_ids)} runs" if kind == GROUP else "run"
    out.print(plain(f"baseline:{name} -> {kind} {what} ({runs})"), markup=False, highlight=False)


def baseline_list(db: Path = DB_OPTION) -> None:
    """The named baselines: name, run or group, and when it was set."""
    from mrv2_prof.store.baselines import list_baselines

    try:
        with Store.open(db, read_only=True) as store:
            rows = list_baselines(store)
    except StoreError as exc:
        fail(str(exc))
    if not rows:
        out.print(f"no baselines in {plain(str(db))}", markup=False, highlight=False)
    for b in rows:
        when = b.set_at.isoformat(sep=" ", timespec="seconds") if b.set_at else "?"
        line = f"baseline:{b.name}  {b.kind} {b.target}  set {when}"
        out.print(plain(line), markup=False, highlight=False)


def baseline_rm(
    name: str = typer.Argument(..., metavar="NAME", help="The baseline to remove (runs stay)."),
    db: Path = DB_OPTION,
) -> None:
    """Remove baseline NAME; its runs are kept."""
    from mrv2_prof.store.baselines import remove_baseline

    if not Path(db).exists():
        fail(f"{db}: no such run database (pass --db with a file runs wrote)")
    try:
        with Store.open(db) as store:
            remove_baseline(store, name)
    except StoreError as exc:
        fail(str(exc))
    out.print(plain(f"removed baseline:{name}"), markup=False, highlight=False)


baseline_app = typer.Typer(no_args_is_help=True)
baseline_app.callback()(baseline_main)
baseline_app.command("set")(baseline_set)
baseline_app.command("list")(baseline_list)
baseline_app.command("rm")(baseline_rm)
