"""Speculative decoding through the harness: a run with n-gram drafts stores the same greedy
tokens as one without, every token of an accepted run is a ``tokens`` row, and the drafts,
accepts and per-position rates reach ``steps``, ``spec_verifies`` and the summary."""

from __future__ import annotations

import duckdb
import pytest

from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.store import Store

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


def test_async_runs_never_sit_out_with_device_drafts(run_in_process):
    """Async scheduling, read from the stored per-step rows: with drafts on the device no step
    has a request sitting out, the run takes fewer steps than plain decoding for the same
    tokens, and the draft slots reserved are all either accepted or reclaimed; with drafts on
    the host (the reference path) requests sit out and the run takes more steps."""
    # 48 tokens: the random-weight outputs fall into the loops the lookup predicts
    sets = (
        *SETS[:2],
        "workload.output_len={dist: fixed, value: 48}",
        "runner.async_scheduling=true",
    )
    ngram = ("runner.spec_decode.method=ngram", "runner.spec_decode.num_speculative_tokens=3")
    plain_job, _ = run_in_process(*sets)
    run_in_process(*sets, *ngram)
    run_in_process(*sets, *ngram, "runner.spec_decode.draft_on=host")
    plain_id, device_id, host_id = run_ids(plain_job.db_path)
    tokens = [tokens_of(plain_job.db_path, r) for r in (plain_id, device_id, host_id)]
    assert tokens[1] == tokens[0] == tokens[2]
    with Store.open(plain_job.db_path, read_only=True) as store:
        con = store.connection

        def totals(run_id):
            return con.execute(
                "SELECT count(*), sum(spec_sat_out), sum(spec_reserved), sum(spec_reclaimed), "
                "sum(num_accepted_tokens) FROM steps WHERE run_id = ?",
                [run_id],
            ).fetchone()

        plain, device, host = totals(plain_id), totals(device_id), totals(host_id)
        (verify_prefill,) = con.execute(  # a verify is a decode, never a prefill
            "SELECT sum(num_prefill_tokens) FROM steps WHERE run_id = ? AND step > 0", [device_id]
        ).fetchone()
        info = [
            con.execute("SELECT info FROM runs WHERE run_id = ?", [r]).fetchone()[0]
            for r in (device_id, host_id)
        ]
    steps, sat_out, reserved, reclaimed, accepted = device
    assert sat_out == 0 and steps < plain[0] and verify_prefill == 0
    assert reserved == reclaimed + accepted and accepted > 0  # every slot accounted for
    assert host[1] > 0 and host[0] > plain[0]
    assert '"spec_drafts_on": "device"' in info[0] and '"spec_drafts_on": "host"' in info[1]
