"""A ``--db`` whose name is not valid UTF-8 (a file system allows any bytes; DuckDB takes UTF-8
names only) is one line naming it, exit 2, and nothing is created, for a reading command and for
a run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NAME = os.fsdecode(b"runs-\xff.duckdb")  # surrogate-escaped, as Python hands it over


@pytest.mark.parametrize("args", [["runs"], ["show", "latest"], ["run", "--headless"]])
def test_a_database_name_that_is_not_utf8_is_one_line_and_exit_2(tmp_path, args):
    done = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args, "--db", NAME],
        cwd=tmp_path, capture_output=True, text=True, errors="replace", timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: runs-\\udcff.duckdb: the name is not valid UTF-8, which DuckDB cannot open; "
        "rename the file or pass a different --db"
    ]
    assert os.listdir(tmp_path) == []
