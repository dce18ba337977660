"""A live run's requests rows, flush by flush, through the store: one row per request from its
arrival, ``output_tokens`` = its token rows so far, replaced by the finished row."""

from __future__ import annotations

from mrv2_prof.pipeline.probe_results import arrow_tables
from mrv2_prof.pipeline.request_rows import InFlightRows
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.store import Store


def _flush(store: Store, probe: RecordingProbe, rows: InFlightRows) -> None:
    batches = probe.drain()
    rows.add_to(batches, probe)
    store.append_batches("abc123", arrow_tables(batches))


def _requests(store: Store) -> list[tuple]:
    return store.connection.execute(
        "SELECT req_id, arrival_ns, first_token_ns, finish_ns, prompt_tokens, output_tokens, "
        "finish_reason FROM requests ORDER BY req_id"
    ).fetchall()


def test_requests_rows_from_arrival_to_finish(tmp_path):
    probe, rows = RecordingProbe(), InFlightRows()
    with Store.open(tmp_path / "runs.duckdb") as store:
        store.begin_run(
            "abc123",
            scenario_name="s",
            label="s",
            matrix_combo=None,
            scenario_yaml="",
            device="cpu",
            versions={},
            started_ns=1,
        )
        probe.request_arrival("a", 100, 5)
        probe.request_arrival("b", 200, 7)
        probe.token("a", 0, 150, 11)
        probe.token("a", 1, 160, 12)
        _flush(store, probe, rows)
        assert _requests(store) == [
            ("a", 100, 150, None, 5, 2, None),  # in flight: its two tokens so far
            ("b", 200, None, None, 7, 0, None),  # arrived, no token yet
        ]
        probe.token("a", 2, 170, 13)
        probe.request_finish("a", 180, 3, 0, "length", 0)
        probe.token("b", 0, 210, 1)
        probe.request_arrival("c", 300, 4)
        probe.request_finish("c", 305, 0, 0, "abort", 0)  # arrived and ended in one flush
        _flush(store, probe, rows)
        assert _requests(store) == [
            ("a", 100, 150, 180, 5, 3, "length"),  # the finished row replaced it
            ("b", 200, 210, None, 7, 1, None),
            ("c", 300, None, 305, 4, 0, "abort"),
        ]
        _flush(store, probe, rows)  # nothing new: nothing rewritten, nothing lost
        assert len(_requests(store)) == 3
        tokens = store.connection.execute(
            "SELECT req_id, count(*) FROM tokens GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        assert tokens == [("a", 3), ("b", 1)]
