"""Named baselines: ``mrv2-prof baseline set|list|rm``, and ``baseline:NAME`` where a run is
taken; ``report --db-b``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
from typer.testing import CliRunner

from mrv2_prof.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from gate_runs import add_base, add_worse, make_db  # noqa: E402
from group_runs import add_group  # noqa: E402

from mrv2_prof.store import Store  # noqa: E402

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def one_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_set_list_move_and_remove(tmp_path):
    db = make_db(tmp_path / "r.duckdb", add_base, add_worse)
    with Store.open(db) as store:
        add_group(store, "g1", [10.0, 10.1, 9.9])
    assert invoke("baseline", "set", "main", "aaa", "--db", str(db)).exit_code == 0
    result = invoke("baseline", "set", "nightly", "group:g1", "--db", str(db))
    assert result.exit_code == 0 and "baseline:nightly -> group g1 (3 runs)" in result.stdout
    listed = invoke("baseline", "list", "--db", str(db)).stdout.splitlines()
    assert [line.split()[:3] for line in listed] == [
        ["baseline:main", "run", "aaa111"],
        ["baseline:nightly", "group", "g1"],
    ]
    with duckdb.connect(str(db), read_only=True) as con:  # a table of the run database
        assert con.execute("SELECT name, kind, target FROM baselines ORDER BY name").fetchall() == [
            ("main", "run", "aaa111"), ("nightly", "group", "g1"),
        ]  # fmt: skip
    invoke("baseline", "set", "main", "bbb222", "--db", str(db))  # setting it again moves it
    assert "baseline:main  run bbb222" in invoke("baseline", "list", "--db", str(db)).stdout
    assert invoke("baseline", "rm", "main", "--db", str(db)).exit_code == 0
    listed = invoke("baseline", "list", "--db", str(db)).stdout
    assert "baseline:main" not in listed and "baseline:nightly" in listed
    assert "no baseline 'main'" in one_line(invoke("baseline", "rm", "main", "--db", str(db)))


def test_baseline_is_taken_wherever_a_run_is(tmp_path):
    db = make_db(tmp_path / "r.duckdb", add_base, add_worse)
    invoke("baseline", "set", "main", "aaa111", "--db", str(db))
    result = invoke("compare", "baseline:main", "bbb222", "--db", str(db), "--json")
    assert json.loads(result.stdout)["a"]["run_id"] == "aaa111"
    argv = ["gate", "--baseline", "baseline:main", "--candidate", "bbb222", "--db", str(db)]
    result = invoke(*argv, "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["baseline"]["runs"] == ["aaa111"]
    result = invoke("show", "baseline:main", "--db", str(db), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["run_id"] == "aaa111"


def test_a_group_baseline_gates_over_its_runs(tmp_path):
    db = tmp_path / "g.duckdb"
    with Store.open(db) as store:
        add_group(store, "main", [10.0, 10.1, 9.9, 10.05, 9.95])
        add_group(store, "pr", [12.0, 12.1, 11.9, 12.05, 11.95])
    invoke("baseline", "set", "main", "group:main", "--db", str(db))
    argv = ["gate", "--baseline", "baseline:main", "--candidate", "group:latest", "--db", str(db)]
    result = invoke(*argv, "--max-regression", "startup_s=5%", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["baseline"]["group"] == "main" and data["candidate"]["group"] == "pr"
    assert "names the group 'main'" in one_line(invoke("show", "baseline:main", "--db", str(db)))


def test_bad_baseline_input_is_one_line(tmp_path):
    db = make_db(tmp_path / "r.duckdb", add_base)
    assert "baseline name 'no way'" in one_line(
        invoke("baseline", "set", "no way", "aaa111", "--db", str(db))
    )
    assert "no run 'zzz'" in one_line(invoke("baseline", "set", "main", "zzz", "--db", str(db)))
    assert "no group 'zzz'" in one_line(
        invoke("baseline", "set", "main", "group:zzz", "--db", str(db))
    )
    line = one_line(invoke("compare", "baseline:nope", "aaa111", "--db", str(db)))
    assert "no baseline 'nope'" in line
    missing = tmp_path / "none.duckdb"
    assert "no such run database" in one_line(
        invoke("baseline", "set", "main", "aaa111", "--db", str(missing))
    )
    assert not missing.exists()


def test_report_takes_a_second_database(tmp_path):
    db_a = make_db(tmp_path / "a.duckdb", add_base)
    db_b = make_db(tmp_path / "b.duckdb", add_worse)
    out = tmp_path / "ab.html"
    result = invoke(
        "report", "aaa111", "bbb222", "--db", str(db_a), "--db-b", str(db_b), "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "sweep report: 2 runs" in page and "aaa111" in page and "bbb222" in page
    one = one_line(invoke("report", "aaa111", "--db", str(db_a), "--db-b", str(db_b)))
    assert "--db-b takes two or more RUNs" in one
