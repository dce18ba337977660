"""The browser's comparison gives each metric the verdict ``mrv2-prof compare`` gives it, says
what differs between the two runs as the CLI says it, and explains the verdict under the cursor.

The runs (``clearly_apart``): 20 requests each, two tokens each, all arriving at 0. Run A's
request i has its tokens at 10 ms and 110 + i ms (gap 100 + i ms, 20 distinct gaps 100..119);
run B's at 10 ms and 60 + i ms (gaps 50..69). Every resample of A's gaps has its p50 and p99 in
[100, 119] and every resample of B's in [50, 69]: the change is at most (69 - 100) / 100 = -31 %
and at least (50 - 119) / 119 = -58 %, wholly past the -2 % floor, larger than either run's
interquartile range (p75 - p25 = 9.5 ms) and of non-zero width: **better**. Their
scenarios as run differ in ``workload.num_requests`` (20 against 21) and ``name``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.widgets import DataTable
from tui_helpers import text, wait_for
from typer.testing import CliRunner

from mrv2_prof.cli import app as cli_app
from mrv2_prof.store import Store
from mrv2_prof.tui.browser import BrowserApp
from mrv2_prof.tui.screens.compare_screen import MAX_WARNINGS, CompareScreen, shown_warnings

MS = 1_000_000
WIDE = (160, 48)
N = 20


def _run(store: Store, run_id: str, when: str, gap_base_ms: int, scenario: str) -> None:
    store.begin_run(
        run_id, scenario_name=run_id, label=run_id, matrix_combo=None, scenario_yaml=scenario,
        device="cpu", versions={}, started_ns=0, info={},
    )  # fmt: skip
    store.connection.execute(
        "UPDATE runs SET started_at = CAST(? AS TIMESTAMP) WHERE run_id = ?", [when, run_id]
    )
    ids = [f"r{i}" for i in range(N)]
    last_ms = [10 + gap_base_ms + i for i in range(N)]
    store.append(run_id, "requests", {
        "req_id": ids, "arrival_ns": [0] * N, "first_token_ns": [10 * MS] * N,
        "finish_ns": [t * MS for t in last_ms], "prompt_tokens": [8] * N,
        "output_tokens": [2] * N, "num_preemptions": [0] * N, "finish_reason": ["length"] * N,
        "cached_tokens": [0] * N,
    })  # fmt: skip
    store.append(run_id, "tokens", {
        "req_id": [r for r in ids for _ in range(2)], "idx": [0, 1] * N,
        "t_ns": [t for last in last_ms for t in (10 * MS, last * MS)], "token_id": [7] * 2 * N,
    })  # fmt: skip
    store.finish_run(run_id, "completed", ended_ns=1)


@pytest.fixture
def clearly_apart(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _run(store, "aaa000", "2025-01-02 10:00:00", 100, "name: a\nworkload: {num_requests: 20}")
        _run(store, "bbb000", "2025-01-02 11:00:00", 50, "name: b\nworkload: {num_requests: 21}")
    return path


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli_app, ["compare", *args], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output


async def _compare(app: BrowserApp, pilot) -> CompareScreen:
    """A = the older run (second row), B = the newer, once the comparison is in."""
    await wait_for(pilot, lambda: getattr(app.screen, "loaded", False))
    await pilot.press("down", "c", "up", "c")
    await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded)
    return app.screen


@pytest.mark.asyncio
async def test_each_verdict_and_the_differences_are_those_compare_gives(clearly_apart) -> None:
    db = str(clearly_apart)
    document = json.loads(_cli("aaa000", "bbb000", "--db", db, "--format", "json"))
    cli_verdicts = {m["metric"]: m["stat"]["verdict"] for m in document["metrics"]}
    assert cli_verdicts["p99_itl"] == cli_verdicts["p50_itl"] == "better"  # module docstring
    said = [
        line
        for line in _cli("aaa000", "bbb000", "--db", db).splitlines()
        if line.startswith(("differs:", "not checked:"))
    ]
    assert any(
        x.startswith("differs: scenario: workload.num_requests differs (20 vs 21") for x in said
    )

    app = BrowserApp(clearly_apart)
    async with app.run_test(size=WIDE) as pilot:
        screen = await _compare(app, pilot)
        assert (screen.run_a, screen.run_b) == ("aaa000", "bbb000")
        table = screen.query_one("#compare-table", DataTable)
        shown = {str(k.value): str(table.get_cell(k, "verdict")) for k in table.rows}
        assert shown.keys() == cli_verdicts.keys()
        for metric, verdict in cli_verdicts.items():
            assert shown[metric].startswith(verdict), (metric, shown[metric], verdict)
        assert shown["p99_itl"] == "better"
        # the lines above the table: the CLI's own, in its order
        assert text(app, "compare-warnings").splitlines() == said[:MAX_WARNINGS]

        table.move_cursor(row=table.get_row_index("p50_itl"))
        await wait_for(pilot, lambda: text(app, "compare-verdict").startswith("p50_itl: "))
        stat = screen.stats["p50_itl"]
        # A's median gap 109.5 ms, B's 59.5 ms: (59.5 - 109.5) / 109.5 = -45.7 %
        line = text(app, "compare-verdict")
        assert line.startswith("p50_itl: better: -45.7% [")
        assert line == f"p50_itl: {stat.stat.describe()}; test: {stat.test}"


@pytest.mark.asyncio
async def test_runs_of_one_scenario_have_no_difference_line(clearly_apart) -> None:
    with Store.open(clearly_apart) as store:
        store.connection.execute("UPDATE runs SET scenario_yaml = 'name: same'")
    app = BrowserApp(clearly_apart)
    async with app.run_test(size=WIDE) as pilot:
        await _compare(app, pilot)
        shown = text(app, "compare-warnings")
        assert "differs: scenario" not in shown
        assert shown.splitlines() == [
            x
            for x in _cli("aaa000", "bbb000", "--db", str(clearly_apart)).splitlines()
            if x.startswith(("differs:", "not checked:"))
        ]


def test_more_differences_than_fit_are_counted_and_named_where_to_see_them() -> None:
    lines = [f"differs: scenario: k{i} differs (1 vs 2, run b)" for i in range(6)]
    assert shown_warnings(lines, "a", "b").splitlines() == [
        *lines[: MAX_WARNINGS - 1],
        f"… and {6 - MAX_WARNINGS + 1} more: mrv2-prof compare a b",
    ]
    assert shown_warnings(lines[:MAX_WARNINGS], "a", "b").splitlines() == lines[:MAX_WARNINGS]
