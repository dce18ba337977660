"""Usage errors of the console script (an unknown option or command, a missing value or
argument) are one line on stderr and exit 2, like every other bad input; help still works."""

from __future__ import annotations

import subprocess
import sys

import pytest


def mrv2_prof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("run", "--bogus"), "No such option: --bogus (see 'mrv2-prof run --help')"),
        (("runs", "--db"), "Option '--db' requires an argument."),
        (("show",), "Missing argument 'RUN_ID'. (see 'mrv2-prof show --help')"),
        (("frob",), "No such command 'frob'."),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args, says):
    result = mrv2_prof(*args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert lines == [lines[0]] and lines[0].startswith("error: ") and says in lines[0], lines
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_help_still_prints_and_exits_0():
    result = mrv2_prof("run", "--help")
    assert result.returncode == 0 and "Usage: mrv2-prof run" in result.stdout


COMMANDS = ("run", "runs", "show", "compare", "gate", "report", "export", "tui", "nsys import")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_flags_as_flags_and_plain_usage(command):
    result = mrv2_prof(*command.split(), "--help")
    assert result.returncode == 0, result.stderr
    assert "<bool>" not in result.stdout  # a flag takes no value
    usage = result.stdout.splitlines()[0]
    assert usage.startswith(f"Usage: mrv2-prof {command} ") and not set("{}") & set(usage), usage


def test_run_help_lists_its_flags_bare():
    lines = mrv2_prof("run", "--help").stdout.splitlines()
    flags = [line.split()[0] for line in lines if line.strip().startswith("--")]
    assert {"--headless", "--strict", "--help"} <= set(flags)
    assert [line for line in lines if line.startswith("Usage:")] == [
        "Usage: mrv2-prof run [OPTIONS] [SCENARIO]"
    ]


def test_a_value_after_a_flag_is_a_one_line_error_not_a_scenario(tmp_path):
    result = mrv2_prof("run", "--headless", "true", "--db", str(tmp_path / "r.duckdb"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: SCENARIO 'true': --headless and --strict are flags and take no value "
        "(write --headless, not --headless true)"
    )
    assert not (tmp_path / "r.duckdb").exists()


def test_help_rewraps_prose_and_keeps_examples_and_tables():
    from mrv2_prof.cli.help_text import layout

    doc = """Prose that was
    broken raggedly.

    Example:  mrv2-prof run s.yaml --db a.duckdb

    Table:
      a  1
    """
    assert layout(doc) == (
        "Prose that was\nbroken raggedly.\n\n"
        "\b\nExample:  mrv2-prof run s.yaml --db a.duckdb\n\n"
        "\b\nTable:\n  a  1"
    )
    gate = mrv2_prof("gate", "--help").stdout  # the metrics table keeps its rows
    assert "  p50_itl  p95_itl  p99_itl   ms, up  (5%, 10%, 10%)  inter-token latency\n" in gate
    run = mrv2_prof("run", "--help").stdout  # a prose paragraph is one re-wrapped block
    assert "The runner works in its own process; this one shows a live dashboard" in " ".join(
        run.split()
    )
