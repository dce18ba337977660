"""`compare` and `gate` over groups of repeats: verdicts and exit codes on hand-made groups whose
per-run start-up times are known (group_runs.py), comparability refusals, and the markdown and
JSON outputs (the JSON against the schema held in docs/schemas)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from gate_runs import add_base, add_worse, make_db
from group_runs import ENV, add_group, make_groups
from json_schema_check import validate
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.report.ab_markdown import HEADER
from mrv2_prof.store import Store

runner = CliRunner()
SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"

BASE = [10.0, 10.1, 9.9, 10.05, 9.95]  # median 10.0, spread ±1 %
GROUPS = {
    "base": BASE,
    "slower": [12.0, 12.1, 11.9, 12.05, 11.95],  # +20 %: every resample of the median is +19..21 %
    "faster": [8.0, 8.1, 7.9, 8.05, 7.95],  # -20 %
    "same": [10.02, 10.08, 9.97, 10.03, 9.96],  # +0.2 %: resampled medians within ±1.8 %
    "two": [12.0, 12.1],  # a clear +20 %, but two runs
    "wide": [9.0, 10.5, 11.5, 10.0, 12.0],  # median +5 %, the runs spread ±15 %
}


@pytest.fixture
def db(tmp_path):
    return make_groups(tmp_path / "g.duckdb", GROUPS)


def gate(db, base: str, cand: str, *args: str):
    """With --max-regression, only those thresholds (``--replace-defaults``)."""
    only = ["--replace-defaults"] if "--max-regression" in args else []
    argv = ["gate", "--db", str(db), "--baseline", base, "--candidate", cand, *args, *only]
    return runner.invoke(app, argv)


def compare_json(db, a: str, b: str, *args: str) -> dict:
    result = runner.invoke(app, ["compare", a, b, "--db", str(db), "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def startup(data: dict) -> dict:
    return next(m for m in data["metrics"] if m["metric"] == "startup_s")


@pytest.mark.parametrize(
    ("cand", "verdict"),
    [("slower", "worse"), ("faster", "better"), ("same", "within noise"), ("two", "inconclusive")],
)
def test_compare_verdicts_over_groups(db, cand, verdict):
    row = startup(compare_json(db, "group:base", f"group:{cand}"))
    assert row["stat"]["verdict"] == verdict, row
    assert row["stat"]["test"].endswith("over runs")
    assert row["a"] == pytest.approx(10.0)  # the group's median


def test_compare_interval_of_a_clear_regression(db):
    stat = startup(compare_json(db, "group:base", "group:slower"))["stat"]
    assert stat["delta"] == pytest.approx(0.2)  # 12.0 / 10.0 - 1
    # a resampled median lies within its runs' range: base [9.9, 10.1], slower [11.9, 12.1]
    assert 11.9 / 10.1 - 1 <= stat["low"] < 0.2 < stat["high"] <= 12.1 / 9.9 - 1
    assert (stat["n_a"], stat["n_b"]) == (5, 5)


@pytest.mark.parametrize(
    ("cand", "code", "status"),
    [
        ("slower", 1, "fail"),  # the whole interval past +5 %
        ("faster", 0, "pass"),
        ("same", 0, "pass"),
        ("two", 3, "inconclusive"),  # fewer than 3 runs a side
        ("wide", 3, "inconclusive"),  # the interval straddles +5 %
    ],
)
def test_gate_exit_codes_over_groups(db, cand, code, status):
    result = gate(db, "group:base", f"group:{cand}", "--max-regression", "startup_s=5%", "--json")
    assert result.exit_code == code, result.output
    data = json.loads(result.stdout)
    assert data["results"][0]["status"] == status
    assert data["exit_code"] == code
    assert data["outcome"] == {0: "pass", 1: "regression", 3: "inconclusive"}[code]


def test_gate_table_names_the_interval_and_the_verdict(db):
    result = gate(db, "group:base", "group:wide", "--max-regression", "startup_s=5%")
    assert result.exit_code == 3
    line = next(x for x in result.stdout.splitlines() if x.startswith("inconclusive startup_s"))
    assert "median of 5 vs 5 runs" in line and "straddles 5%" in line
    assert result.stdout.strip().splitlines()[-1] == "gate: INCONCLUSIVE (1 of 1 metric)"
    result = gate(db, "group:base", "group:two", "--max-regression", "startup_s=5%")
    assert "5 vs 2 runs; at least 3 a side are needed" in result.stdout


def test_an_absolute_threshold_over_groups(db):
    # capture_s is startup_s / 10: slower moves it +0.2 s, faster -0.2 s
    assert (
        gate(db, "group:base", "group:slower", "--max-regression", "capture_s=+0.1").exit_code == 1
    )
    assert (
        gate(db, "group:base", "group:slower", "--max-regression", "capture_s=+0.3").exit_code == 0
    )


def test_help_states_the_exit_codes():
    text = " ".join(runner.invoke(app, ["gate", "--help"]).output.split())
    assert "Exit codes: 0 pass, 1 fail, 2 bad input" in text and "3 inconclusive" in text
    doc = (Path(__file__).resolve().parents[2] / "docs" / "compare-and-gate.md").read_text()
    assert "3 inconclusive" in doc


# --- comparability --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"device": "cuda:0"}, "device: device differs ('cpu' vs 'cuda:0', run other-0)"),
        ({"environment": {**ENV, "torch": "2.10"}}, "torch: torch differs ('2.9' vs '2.10'"),
    ],
)
def test_a_gate_across_devices_or_torch_versions_refuses(tmp_path, kwargs, names):
    db = make_groups(tmp_path / "c.duckdb", {"base": BASE})
    with Store.open(db) as store:
        add_group(store, "other", BASE, **kwargs)
    result = gate(db, "group:base", "group:other")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "--allow-different" in lines[0]
    result = gate(db, "group:base", "group:other", "--allow-different")
    assert result.exit_code == 0, result.output
    assert any(x.startswith("differs: ") and names in x for x in result.stdout.splitlines())
    data = compare_json(db, "group:base", "group:other")
    assert data["comparability"]["comparable"] is False
    assert any(names in d["text"] for d in data["comparability"]["differences"])


def test_a_different_scenario_refuses_naming_the_key(tmp_path):
    db = make_groups(tmp_path / "c.duckdb", {"base": BASE})
    with Store.open(db) as store:
        add_group(store, "seed1", BASE, scenario_yaml="name: g\nseed: 1\n")
    result = gate(db, "group:base", "group:seed1")
    assert result.exit_code == 2 and "scenario: seed differs (0 vs 1" in result.stderr


# --- markdown and JSON --------------------------------------------------------------------


def cells(line: str) -> list[str]:
    """A GitHub table row's cells (a pipe escaped as \\| stays in its cell)."""
    assert line.startswith("|") and line.endswith("|"), line
    return [c.strip() for c in re.split(r"(?<!\\)\|", line[1:-1])]


def github_tables(text: str) -> list[list[list[str]]]:
    """Every table of a markdown text: header, a --- separator row, then rows of as many cells."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(cells(lines[i]))
                i += 1
            header, sep, *rows = block
            assert all(re.fullmatch(r":?-{3,}:?", c) for c in sep) and len(sep) == len(header)
            assert all(len(r) == len(header) for r in rows)
            tables.append([header, *rows])
        i += 1
    return tables


def test_compare_markdown_is_a_github_table(db):
    result = runner.invoke(
        app, ["compare", "group:base", "group:slower", "--db", str(db), "--format", "markdown"]
    )
    assert result.exit_code == 0, result.output
    (table,) = github_tables(result.stdout)
    assert tuple(table[0]) == HEADER
    row = next(r for r in table[1:] if r[0] == "startup_s")
    assert row[1:4] == ["10.00 s", "12.00 s", "+20.0%"] and row[5] == "worse"
    assert re.fullmatch(r"\[\+\d+\.\d%, \+\d+\.\d%\]", row[4])
    assert "**Comparability**" in result.stdout


def test_gate_markdown_has_each_stage_and_a_github_table(tmp_path):
    db = make_db(tmp_path / "r.duckdb", add_base, add_worse)
    result = gate(db, "aaa111", "bbb222", "--format", "markdown", "--all-stages")
    assert result.exit_code == 1
    for stage in ("static: pass", "output contract: skip", "load: FAIL"):
        assert f"#### {stage}" in result.stdout
    (table,) = github_tables(result.stdout)
    assert tuple(table[0]) == (*HEADER, "limit")
    row = next(r for r in table[1:] if r[0] == "p99_itl")
    # past its limit on the two values, but the baseline's six gaps are one value (10 ms): no
    # interval over requests, so one run a side cannot decide
    assert row == ["p99_itl", "10.00 ms", "21.40 ms", "+114.0%", "-",
                   "inconclusive (requests: inconclusive)", "10%"]  # fmt: skip
    row = next(r for r in table[1:] if r[0] == "startup_s")  # no per-request distribution
    assert row == ["startup_s", "10.00 s", "11.00 s", "+10.0%", "-", "pass", "20%"]
    assert "peak_kv_usage: 0.500 -> 0.800 (not gated" in result.stdout


def test_json_validates_against_the_schemas(db, tmp_path):
    compare_schema = json.loads((SCHEMAS / "compare.schema.json").read_text())
    gate_schema = json.loads((SCHEMAS / "gate.schema.json").read_text())
    validate(compare_json(db, "group:base", "group:slower"), compare_schema)
    one = make_db(tmp_path / "r.duckdb", add_base, add_worse)
    validate(compare_json(one, "aaa111", "bbb222"), compare_schema)
    for args in (
        (db, "group:base", "group:wide", "--max-regression", "startup_s=5%"),
        (one, "aaa111", "bbb222", "--all-stages"),
    ):
        result = gate(*args, "--format", "json")
        data = json.loads(result.stdout)
        validate(data, gate_schema)
        assert data["version"] == 1 and data["schema"] == "mrv2-prof.gate"
    with pytest.raises(AssertionError):  # the check itself fails on a document off the schema
        validate({**data, "exit_code": "one"}, gate_schema)


def test_a_bad_format_is_one_line_of_bad_input(db):
    for argv in (
        ["compare", "group:base", "group:same", "--format", "xml"],
        ["gate", "--baseline", "group:base", "--candidate", "group:same", "--format", "xml"],
        ["compare", "group:base", "group:same", "--json", "--format", "markdown"],
    ):
        result = runner.invoke(app, [*argv, "--db", str(db)])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "--format" in lines[0], result.stderr
