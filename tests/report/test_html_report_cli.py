"""The report's sweep pages and its command line: sweep membership, a sweep's headline table,
the output file, one-line bad input, and the report's imports (no textual, torch or runner)."""

from __future__ import annotations

import pytest
from test_html_report import (  # noqa: F401 (gpu_db: the synthetic GPU run's fixture)
    MS,
    T0,
    _begin,
    assert_self_contained,
    figures_of,
    fill_gpu_run,
    gpu_db,
)
from typer.testing import CliRunner

from mrv2_prof.analysis.sweep_runs import sweep_members
from mrv2_prof.cli import app
from mrv2_prof.report.html_report import render_sweep_report
from mrv2_prof.store import Store, StoreError

# ---- sweeps --------------------------------------------------------------------------------


def test_sweep_members_are_the_consecutive_runs_of_one_matrix(tmp_path):
    # start order: a {k:1}, b {k:2} (one sweep); c another scenario; d {k:1}, e {k:2} (a second
    # sweep of the same scenario: d repeats a's combination, so it starts a new sweep)
    with Store.open(tmp_path / "runs.duckdb") as store:
        for n, (rid, name, combo) in enumerate([
            ("a00001", "s", {"runner.k": 1}), ("b00002", "s", {"runner.k": 2}),
            ("c00003", "other", None), ("d00004", "s", {"runner.k": 1}),
            ("e00005", "s", {"runner.k": 2}),
        ]):  # fmt: skip
            _begin(store, rid, name=name, combo=combo, started_ns=T0 + n * MS)
        assert sweep_members(store, "b00002") == ["a00001", "b00002"]
        assert sweep_members(store, "d00004") == ["d00004", "e00005"]
        with pytest.raises(StoreError, match="not part of a sweep"):
            sweep_members(store, "c00003")


def test_sweep_report_compares_headline_metrics(gpu_db):  # noqa: F811 (the fixture)
    with Store.open(gpu_db) as store:
        _begin(store, "9a0002", combo={"runner.async_scheduling": False})
        fill_gpu_run(store, "9a0002")
        store.connection.execute(  # the second run hides nothing
            "UPDATE steps SET hidden_prep_ns = 0 WHERE run_id = '9a0002'"
        )
        page = render_sweep_report(store, ["9a0001", "9a0002"])
    assert_self_contained(page)
    figs = figures_of(page)
    assert list(figs) == ["sweep"]
    values = figs["sweep"]["layout"]["meta"]["values"]
    assert values["9a0001"]["overlap_pct"] == pytest.approx(100 / 3)
    assert values["9a0002"]["overlap_pct"] == 0
    # output tokens 4+3+2+1 = 10 over first arrival (0) to last finish (85 ms)
    assert values["9a0001"]["output_tokens_per_s"] == pytest.approx(10 / 0.085)
    assert values["9a0001"]["ttft_p50_ms"] == pytest.approx(10.0)
    assert values["9a0001"]["bubble_ms"] == pytest.approx(7.0)
    assert values["9a0001"]["peak_mem_gib"] == pytest.approx(3.0)
    legend = {t["name"] for t in figs["sweep"]["data"] if t.get("showlegend")}
    assert legend == {"9a0001 gpu-demo", "9a0002 async_scheduling=false"}


# ---- the command line -----------------------------------------------------------------------

cli = CliRunner()


def test_cli_writes_the_report_and_prints_its_path(gpu_db, tmp_path):  # noqa: F811 (the fixture)
    out = tmp_path / "r.html"
    result = cli.invoke(app, ["report", "9a00", "--db", str(gpu_db), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out) in result.output and "MiB" in result.output
    assert "timeline" in figures_of(out.read_text())


def test_cli_default_output_name_and_sweep(gpu_db, tmp_path, monkeypatch):  # noqa: F811 (the fixture)
    monkeypatch.chdir(tmp_path)
    result = cli.invoke(app, ["report", "latest", "--db", str(gpu_db)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "9a0001.report.html").exists()
    result = cli.invoke(app, ["report", "9a0001", "9a0001", "--db", str(gpu_db)])
    assert result.exit_code == 0  # the same run twice is one run
    result = cli.invoke(app, ["report", "9a0001", "--sweep", "--db", str(gpu_db)])
    assert result.exit_code == 2 and "not part of a sweep" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "nope"], "no run 'nope'"),
        (["report", "9a0001", "--window", "5"], "--window '5'"),
        (["report", "9a0001", "--window", "9:3"], "--window '9:3'"),
        (["report", "9a0001", "-o", "/nonexistent/dir/r.html"], "cannot write the report"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(gpu_db, args, message):  # noqa: F811 (the fixture)
    result = cli.invoke(app, [*args, "--db", str(gpu_db)])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_report_modules_import_without_textual_torch_or_the_runner():
    import subprocess
    import sys

    code = (
        "import sys, mrv2_prof.report.html_report, mrv2_prof.report.sweep; "
        "print(sorted(m for m in sys.modules if m in ('textual', 'torch') "
        "or m.startswith('mrv2_prof.runner')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_cli_missing_database(tmp_path):
    result = cli.invoke(app, ["report", "latest", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 2 and "no such run database" in result.output
