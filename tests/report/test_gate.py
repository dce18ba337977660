"""`mrv2-prof gate`: exit codes and messages on hand-made runs (values worked out in gate_runs.py).

aaa111 is the baseline; bbb222 regresses almost everything; ccc333 moves p99 ITL by +4.75% and
has no GPU samples and no step timings.
"""

from __future__ import annotations

import json

import pytest
from gate_runs import add_base, add_slight, add_worse, make_db
from typer.testing import CliRunner

from mrv2_prof.analysis.gate_metrics import METRICS
from mrv2_prof.cli import app
from mrv2_prof.report.gate import DEFAULT_THRESHOLDS

runner = CliRunner()


@pytest.fixture
def db(tmp_path):
    return make_db(tmp_path / "runs.duckdb", add_base, add_worse, add_slight)


def gate(db, baseline: str, candidate: str, *args: str):
    argv = ["gate", "--db", str(db), "--baseline", baseline, "--candidate", candidate, *args]
    return runner.invoke(app, argv)


def limits(*pairs: str) -> list[str]:
    """These thresholds alone (``--replace-defaults``: no default besides them)."""
    return [*(arg for pair in pairs for arg in ("--max-regression", pair)), "--replace-defaults"]


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_pass_within_threshold(db):
    result = gate(db, "aaa111", "ccc333", *limits("p99_itl=5%"))  # +4.75%
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("gate: PASS (1 metric)")
    assert "FAIL" not in result.stdout


def test_fail_names_each_failing_metric_and_by_how_much(db):
    # counted metrics: one run a side decides on the two values
    result = gate(db, "aaa111", "bbb222", *limits("sync_count=+1", "aborts=+0", "preemptions=+5"))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert "FAIL sync_count: 3 -> 5 (+2 > +1)" in lines
    assert "FAIL aborts: 0 -> 1 (+1 > +0)" in lines
    assert not any(line.startswith("FAIL preemptions") for line in lines)  # +1 is within +5
    assert lines[-1] == "gate: FAIL (2 of 3 metrics)"


def test_one_run_a_side_a_timed_crossing_is_inconclusive(db):
    """p99 ITL 10 -> 21.4 ms crosses 5%, but the baseline's six gaps are all 10 ms (1 distinct
    value; bbb222's six: 10 and 22, 2 distinct): no per-request evidence. Overlap has one value a
    run. Both inconclusive: exit 3; with a counted failure beside them, exit 1."""
    result = gate(db, "aaa111", "bbb222", *limits("p99_itl=5%", "overlap=-0.1"))
    assert result.exit_code == 3, result.output
    lines = result.stdout.splitlines()
    repeat = "; repeat the runs (run --repeats 3) to decide"
    assert (
        "inconclusive p99_itl: 10.00 ms -> 21.40 ms (+114.0% > 5%) but 1 run a side: requests' "
        "samples: 1 and 2 distinct values in 6 and 6 samples (equal values come from one step: "
        f"one measurement); 3 a side are needed{repeat}"
    ) in lines
    assert (
        "inconclusive overlap: 0.500 -> 0.375 (-0.125 < -0.100) but 1 run a side: one value a "
        f"run, no spread to tell it from noise{repeat}"
    ) in lines
    assert lines[-1] == "gate: INCONCLUSIVE (2 of 2 metrics)"
    result = gate(db, "aaa111", "bbb222", *limits("p99_itl=5%", "errors=+0"))
    assert result.exit_code == 1 and result.stdout.splitlines()[-1] == "gate: FAIL (1 of 2 metrics)"


@pytest.mark.parametrize(
    ("limit", "code"),
    [("sync_count=+2", 0), ("sync_count=1", 1), ("sync_count=67%", 0), ("sync_count=66%", 1)],
)
def test_a_change_exactly_at_the_limit_passes(db, limit, code):
    result = gate(db, "aaa111", "bbb222", *limits(limit))  # sync_count 3 -> 5: +2, +66.7%
    assert result.exit_code == code, result.output


def test_relative_and_absolute_messages(db):
    args = limits("sync_count=1", "errors=50%", "tok_throughput=10%")
    result = gate(db, "aaa111", "bbb222", *args)
    lines = result.stdout.splitlines()
    assert "FAIL sync_count: 3 -> 5 (+2 > +1)" in lines
    assert "FAIL errors: 0 -> 1 (+1 from 0 > 50%)" in lines  # any rise from 0 crosses a % limit
    tok = "inconclusive tok_throughput: 160.0 tok/s -> 129.0 tok/s (-19.4% < -10%) but 1 run"
    assert any(line.startswith(tok) for line in lines)


def test_higher_is_better_metric_within_its_limit(db):
    result = gate(db, "aaa111", "bbb222", *limits("req_throughput=20%"))  # 40 -> 32.26: -19.4%
    assert result.exit_code == 0, result.output


def test_metric_not_measured_in_the_candidate_fails(db):
    result = gate(db, "aaa111", "ccc333", *limits("peak_gpu_mem=5%", "p99_itl=5%"))
    assert result.exit_code == 1
    assert "FAIL peak_gpu_mem: not measured in candidate ccc333" in result.stdout.splitlines()
    assert result.stdout.strip().endswith("gate: FAIL (1 of 2 metrics)")
    result = gate(db, "ccc333", "aaa111", *limits("overlap=-0.05"))
    assert "FAIL overlap: not measured in baseline ccc333" in result.stdout.splitlines()


def test_allow_missing_skips_an_unmeasured_metric(db):
    args = [*limits("peak_gpu_mem=5%", "p99_itl=5%"), "--allow-missing"]
    result = gate(db, "aaa111", "ccc333", *args)
    assert result.exit_code == 0, result.output
    assert "skip peak_gpu_mem: not measured in candidate ccc333" in result.stdout.splitlines()
    assert result.stdout.strip().endswith("gate: PASS (1 metric, 1 skipped)")


def test_nothing_measured_in_both_runs_is_no_pass(db):
    result = gate(db, "aaa111", "ccc333", *limits("peak_gpu_mem=5%"), "--allow-missing")
    assert result.exit_code == 1
    assert result.stdout.strip().endswith("gate: FAIL (no metric measured in both runs, 1 skipped)")


def test_default_thresholds(db):
    # ccc333 is within every default but lacks GPU samples: only peak_gpu_mem fails
    result = gate(db, "aaa111", "ccc333")
    assert result.exit_code == 1
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert fails == ["FAIL peak_gpu_mem: not measured in candidate ccc333"]
    assert result.stdout.strip().endswith(f"gate: FAIL (1 of {len(DEFAULT_THRESHOLDS)} metrics)")
    # a default metric measured in neither run is skipped, not failed
    result = gate(db, "ccc333", "ccc333")
    assert result.exit_code == 0, result.output
    n = len(DEFAULT_THRESHOLDS) - 1
    assert result.stdout.strip().endswith(f"gate: PASS ({n} metrics, 1 skipped)")
    # bbb222 crosses every default limit except TTFT's, p50 ITL's and start-up's (+10% < 20%):
    # the counted ones fail; the timed ones, one run a side, are inconclusive
    result = gate(db, "aaa111", "bbb222")
    lines = result.stdout.splitlines()
    failed = {line.split()[1].rstrip(":") for line in lines if line.startswith("FAIL ")}
    unsure = {line.split()[1].rstrip(":") for line in lines if line.startswith("inconclusive ")}
    within = {"p50_ttft", "p95_ttft", "p99_ttft", "p50_itl", "startup_s"}
    assert failed == {"errors", "aborts", "preemptions", "compiles_after_warmup"}
    assert unsure == set(DEFAULT_THRESHOLDS) - within - failed
    assert result.exit_code == 1


def test_unknown_metric_is_bad_input(db):
    line = one_line_error(gate(db, "aaa111", "bbb222", *limits("p99_foo=5%")))
    assert "unknown metric 'p99_foo'" in line
    assert all(name in line for name in METRICS)


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("p99_itl=abc", "bad threshold 'abc'"),
        ("p99_itl", "expected METRIC=THRESHOLD"),
        ("p99_itl=-5%", "p99_itl regresses by a rise"),
        ("overlap=+0.05", "overlap regresses by a drop"),
        ("p99_itl=5%%", "bad threshold"),
    ],
)
def test_malformed_threshold_is_bad_input(db, flag, says):
    assert says in one_line_error(gate(db, "aaa111", "bbb222", *limits(flag)))


def test_thresholds_file_and_flags_override_it(db, tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("sync_count: +1\np50_itl: 5%\n")
    result = gate(db, "aaa111", "bbb222", "--thresholds", str(path), "--replace-defaults")
    assert result.exit_code == 1
    assert "FAIL sync_count: 3 -> 5 (+2 > +1)" in result.stdout.splitlines()
    assert result.stdout.strip().endswith("gate: FAIL (1 of 2 metrics)")
    result = gate(db, "aaa111", "bbb222", "--thresholds", str(path), *limits("sync_count=+2"))
    assert result.exit_code == 0, result.output
    result = gate(db, "aaa111", "bbb222", "--thresholds", str(path), *limits("sync_count=off"))
    assert result.stdout.strip().endswith("gate: PASS (1 metric)")
    # without --replace-defaults the file is laid over the defaults: 18 + sync_count
    result = gate(db, "ccc333", "ccc333", "--thresholds", str(path))
    n = len(DEFAULT_THRESHOLDS) + 1 - 1  # peak_gpu_mem measured in neither run: skipped
    assert result.stdout.strip().endswith(f"gate: PASS ({n} metrics, 1 skipped)"), result.output


def test_thresholds_file_numbers_and_off(db, tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("overlap: -0.2\nhost_bound_bubble_ms: 2\npreemptions: off\n")
    args = ("--thresholds", str(path), "--replace-defaults")
    result = gate(db, "aaa111", "bbb222", *args)  # -0.125 and +2 ms: within
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("gate: PASS (2 metrics)")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("p99_itl: [5%\n", "not valid YAML at line"),
        ("- p99_itl\n", "expected a mapping of metric: threshold"),
        ("", "got an empty file"),
        ("p99_itl: abc\n", "p99_itl: bad threshold 'abc'"),
        ("p99_itl: 5%\np99_foo: 5%\n", "unknown metric 'p99_foo'"),
        ("overlap: 0.05\nsync_count: -3\n", "sync_count regresses by a rise"),
    ],
)
def test_malformed_thresholds_file_is_bad_input(db, tmp_path, text, says):
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    line = one_line_error(gate(db, "aaa111", "bbb222", "--thresholds", str(path)))
    assert str(path) in line and says in line


def test_missing_thresholds_file_is_bad_input(db, tmp_path):
    path = tmp_path / "nope.yaml"
    line = one_line_error(gate(db, "aaa111", "bbb222", "--thresholds", str(path)))
    assert str(path) in line and "cannot read" in line


def test_unknown_run_is_bad_input(db):
    assert "no run 'zzz'" in one_line_error(gate(db, "aaa111", "zzz"))


def test_json_results(db):
    result = gate(db, "aaa111", "bbb222", *limits("p99_itl=5%", "sync_count=+2"), "--json")
    assert result.exit_code == 3
    data = json.loads(result.stdout)
    assert data["passed"] is False and data["verdict"] == "gate: INCONCLUSIVE (1 of 2 metrics)"
    by_metric = {r["metric"]: r for r in data["results"]}
    assert by_metric["p99_itl"]["status"] == "inconclusive"
    assert by_metric["p99_itl"]["sample_verdict"] == "inconclusive"
    assert by_metric["p99_itl"]["candidate"] == pytest.approx(21.4)
    assert by_metric["sync_count"]["status"] == "pass"


def test_help_lists_every_metric_and_the_threshold_syntax():
    result = runner.invoke(app, ["gate", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for name in METRICS:
        assert f" {name} " in text, name
    assert "--max-regression p99_itl=5%" in text and "Exit codes: 0 pass, 1 fail, 2" in text


def test_quickstart_run_against_itself_passes(run_in_process):
    job, _ = run_in_process("runner.device=cpu")  # auto on a CPU is a fallback note: static fails
    compared = runner.invoke(app, ["compare", "latest", "latest", "--db", job.db_path, "--json"])
    assert compared.exit_code == 0, compared.output
    rows = json.loads(compared.stdout)["metrics"]
    measured = [row for row in rows if row["a"] is not None]
    assert {"p99_itl", "p99_ttft", "tok_throughput", "startup_s"} <= {r["metric"] for r in measured}
    assert all(row["delta"] == 0 and row["verdict"] == "same" for row in measured)
    result = gate(job.db_path, "latest", "latest")
    assert result.exit_code == 0, result.output
    assert "gate: PASS" in result.stdout.splitlines()[-1]
