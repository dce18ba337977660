"""Speculative decoding through the harness: a run with n-gram drafts stores the same greedy
tokens as one without, every token of an accepted run is a ``tokens`` row, and the drafts,
accepts and per-position rates reach ``steps``, ``spec_verifies`` and the summary."""

from __future__ import annotations

import duckdb
import pytest

from mrv2_prof.store import Store, run_summary

SETS = (
    "workload.num_requests=4",
    "workload.repeated_segment_len=5",
    "workload.output_len={dist: fixed, value: 24}",
)


def run_ids(db_path: str) -> list[str]:
    with duckdb.connect(db_path, read_only=True) as con:
        rows = con.execute("SELECT run_id FROM runs ORDER BY started_ns").fetchall()
    return [r for (r,) in rows]


def tokens_of(db_path: str, run_id: str) -> dict[str, list[int]]:
    with duckdb.connect(db_path, read_only=True) as con:
        rows = con.execute(
            "SELECT req_id, list(token_id ORDER BY idx) FROM tokens WHERE run_id = ? "
            "GROUP BY req_id",
            [run_id],
        ).fetchall()
    return dict(rows)


@pytest.mark.parametrize("k", [2, 4])
def test_spec_decode_run_stores_the_plain_runs_tokens_and_its_counters(run_in_process, k):
    plain_job, _ = run_in_process(*SETS)
    spec_job, sent = run_in_process(
        *SETS,
        "runner.spec_decode.method=ngram",
        f"runner.spec_decode.num_speculative_tokens={k}",
    )
    assert sent[-1][1].status == "completed"
    assert plain_job.db_path == spec_job.db_path  # one file, two runs
    plain_id, spec_id = run_ids(spec_job.db_path)
    plain, spec = tokens_of(spec_job.db_path, plain_id), tokens_of(spec_job.db_path, spec_id)
    assert spec == plain and all(len(t) == 24 for t in spec.values())

    with Store.open(spec_job.db_path, read_only=True) as store:
        con = store.connection
        drafted, accepted, max_k = con.execute(
            "SELECT sum(num_draft_tokens), sum(num_accepted_tokens), max(spec_k) FROM steps "
            "WHERE run_id = ?",
            [spec_id],
        ).fetchone()
        v_drafted, v_accepted, v_rows, v_max = con.execute(
            "SELECT sum(num_draft_tokens), sum(num_accepted_tokens), count(*), "
            "max(num_draft_tokens) FROM spec_verifies WHERE run_id = ?",
            [spec_id],
        ).fetchone()
        (draft_spans,) = con.execute(
            "SELECT count(*) FROM spans WHERE name = 'draft' AND run_id = ?", [spec_id]
        ).fetchone()
        (plain_steps,) = con.execute(
            "SELECT count(*) FROM steps WHERE run_id = ?", [plain_id]
        ).fetchone()
        assert run_summary(store, plain_id).spec_decode is None
        s = run_summary(store, spec_id)
    assert max_k == k and v_max <= k and v_rows > 0
    assert (drafted, accepted) == (v_drafted, v_accepted) and 0 < accepted <= drafted
    assert draft_spans > 0
    d = s.spec_decode
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (
        v_rows,
        v_drafted,
        v_accepted,
    )
    assert d.mean_acceptance_length == pytest.approx(1 + v_accepted / v_rows)
    assert sum(d.accepted_length_counts) == v_rows
    assert d.acceptance_per_position[0] * v_rows == pytest.approx(
        v_rows - d.accepted_length_counts[0]
    )
    assert sum(r * v_rows for r in d.acceptance_per_position) == pytest.approx(v_accepted)
    assert 0 < d.draft_time_share < 1 and d.verify_track == "cpu"
    # fewer steps than the plain run: accepted drafts are tokens that took no step of their own
    assert s.steps < plain_steps
