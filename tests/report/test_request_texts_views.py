"""The requests' decoded text in the report (a sample of requests, HTML-escaped) and in the
exported trace (a slice per request with its texts), over the hand-made text run of
tests/text_runs.py, whose docstring works out the sample."""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path

import pytest

from mrv2_prof.report.html_report import render_run_report
from mrv2_prof.report.trace_export import export_trace
from mrv2_prof.store import Store
from tests.text_runs import MS, PLAIN_RUN, TEXT_RUN, add_text_run, answer, prompt, question


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        add_text_run(store)
        add_text_run(store, PLAIN_RUN, with_text=False)
    return path


def _report(db: Path, run_id: str) -> str:
    with Store.open(db, read_only=True) as store:
        return render_run_report(store, run_id)


def _sample_rows(page: str) -> list[list[str]]:
    table = re.search(r'<table id="request-sample">(.*?)</table>', page, re.S).group(1)
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)[1:]
    return [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]


def test_the_report_shows_the_slowest_and_typical_requests_with_escaped_text(db: Path) -> None:
    page = _report(db, TEXT_RUN)
    rows = _sample_rows(page)
    assert [(r[0], r[1]) for r in rows] == [
        ("slowest", "r09"), ("slowest", "r08"), ("slowest", "r07"), ("typical", "r02"),
        ("typical", "r03"), ("typical", "r04"), ("typical", "r05"), ("typical", "r06"),
    ]  # fmt: skip
    # r09: TTFT 10 ms, TPOT (1000 - 10) / 2 ms, E2E 1000 ms; the user message, then the output
    # (its terminal escape's ESC character removed)
    assert rows[0][2:] == [
        "10.0 ms", "495.0 ms", "1,000 ms",
        html.escape(question(9)), html.escape(answer(9).replace("\x1b", "")),
    ]  # fmt: skip
    assert "&lt;script&gt;alert(9)&lt;/script&gt;" in page and "<script>alert(" not in page
    assert "<b>9</b>" not in page


def test_a_long_text_is_shortened_in_the_report(db: Path, tmp_path: Path) -> None:
    with Store.open(db) as store:
        store.connection.execute(
            "UPDATE requests SET output_text = repeat('a', 5000) WHERE req_id = 'r09'"
        )
    output = _sample_rows(_report(db, TEXT_RUN))[0][-1]
    assert output == "a" * 299 + "…"


def test_a_run_without_text_has_no_sample(db: Path) -> None:
    page = _report(db, PLAIN_RUN)
    assert 'id="request-sample"' not in page and "Sample of requests" not in page


def _trace(db: Path, run_id: str) -> dict:
    out = io.StringIO()
    with Store.open(db, read_only=True) as store:
        export_trace(store, run_id, out)
    return json.loads(out.getvalue())


def _requests(doc: dict) -> dict[str, dict]:
    return {e["args"]["req_id"]: e for e in doc["traceEvents"] if e.get("cat") == "request"}


def test_the_trace_has_a_slice_per_request_with_its_texts(db: Path) -> None:
    doc = _trace(db, TEXT_RUN)
    events = _requests(doc)
    assert sorted(events) == [f"r{i:02d}" for i in range(11)]
    r09 = events["r09"]
    assert r09["name"] == "request r09" and r09["pid"] == 3 and r09["ph"] == "X"
    assert r09["args"] == {
        "req_id": "r09", "prompt_tokens": 29, "output_tokens": 3, "finish_reason": "length",
        "ttft_ms": 10.0, "e2e_ms": 1000.0, "prompt_text": prompt(9), "output_text": answer(9),
    }  # fmt: skip
    origin = doc["otherData"]["origin_ns"]
    assert round(r09["ts"] * 1000) + origin == 9 * MS and round(r09["dur"] * 1000) == 1000 * MS
    # never finished: it ends at its last token (21 ms), no E2E and no output text
    r10 = events["r10"]
    assert round((r10["ts"] + r10["dur"]) * 1000) + origin == 21 * MS
    assert "e2e_ms" not in r10["args"] and "output_text" not in r10["args"]
    assert r10["args"]["prompt_text"] == prompt(10)
    # every request overlaps every other: eleven lanes, one request each
    assert sorted(e["tid"] for e in events.values()) == list(range(1, 12))
    lanes = {
        e["tid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["pid"] == 3 and e["name"] == "thread_name"
    }
    assert lanes == {1 + i: f"lane {i}" for i in range(11)}


def test_requests_that_do_not_overlap_share_a_lane_and_texts_are_cut(db: Path) -> None:
    with Store.open(db) as store:
        # r00 ends (100 ms) before r10 arrives if r10 is moved to 150 ms: it takes lane 0
        store.connection.execute(
            "UPDATE requests SET arrival_ns = 150 * 1000000, first_token_ns = NULL "
            "WHERE req_id = 'r10'"
        )
        store.connection.execute("DELETE FROM tokens WHERE req_id = 'r10'")
        store.connection.execute(
            "UPDATE requests SET prompt_text = 'P' || repeat('p', 2000), "
            "output_text = repeat('o', 2000) || 'O' WHERE req_id = 'r00'"
        )
    events = _requests(_trace(db, TEXT_RUN))
    assert events["r10"]["tid"] == events["r00"]["tid"] == 1
    assert events["r10"]["dur"] == 0  # no token, no finish: an instant at its arrival
    args = events["r00"]["args"]
    assert args["prompt_text"] == "…" + "p" * 999  # a prompt's end is kept
    assert args["output_text"] == "o" * 999 + "…"  # an output's start is kept


def test_a_run_without_text_exports_its_requests_without_texts(db: Path) -> None:
    events = _requests(_trace(db, PLAIN_RUN))
    assert len(events) == 11
    assert not any(
        "prompt_text" in e["args"] or "output_text" in e["args"] for e in events.values()
    )
