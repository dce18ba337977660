"""Store: schema creation, run lifecycle, columnar appends, durability (opening a file: its own
module)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mrv2_prof.store import SCHEMA_VERSION, TABLES, Store, StoreError
from mrv2_prof.store import db as store_db
from tests.store.db_helpers import begin as _begin
from tests.store.db_helpers import child as _child
from tests.store.db_helpers import one_line as _one_line


def test_store_imports_without_torch() -> None:
    code = "import sys, mrv2_prof.store; assert 'torch' not in sys.modules, 'torch imported'"
    proc = _child(code, stderr=subprocess.PIPE)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr


def test_open_creates_schema_of_every_table(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        con = store.connection
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )
        for table, columns in TABLES.items():
            described = [(row[0], row[1]) for row in con.execute(f"DESCRIBE {table}").fetchall()]
            assert described == columns, table
        names = {row[0] for row in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert names == set(TABLES) | {"meta"}
        _begin(store, "abc123")
    with Store.open(path) as store:  # reopening keeps the data and does not recreate tables
        assert [run["run_id"] for run in store.list_runs()] == ["abc123"]


def test_round_trip_numpy_and_list_columns(tmp_path: Path) -> None:
    with Store.open(tmp_path / "runs.duckdb") as store:
        _begin(store, "abc123", info={"dtype": "float32"})
        steps = np.arange(3, dtype=np.int64)
        assert (
            store.append(
                "abc123",
                "steps",
                {
                    "step": steps,
                    "cpu_start_ns": steps * 1_000 + 5_000_000_000_000,
                    "overlap_frac": np.array([0.0, 0.5, 1.0]),
                    "graph_mode": ["full", "piecewise", None],
                },
            )
            == 3
        )
        store.append(
            "abc123",
            "copies",
            {"direction": ["h2d", "d2h"], "bytes": [4096, 8], "pinned": np.array([True, False])},
        )
        store.append("abc123", "tokens", {"req_id": np.array(["7", "7"]), "idx": [0, 1]})
        assert store.append("abc123", "spans", {"name": [], "start_ns": np.array([])}) == 0
        store.update_run("abc123", info={"dtype": "float32", "num_kv_blocks": 64}, device="cuda")
        store.finish_run("abc123", "failed", ended_ns=9_000, error="RuntimeError: boom")

        con = store.connection
        assert con.execute(
            "SELECT run_id, step, cpu_start_ns, overlap_frac, graph_mode, num_reqs FROM steps "
            "ORDER BY step"
        ).fetchall() == [
            ("abc123", 0, 5_000_000_000_000, 0.0, "full", None),
            ("abc123", 1, 5_000_000_001_000, 0.5, "piecewise", None),
            ("abc123", 2, 5_000_000_002_000, 1.0, None, None),
        ]
        assert con.execute("SELECT direction, bytes, pinned FROM copies").fetchall() == [
            ("h2d", 4096, True),
            ("d2h", 8, False),
        ]
        assert con.execute("SELECT req_id, idx FROM tokens").fetchall() == [("7", 0), ("7", 1)]
        assert con.execute("SELECT count(*) FROM spans").fetchone() == (0,)
        run = con.execute(
            "SELECT status, started_ns, ended_ns, error, device, label, matrix_combo, versions, "
            "info FROM runs"
        ).fetchone()
        assert run[:6] == (
            "failed",
            1_000,
            9_000,
            "RuntimeError: boom",
            "cuda",
            "decode-heavy[runner.async_scheduling=false]",
        )
        assert json.loads(run[6]) == {"runner.async_scheduling": False}
        assert json.loads(run[7]) == {"mrv2_prof": "0.1.0"}
        assert json.loads(run[8]) == {"dtype": "float32", "num_kv_blocks": 64}


def test_append_large_batch(tmp_path: Path) -> None:
    with Store.open(tmp_path / "runs.duckdb") as store:
        _begin(store, "abc123")
        n = 200_000
        store.append("abc123", "tokens", {"req_id": ["r"] * n, "idx": np.arange(n)})
        assert store.connection.execute("SELECT count(*), sum(idx) FROM tokens").fetchone() == (
            n,
            n * (n - 1) // 2,
        )


@pytest.mark.parametrize(
    ("table", "columns", "match"),
    [
        ("stepz", {"step": [1]}, "cannot append to table 'stepz'"),
        ("runs", {"label": ["x"]}, "cannot append to table 'runs'"),
        ("steps", {"stepp": [1]}, r"unknown columns \['stepp'\]"),
        ("steps", {"run_id": ["x"], "step": [1]}, "run_id is filled in by the store"),
        ("steps", {"step": [1, 2], "num_reqs": [1]}, "differ in length"),
        ("steps", {}, "no columns"),
    ],
)
def test_append_rejects_bad_batches(tmp_path: Path, table: str, columns: dict, match: str) -> None:
    with Store.open(tmp_path / "runs.duckdb") as store, pytest.raises(ValueError, match=match):
        store.append("abc123", table, columns)


def test_lifecycle_rejects_bad_calls(tmp_path: Path) -> None:
    with Store.open(tmp_path / "runs.duckdb") as store:
        _begin(store, "abc123")
        with pytest.raises(ValueError, match="already exists"):
            _begin(store, "abc123")
        with pytest.raises(ValueError, match="finish status"):
            store.finish_run("abc123", "running", ended_ns=1)
        with pytest.raises(ValueError, match="cannot set"):
            store.update_run("abc123", status="completed")
        with pytest.raises(ValueError, match="no run 'nope12'"):
            store.finish_run("nope12", "completed", ended_ns=1)


def test_appends_survive_a_killed_writer(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    code = (
        "import os, sys, numpy as np\n"
        "from mrv2_prof.store import Store\n"
        "store = Store.open(sys.argv[1])\n"
        "store.begin_run('abc123', scenario_name='s', label='s', matrix_combo=None,\n"
        "    scenario_yaml='', device='cpu', versions={}, started_ns=1)\n"
        "store.append('abc123', 'steps', {'step': np.arange(5)})\n"
        "store.append('abc123', 'requests', {'req_id': ['0', '1'], 'output_tokens': [3, 4]})\n"
        "os._exit(1)\n"
    )
    proc = _child(code, str(path), stderr=subprocess.PIPE)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    with Store.open(path, read_only=True) as store:
        (run,) = store.list_runs()
        assert (run["run_id"], run["status"], run["ended_ns"]) == ("abc123", "running", None)
        assert (run["num_requests"], run["output_tokens"]) == (2, 7)
        assert store.connection.execute("SELECT count(*) FROM steps").fetchone() == (5,)


V1_NEW_STEPS_COLUMNS = ("bubble_kind", "host_prep_ns", "hidden_prep_ns")


def test_new_run_id_is_short_hex_and_skips_existing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.open(tmp_path / "runs.duckdb") as store:
        run_id = store.new_run_id()
        assert len(run_id) == 6 and all(c in "0123456789abcdef" for c in run_id)
        _begin(store, "abc123")
        drawn = iter(["abc123", "abc123", "def456"])
        monkeypatch.setattr(store_db.secrets, "token_hex", lambda nbytes: next(drawn))
        assert store.new_run_id() == "def456"


def test_resolve_and_list_runs(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        with pytest.raises(StoreError) as err:
            store.resolve_run("latest")
        assert _one_line(err).startswith(f"no runs in {path} yet")
        # Runs are ordered by wall-clock start (started_at); perf_counter_ns restarts at boot.
        _begin(store, "aaa111", started_ns=100)
        _begin(store, "aab222", started_ns=300)
        _begin(store, "bbb333", started_ns=200)
        store.append("bbb333", "requests", {"req_id": ["0", "1"], "output_tokens": [5, 6]})
        at = dict(store.connection.execute("SELECT run_id, started_at FROM runs").fetchall())
        assert at["aaa111"] <= at["aab222"] <= at["bbb333"]

        assert store.resolve_run("latest") == "bbb333"
        assert store.resolve_run("bbb333") == "bbb333"
        assert store.resolve_run("b") == "bbb333"
        assert store.resolve_run("aaa") == "aaa111"
        with pytest.raises(StoreError) as err:
            store.resolve_run("zzz")
        assert _one_line(err) == f"no run 'zzz' in {path}; see mrv2-prof runs --db {path}"
        with pytest.raises(StoreError) as err:
            store.resolve_run("aa")
        assert _one_line(err) == (
            f"run prefix 'aa' is ambiguous in {path} (aaa111, aab222); type more characters"
        )

        runs = store.list_runs()
        assert [run["run_id"] for run in runs] == ["bbb333", "aab222", "aaa111"]
        assert runs[0].pop("started_at") == at["bbb333"]
        assert runs[0] == {
            "run_id": "bbb333",
            "label": "decode-heavy[runner.async_scheduling=false]",
            "scenario_name": "decode-heavy",
            "status": "running",
            "started_ns": 200,
            "ended_ns": None,
            "device": "cpu",
            "error": None,
            "num_requests": 2,
            "output_tokens": 11,
            "writer_gone": False,  # this process wrote it
        }
        assert (runs[1]["num_requests"], runs[1]["output_tokens"]) == (0, 0)


def test_append_right_after_reopening_an_existing_file(tmp_path: Path) -> None:
    """Opening checks the schema version; that read must not leave the connection busy (the
    parent appends NVML samples to a run the runner process wrote, right after opening)."""
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _begin(store, "aaaaaa")
    with Store.open(path) as store:
        assert store.resolve_run("latest") == "aaaaaa"
        assert store.append("aaaaaa", "gpu_samples", {"t_ns": [1, 2], "gpu_util": [5.0, 7.5]}) == 2
    with Store.open(path) as store:
        assert store.append("aaaaaa", "gpu_samples", {"t_ns": [3], "power_w": [300.0]}) == 1
        rows = store.connection.execute(
            "SELECT t_ns, gpu_util, power_w FROM gpu_samples ORDER BY t_ns"
        ).fetchall()
    assert rows == [(1, 5.0, None), (2, 7.5, None), (3, None, 300.0)]


def test_a_requests_row_is_replaced_by_the_later_row_of_its_req_id(tmp_path: Path) -> None:
    """A request's row is written when it arrives and again when it finishes: one row each."""
    with Store.open(tmp_path / "runs.duckdb") as store:
        _begin(store, "abc123")
        _begin(store, "def456")
        store.append("def456", "requests", {"req_id": ["a"], "output_tokens": [9]})
        store.append("abc123", "requests", {"req_id": ["a", "b"], "arrival_ns": [1, 2]})
        store.append_batches(
            "abc123",
            {
                "requests": {"req_id": ["a"], "arrival_ns": [1], "output_tokens": [3]},
                "tokens": {"req_id": ["a"] * 3, "idx": [0, 1, 2]},
            },
        )
        rows = store.connection.execute(
            "SELECT run_id, req_id, arrival_ns, output_tokens FROM requests ORDER BY ALL"
        ).fetchall()
    assert rows == [("abc123", "a", 1, 3), ("abc123", "b", 2, None), ("def456", "a", None, 9)]
