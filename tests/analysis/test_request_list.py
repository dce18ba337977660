"""The requests' text columns in the store: an older file upgraded (or read) with them NULL, and
the request lists the views read (``store.request_list``) over the hand-made text run."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from mrv2_prof.analysis.request_list import (
    first_answers,
    has_text,
    request_page,
    request_sample,
    token_times,
)
from mrv2_prof.store import SCHEMA_VERSION, Store
from tests.text_runs import MS, PLAIN_RUN, TEXT_RUN, add_text_run, answer, prompt

TEXT_COLUMNS = ("prompt_text", "output_text")


def _version_5_file(path: Path) -> None:
    """A run written before the text columns existed (schema version 5)."""
    with Store.open(path) as store:
        add_text_run(store, with_text=False)
    con = duckdb.connect(str(path))
    for column in TEXT_COLUMNS:
        con.execute(f"ALTER TABLE requests DROP COLUMN {column}")
    con.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    con.close()


def _request_columns(con) -> list[str]:
    return [r[0] for r in con.execute("DESCRIBE requests").fetchall()]


def test_a_version_5_file_is_upgraded_and_its_requests_read_null_text(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    _version_5_file(path)
    with Store.open(path) as store:
        assert store.upgraded_from == 5
        con = store.connection
        assert con.execute("SELECT value FROM meta").fetchall() == [(str(SCHEMA_VERSION),)]
        assert _request_columns(con)[-2:] == list(TEXT_COLUMNS)  # added at the end
        rows = con.execute(
            "SELECT count(*), count(prompt_text), count(output_text) FROM requests"
        ).fetchone()
        assert rows == (11, 0, 0)  # every request kept, no text
        assert not has_text(store, TEXT_RUN)
        add_text_run(store, "new001")  # a run appended after the upgrade has its text
        assert has_text(store, "new001") and not has_text(store, TEXT_RUN)


def test_a_version_5_file_is_read_as_it_is_with_null_text(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    _version_5_file(path)
    before = path.read_bytes()
    with Store.open(path, read_only=True) as store:
        con = store.connection
        assert con.execute("SELECT value FROM meta").fetchall() == [("5",)]
        assert set(TEXT_COLUMNS) <= set(_request_columns(con))
        assert con.execute(
            "SELECT req_id, prompt_text, output_text FROM requests WHERE req_id = 'r00'"
        ).fetchall() == [("r00", None, None)]
        assert not has_text(store, TEXT_RUN)
        assert first_answers(store, TEXT_RUN) == ([], 0)
        rows, total = request_page(store, TEXT_RUN, 0, 3)
        assert total == 11 and [r.prompt_text for r in rows] == [None] * 3
    assert path.read_bytes() == before


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(tmp_path / "runs.duckdb") as store:
        add_text_run(store)
        add_text_run(store, PLAIN_RUN, with_text=False)
        yield store


def test_has_text(store) -> None:
    assert has_text(store, TEXT_RUN) and not has_text(store, PLAIN_RUN)


def test_the_sample_is_the_three_slowest_then_five_nearest_the_median(store) -> None:
    sample = request_sample(store, TEXT_RUN)
    assert [(kind, r.req_id) for kind, r in sample] == [
        ("slowest", "r09"), ("slowest", "r08"), ("slowest", "r07"),
        ("typical", "r02"), ("typical", "r03"), ("typical", "r04"), ("typical", "r05"),
        ("typical", "r06"),
    ]  # fmt: skip
    _, slowest = sample[0]
    assert slowest.e2e_ms == pytest.approx(1000.0) and slowest.ttft_ms == pytest.approx(10.0)
    assert slowest.tpot_ms == pytest.approx((1000 - 10) / 2)
    assert (slowest.prompt_text, slowest.output_text) == (prompt(9), answer(9))


def test_first_answers_are_the_first_arrivals_with_an_output(store) -> None:
    rows, total = first_answers(store, TEXT_RUN)
    assert [r.req_id for r in rows] == ["r00", "r01", "r02"] and total == 10
    assert rows[1].output_text == answer(1)


def test_request_page_orders_with_nulls_last_and_counts_every_request(store) -> None:
    rows, total = request_page(store, TEXT_RUN, 0, 4, order="e2e", descending=True)
    assert total == 11 and [r.req_id for r in rows] == ["r09", "r08", "r07", "r06"]
    rows, _ = request_page(store, TEXT_RUN, 9, 5, order="e2e", descending=True)
    assert [r.req_id for r in rows] == ["r00", "r10"]  # the unfinished one has no E2E: last
    assert (rows[1].finish_reason, rows[1].e2e_ms, rows[1].output_text) == (None, None, None)
    assert rows[1].prompt_text == prompt(10)


def test_token_times_of_one_request(store) -> None:
    assert token_times(store, TEXT_RUN, "r10") == [(0, 20 * MS, 100), (1, 21 * MS, 101)]
    assert token_times(store, TEXT_RUN, "nope") == []
