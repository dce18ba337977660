"""The probes' columns come from the store's one declaration of each table: the record buffers,
the drain and the CREATE TABLE statements follow ``store.schema.TABLES``."""

from __future__ import annotations

import numpy as np

from mrv2_prof.probes.columns import dtypes, from_rows
from mrv2_prof.probes.recording import REQUEST_COLUMNS, STEP_COLUMNS, RecordingProbe
from mrv2_prof.store import schema

NUMPY = {"BIGINT": np.int64, "INTEGER": np.int32, "DOUBLE": np.float64, "BOOLEAN": np.bool_}


def test_every_buffer_holds_its_tables_columns_in_the_declared_types():
    p = RecordingProbe()
    drained = p.drain()
    for table, cols in drained.items():
        declared = dict(schema.TABLES[table])
        chosen = {"steps": STEP_COLUMNS, "requests": REQUEST_COLUMNS}
        want = chosen.get(table, [n for n in declared if n != "run_id"])
        assert list(cols) == list(want), table
        buffer = p._tables[table]
        for name, values in cols.items():
            if declared[name] == "VARCHAR":
                assert values.dtype == object and buffer.cols[name].dtype == np.int32
            else:
                assert values.dtype == NUMPY[declared[name]], (table, name)
                assert buffer.cols[name].dtype == values.dtype, (table, name)
    assert set(STEP_COLUMNS) < set(dict(schema.TABLES["steps"]))
    # the requests' text columns are decoded on the writer thread, never recorded by the probe
    requests = [n for n in dict(schema.TABLES["requests"]) if n != "run_id"]
    assert list(REQUEST_COLUMNS) == [n for n in requests if not n.endswith("_text")]


def test_a_column_declared_once_is_recorded_drained_and_created(monkeypatch):
    columns = [*schema.TABLES["syncs"], ("depth", "INTEGER"), ("note", "VARCHAR")]
    monkeypatch.setitem(schema.TABLES, "syncs", columns)
    p = RecordingProbe()
    p.sync("implicit", "mrv2_prof/x.py:1", -1)
    b = p.syncs
    b.depth[0], b.note[0] = 3, p.intern("deep")
    cols = p.drain()["syncs"]
    assert cols["depth"].tolist() == [3] and cols["note"].tolist() == ["deep"]
    assert cols["depth"].dtype == np.int32
    ddl = schema.table_ddl("syncs")
    assert ddl.endswith('"blocked_ns" BIGINT, "depth" INTEGER, "note" VARCHAR)')


def test_rows_become_columns_of_the_declared_types():
    cols = from_rows("kernels", [(3, "forward", "gemm", 10, 20, 7), (-1, None, "k", 30, 31, 7)])
    assert list(cols) == list(dtypes("kernels")) == [
        "step", "phase", "name", "start_ns", "end_ns", "stream",
    ]  # fmt: skip
    assert cols["phase"].tolist() == ["forward", None] and cols["step"].dtype == np.int64
    empty = from_rows("gpu_samples", [])
    assert {k: (len(v), v.dtype) for k, v in empty.items()} == {
        "t_ns": (0, np.int64), "gpu_util": (0, np.float64), "mem_used_bytes": (0, np.int64),
        "power_w": (0, np.float64), "sm_clock_mhz": (0, np.float64), "energy_mj": (0, np.int64),
    }  # fmt: skip
