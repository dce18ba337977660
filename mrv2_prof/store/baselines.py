"""Named baselines: ``baselines`` rows mapping a name to a run or a group of repeats.

A CI job keeps one database: ``mrv2-prof baseline set main latest`` names the run (or
``group:ID``, the repeats of one combination) that later gates compare against
(``--baseline baseline:main``). Setting a name again moves it; removing it leaves the runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from mrv2_prof.store.db import Store
from mrv2_prof.store.opening import StoreError

RUN, GROUP = "run", "group"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,99}")


@dataclass(frozen=True)
class Baseline:
    name: str
    kind: str  # run | group
    target: str  # a run id or a run_group
    set_at: datetime | None


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise StoreError(
            f"baseline name {name!r}: letters, digits and _ . - / (up to 100, a letter or "
            "digit first)"
        )
    return name


def set_baseline(store: Store, name: str, kind: str, target: str) -> None:
    """Name ``target`` (a run id or a run_group; ``kind`` says which) ``name``, replacing it."""
    check_name(name)
    con = store.connection
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM baselines WHERE name = ?", [name])
        con.execute(
            "INSERT INTO baselines (name, kind, target, set_at) VALUES (?, ?, ?, localtimestamp)",
            [name, kind, target],
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def list_baselines(store: Store) -> list[Baseline]:
    rows = store.connection.execute(
        "SELECT name, kind, target, set_at FROM baselines ORDER BY name"
    ).fetchall()
    return [Baseline(*row) for row in rows]


def get_baseline(store: Store, name: str) -> Baseline:
    row = store.connection.execute(
        "SELECT name, kind, target, set_at FROM baselines WHERE name = ?", [name]
    ).fetchone()
    if row is None:
        known = ", ".join(b.name for b in list_baselines(store)) or "none yet"
        raise StoreError(
            f"no baseline {name!r} in {store.path} (known: {known}); "
            f"set one with mrv2-prof baseline set {name} RUN --db {store.path}"
        )
    return Baseline(*row)


def remove_baseline(store: Store, name: str) -> None:
    get_baseline(store, name)  # a one-line error naming the known ones when it is not there
    store.connection.execute("DELETE FROM baselines WHERE name = ?", [name])
