"""The background writer: batches queued during a run are all in the file after close()."""

from __future__ import annotations

import numpy as np
import pytest

from mrv2_prof.store import BackgroundWriter, Store


def _store(tmp_path) -> Store:
    store = Store.open(tmp_path / "runs.duckdb")
    store.begin_run(
        "abc123",
        scenario_name="s",
        label="s",
        matrix_combo=None,
        scenario_yaml="",
        device="cpu",
        versions={},
        started_ns=0,
    )
    return store


def test_every_submitted_batch_is_written_in_order(tmp_path):
    store = _store(tmp_path)
    writer = BackgroundWriter(store, "abc123").start()
    for k in range(20):
        steps = np.arange(10 * k, 10 * k + 10)
        writer.submit(
            {
                "steps": {"step": steps, "num_tokens": steps * 2},
                "tokens": {"req_id": np.array(["r"] * 10, dtype=object), "idx": steps},
            }
        )
    writer.close()
    assert writer.rows_written == 400
    con = store.connection
    assert con.execute("SELECT count(*), sum(step), sum(num_tokens) FROM steps").fetchone() == (
        200,
        sum(range(200)),
        2 * sum(range(200)),
    )
    assert con.execute("SELECT list(idx ORDER BY idx) FROM tokens").fetchone()[0] == list(
        range(200)
    )


def test_a_failed_write_is_raised_and_later_batches_are_not_half_applied(tmp_path):
    store = _store(tmp_path)
    writer = BackgroundWriter(store, "abc123").start()
    writer.submit({"steps": {"step": [1]}, "no_such_table": {"x": [1]}})
    with pytest.raises(ValueError, match="no_such_table"):
        writer.close()
    # the failing set was one transaction: its valid part is not in the file either
    assert store.connection.execute("SELECT count(*) FROM steps").fetchone() == (0,)
    with pytest.raises(ValueError):
        writer.submit({"steps": {"step": [2]}})


def test_no_module_is_imported_while_the_run_writes(tmp_path):
    """DuckDB's first Arrow registration imports pandas when it is installed (hundreds of ms under
    the import lock, which stalled the step loop on the GPU host): start() does it up front."""
    import sys

    store = _store(tmp_path)
    writer = BackgroundWriter(store, "abc123").start()
    before = set(sys.modules)
    writer.submit({"steps": {"step": np.arange(3)}})
    writer.close()
    assert store.connection.execute("SELECT count(*) FROM steps").fetchone() == (3,)
    assert set(sys.modules) - before == set()


def test_release_gets_each_item_back_after_its_rows_are_written(tmp_path):
    store = _store(tmp_path)
    written_at_release = []

    def convert(item):
        return {"steps": {"step": item["step"], "num_tokens": item["step"]}}

    def release(item):
        count = store.connection.execute("SELECT count(*) FROM steps").fetchone()[0]
        written_at_release.append((int(item["step"][0]), count))

    writer = BackgroundWriter(store, "abc123", convert, release).start()
    for k in range(3):
        writer.submit({"step": np.arange(5 * k, 5 * k + 5)})
    writer.close()
    assert written_at_release == [(0, 5), (5, 10), (10, 15)]
