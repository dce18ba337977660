"""Packages a run's start-up does not need stay unimported, in fresh interpreters: stand-in
packages on the path record every attempt to import them (and then fail, as a missing package
would), so the tests do not depend on what is installed.

* pandas: pyarrow's first array tries to import it (``pipeline.arrow_no_pandas`` stops that in
  the runner process); with the guard arrays, tables and DuckDB's scan of them leave pandas
  alone and an explicit import still reaches it;
* gguf: only a GGUF model's load imports it (``runner/model/loader.py``);
* a headless run of a preset through the CLI imports neither, in either process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE = """
import os
with open(os.environ["{marker}"], "a") as f:
    f.write("imported\\n")
raise ImportError("a stand-in: {name} is not here")
"""


def _env(tmp_path: Path) -> dict[str, str]:
    markers = {}
    for name in ("pandas", "gguf"):
        (tmp_path / "fake" / name).mkdir(parents=True, exist_ok=True)
        marker = f"{name.upper()}_MARKER"
        (tmp_path / "fake" / name / "__init__.py").write_text(
            FAKE.replace("{marker}", marker).replace("{name}", name)
        )
        markers[marker] = str(tmp_path / f"{name}.marker")
    path = os.pathsep.join([str(tmp_path / "fake"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **markers}


def _python(tmp_path: Path, code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env=_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _attempts(tmp_path: Path, name: str = "pandas") -> int:
    marker = tmp_path / f"{name}.marker"
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def test_without_the_guard_pyarrows_first_array_tries_to_import_pandas(tmp_path):
    _python(tmp_path, "import pyarrow as pa; pa.array([1, 2])")
    assert _attempts(tmp_path) >= 1


def test_with_the_guard_arrays_tables_and_duckdb_leave_pandas_alone(tmp_path):
    code = """
import numpy as np, pyarrow as pa, duckdb
from mrv2_prof.pipeline.arrow_no_pandas import arrow_without_pandas
print(arrow_without_pandas())
t = pa.table({"x": pa.array(np.arange(3), mask=np.array([True, False, False])),
              "s": pa.array(["a", None, "c"])})
con = duckdb.connect()
con.register("t", t)
print(con.execute("SELECT count(x), count(s), sum(x) FROM t").fetchall())
"""
    assert _python(tmp_path, code).splitlines() == ["True", "[(2, 2, 3)]"]
    assert _attempts(tmp_path) == 0  # the guard refused it before the stand-in was reached
    # the guard is gone afterwards: an explicit import reaches the (stand-in) package
    code += "\ntry:\n    import pandas\nexcept ImportError as e:\n    print(e)\n"
    assert _python(tmp_path, code).splitlines()[-1] == "a stand-in: pandas is not here"
    assert _attempts(tmp_path) >= 1


def test_the_guard_leaves_a_process_that_imported_pandas_as_it_is(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "pandas.py").write_text("__version__ = '0'\n")
    code = f"""
import sys
sys.path.insert(0, {str(tmp_path / "real")!r})
import pandas
from mrv2_prof.pipeline.arrow_no_pandas import arrow_without_pandas
print(arrow_without_pandas(), sys.modules["pandas"].__file__.endswith("pandas.py"))
"""
    assert _python(tmp_path, code) == "False True"


def test_a_headless_run_imports_neither_pandas_nor_gguf_in_either_process(tmp_path):
    db = tmp_path / "runs.duckdb"
    proc = subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "run", "--headless", "--db", str(db)],
        capture_output=True, text=True, timeout=300, env=_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "requests 16/16 done" in proc.stdout + proc.stderr
    assert (_attempts(tmp_path, "pandas"), _attempts(tmp_path, "gguf")) == (0, 0)
