"""One run a side on real runs: the quickstart as shipped, twice, on this machine. Its 16 requests
arrive together and are served in lockstep, so each run has one TTFT and one TPOT (16 equal
values): compare must not call them worse or better, and the gate of two identical configs
passes or is inconclusive (exit 0 or 3), never fails. Also: --max-regression keeps the other
defaults, --only and --replace-defaults narrow them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.report.gate import DEFAULT_THRESHOLDS
from mrv2_prof.store import Store

runner = CliRunner()
LOCKSTEP = [f"p{q}_{kind}" for kind in ("ttft", "tpot") for q in (50, 95, 99)]


def _run(db: Path) -> str:
    """A quickstart run as a user starts it: its own runner process (two runs in one test
    process share it with the first run's leftovers, and the second measured slower)."""
    done = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", "--headless", "--db", str(db)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    with Store.open(db, read_only=True) as store:
        return store.resolve_run("latest")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[str, str, str]:
    db = tmp_path_factory.mktemp("one_run") / "runs.duckdb"
    a, b = _run(db), _run(db)
    set_base = runner.invoke(app, ["baseline", "set", "main", a, "--db", str(db)])
    assert set_base.exit_code == 0, set_base.output
    return str(db), a, b


def gate_json(db: str, b: str, *args: str) -> tuple[int, dict]:
    argv = ["gate", "--db", db, "--baseline", "baseline:main", "--candidate", b, "--json"]
    result = runner.invoke(app, [*argv, *args])
    assert result.exit_code != 2, result.output
    return result.exit_code, json.loads(result.stdout)


def test_compare_of_identical_single_runs_is_inconclusive(two_runs):
    db, a, b = two_runs
    result = runner.invoke(app, ["compare", a, b, "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    rows = {m["metric"]: m for m in json.loads(result.stdout)["metrics"]}
    for name in LOCKSTEP:
        stat = rows[name]["stat"]
        assert stat["verdict"] == "inconclusive" and stat["low"] is None, (name, stat)
        assert stat["reason"].startswith(
            "1 run a side: 1 and 1 distinct values in 16 and 16 samples"
        ), stat
    # every metric without samples of its own (throughput, start-up) is inconclusive too
    for name in ("tok_throughput", "startup_s"):
        assert rows[name]["stat"]["verdict"] == "inconclusive"
    text = runner.invoke(app, ["compare", a, b, "--db", db, "--format", "markdown"]).stdout
    line = next(x for x in text.splitlines() if x.startswith("| p50_ttft |"))
    assert line.endswith("| - | inconclusive (1 run a side) |")  # no interval, and why
    assert "1 run a side: better/worse needs 3+ distinct values a side" in text


def test_gate_of_identical_configs_passes_or_is_inconclusive(two_runs):
    db, _, b = two_runs
    code, data = gate_json(db, b)
    assert code in (0, 3), data["verdict"]
    by_metric = {r["metric"]: r for r in data["results"]}
    assert not [r["message"] for r in data["results"] if r["status"] == "fail"]
    for name in LOCKSTEP:  # a crossing, if timing moved, cannot be told from noise
        assert by_metric[name]["status"] in ("pass", "inconclusive"), by_metric[name]
    for name in ("errors", "aborts", "preemptions"):  # counted: decided on the two values
        assert by_metric[name]["status"] == "pass"
    # the shipped quickstart on a CPU carries the CPU note on both sides: reported, not failed
    static = next(s for s in data["stages"] if s["name"] == "static")
    assert static["status"] == "pass", static


def test_max_regression_keeps_the_other_defaults(two_runs):
    db, _, b = two_runs
    _, data = gate_json(db, b, "--max-regression", "p99_itl=5%")
    limits = {r["metric"]: r["threshold"] for r in data["results"]}
    assert set(limits) == set(DEFAULT_THRESHOLDS)  # all 18, peak_gpu_mem skipped on a CPU
    assert limits["p99_itl"] == "5%" and limits["p95_itl"] == DEFAULT_THRESHOLDS["p95_itl"]
    load = next(s for s in data["stages"] if s["name"] == "load")
    summary = "thresholds: the defaults (mrv2-prof gate --help), with p99_itl=5%; 18 in force"
    assert summary in load["lines"]
    # off drops a default; the other 16 stay
    _, data = gate_json(db, b, "--max-regression", "startup_s=off")
    assert {r["metric"] for r in data["results"]} == set(DEFAULT_THRESHOLDS) - {"startup_s"}


def test_only_and_replace_defaults_narrow_the_gate(two_runs):
    db, _, b = two_runs
    code, data = gate_json(db, b, "--only", "errors,aborts")
    assert [(r["metric"], r["threshold"]) for r in data["results"]] == [
        ("errors", "+0"),
        ("aborts", "+0"),
    ]
    assert code == 0 and data["verdict"] == "gate: PASS (2 metrics)"
    _, data = gate_json(db, b, "--only", "errors", "--max-regression", "errors=+3")
    assert [(r["metric"], r["threshold"]) for r in data["results"]] == [("errors", "+3")]
    flags = ("--max-regression", "aborts=+1", "--max-regression", "sync_count=+5")
    _, data = gate_json(db, b, "--replace-defaults", *flags)
    assert [r["metric"] for r in data["results"]] == ["sync_count", "aborts"]  # METRICS order


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--only", "p99_foo"], "--only 'p99_foo': unknown metric"),
        (["--only", "sync_count"], "--only sync_count: sync_count has no default threshold"),
        (["--replace-defaults"], "--replace-defaults: no --thresholds or --max-regression"),
    ],
)
def test_bad_narrowing_is_one_line_of_bad_input(tmp_path, args, says):
    from gate_runs import add_base, make_db

    db = make_db(tmp_path / "r.duckdb", add_base)
    argv = ["gate", "--db", str(db), "--baseline", "aaa111", "--candidate", "aaa111", *args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert says in line


def test_help_says_the_defaults_stay():
    text = " ".join(runner.invoke(app, ["gate", "--help"], terminal_width=200).output.split())
    assert "the other defaults stay" in text
    assert "--only" in text and "--replace-defaults" in text
