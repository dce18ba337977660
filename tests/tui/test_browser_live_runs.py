"""The run browser over a database that a live run is writing into, and over side files that
outlived their runner: every run in the database gets its figures, the live run is shown live,
and a side file that cannot be read is that one row's reason, never the whole list's.

Expected figures of ``aaa111``/``bbb222``/``ccc333`` are worked out in the ``runs_db`` fixture's
docstring (tests/tui/conftest.py).
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable
from tui_helpers import text, wait_for

from mrv2_prof.store import Store
from mrv2_prof.store.live_runs import live_dir, live_file
from mrv2_prof.tui.browser import BrowserApp
from mrv2_prof.tui.screens.run_screen import RunScreen
from mrv2_prof.tui.screens.runs_screen import RunsScreen

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"
WIDE = (160, 48)
MS = 1_000_000
STORED = {  # run id -> (tok/s, ITL p99) as the list shows them (the fixture's docstring)
    "bbb222": ["30.0", "50.0 ms"],
    "aaa111": ["15.0", "148.5 ms"],
    "ccc333": ["—", "—"],
}


def cells(table: DataTable, row_key: str, *columns: str) -> list[str]:
    return [str(table.get_cell(row_key, c)) for c in columns]


def row_keys(table: DataTable) -> list[str]:
    return [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(table.row_count)]


async def loaded_list(app: BrowserApp, pilot) -> DataTable:
    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.loaded, 60)
    await pilot.pause()
    return app.screen.query_one("#runs", DataTable)


def assert_stored_figures(table: DataTable) -> None:
    for run_id, shown in STORED.items():
        assert cells(table, run_id, "tok_s", "itl_p99") == shown, run_id


@pytest.fixture
def live_run(runs_db: Path, tmp_path: Path):
    """``mrv2-prof run`` writing 400 quickstart requests into ``runs_db`` in another process,
    once its side file and marker exist: (the process, the live run's id). Stopped after."""
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mrv2_prof", "run", str(QUICKSTART), "--headless",
         "--db", str(runs_db), "--set", "workload.num_requests=400"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        markers: list[Path] = []
        while not markers:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no live run: {(tmp_path / 'run.log').read_text()[-2000:]}")
            if live_dir(runs_db).is_dir():
                markers = list(live_dir(runs_db).glob("*.json"))
            time.sleep(0.05)
        run_id = markers[0].stem
        assert live_file(runs_db, run_id).exists()
        yield proc, run_id
    finally:
        proc.terminate()  # the run stops between steps, is stored aborted and merged
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.asyncio
async def test_the_list_loads_every_stored_run_while_a_run_is_live(runs_db, live_run) -> None:
    proc, run_id = live_run
    app = BrowserApp(runs_db)
    async with app.run_test(size=WIDE) as pilot:
        table = await loaded_list(app, pilot)
        assert row_keys(table) == [run_id, "bbb222", "aaa111", "ccc333"]
        assert cells(table, run_id, "label", "status", "tok_s", "itl_p99") == [
            "quickstart", "running", "live", "live",
        ]  # fmt: skip
        assert_stored_figures(table)
        # the cursor is on the live run: the line under the list says why it has no figures
        note = text(app, "runs-status")
        assert note.startswith(f"{run_id} (quickstart): live: its runner is writing "), note
        assert str(live_file(runs_db, run_id)) in note
        await pilot.press("enter")  # opening it says it is still running
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.loaded)
        assert "is still running" in text(app, "run-title")
    assert proc.poll() is None  # the run was live all along


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _marker(db: Path, run_id: str, label: str, pid: int) -> None:
    """A live run's marker, as ``store.live_runs.write_marker`` writes it, for writer ``pid``."""
    live_dir(db).mkdir(exist_ok=True)
    fields = {
        "run_id": run_id, "label": label, "scenario_name": label,
        "started_at": dt.datetime.now().isoformat(), "writer_pid": pid,
        "writer_host": socket.gethostname(),
    }  # fmt: skip
    (live_dir(db) / f"{run_id}.json").write_text(json.dumps(fields))


def _side_run(db: Path, run_id: str) -> None:
    """A side file holding ``run_id`` with the baseline's requests: tokens at 100/200/300 and
    200/250/400 ms → 6 tokens in 0.4 s = 15.0 tok/s, ITL p99 148.5 ms (the fixture's docstring)."""
    live_dir(db).mkdir(exist_ok=True)
    with Store.open(live_file(db, run_id)) as side:
        side.begin_run(
            run_id, scenario_name="left", label="left", matrix_combo=None,
            scenario_yaml="name: left", device="cpu", versions={}, started_ns=0, info={},
        )  # fmt: skip
        token_ms = {"r0": [100, 200, 300], "r1": [200, 250, 400]}
        side.append(run_id, "requests", {
            "req_id": ["r0", "r1"], "arrival_ns": [0, 0], "first_token_ns": [100 * MS, 200 * MS],
            "finish_ns": [300 * MS, 400 * MS], "prompt_tokens": [8, 8], "output_tokens": [3, 3],
            "num_preemptions": [0, 0], "finish_reason": ["length"] * 2, "cached_tokens": [0, 0],
        })  # fmt: skip
        side.append(run_id, "tokens", {
            "req_id": [r for r, ts in token_ms.items() for _ in ts], "idx": [0, 1, 2] * 2,
            "t_ns": [t * MS for ts in token_ms.values() for t in ts], "token_id": [7] * 6,
        })  # fmt: skip


@pytest.mark.asyncio
async def test_side_files_left_by_a_gone_runner_read_so_far_or_say_why_not(runs_db) -> None:
    dead = _dead_pid()
    _side_run(runs_db, "ddd444")  # readable: no process holds it
    _marker(runs_db, "ddd444", "left", dead)
    live_file(runs_db, "eee555").write_bytes(b"not a database" * 300)  # damaged
    _marker(runs_db, "eee555", "broken", dead)
    app = BrowserApp(runs_db)
    async with app.run_test(size=WIDE) as pilot:
        table = await loaded_list(app, pilot)
        assert row_keys(table) == ["ddd444", "eee555", "bbb222", "aaa111", "ccc333"]
        assert cells(table, "ddd444", "label", "tok_s", "itl_p99") == ["left", "15.0*", "148.5 ms*"]
        assert cells(table, "eee555", "tok_s", "itl_p99") == ["error", "error"]
        reason = cells(table, "eee555", "label")[0]
        assert reason.startswith("its runner is gone and its side file cannot be read: ")
        assert "not a DuckDB database" in reason
        assert_stored_figures(table)  # the broken run stopped none of the others
        # what the marks mean is under the list, and each row's own note with the cursor on it
        assert text(app, "runs-status").startswith("ddd444 (left): figures so far (*), read from")
        await pilot.press("down")
        await wait_for(pilot, lambda: text(app, "runs-status").startswith("eee555 (broken): "))
        assert reason in text(app, "runs-status")
        await pilot.press("down")
        await wait_for(pilot, lambda: "error: figures not read" in text(app, "runs-status"))
        assert "*: so far, from a live run's side file" in text(app, "runs-status")
