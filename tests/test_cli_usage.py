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
