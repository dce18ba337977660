"""Speculative decoding with a draft model through the harness: self-speculation stores the
plain run's greedy tokens, its draft phase (the draft model's steps) is in ``spans``, the
summary's draft time is that phase's, and the start-up facts give the draft's cache bytes."""

from __future__ import annotations

import json

import duckdb
import pytest

from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.store import Store
from tests.test_spec_decode_run import SETS, run_ids, tokens_of


def test_a_self_draft_run_stores_the_plain_tokens_and_its_draft_time(run_in_process):
    run_in_process(*SETS)
    job, sent = run_in_process(
        *SETS,
        "runner.spec_decode.method=draft_model",
        "runner.spec_decode.num_speculative_tokens=3",
        "runner.spec_decode.draft={target_layers: 1}",
    )
    assert sent[-1][1].status == "completed"
    plain_id, spec_id = run_ids(job.db_path)
    assert tokens_of(job.db_path, spec_id) == tokens_of(job.db_path, plain_id)
    with duckdb.connect(job.db_path, read_only=True) as con:
        (draft_ns,) = con.execute(
            "SELECT sum(end_ns - start_ns) FROM spans WHERE run_id = ? AND name = 'draft' "
            "AND track = 'cpu'",
            [spec_id],
        ).fetchone()
        (info,) = con.execute("SELECT info FROM runs WHERE run_id = ?", [spec_id]).fetchone()
    facts = json.loads(info)
    assert facts["draft_kv_cache_bytes"] > 0 and facts["draft_capture_s"] == 0
    with Store.open(job.db_path, read_only=True) as store:
        d = run_summary(store, spec_id).spec_decode
    assert d.num_drafts > 0 and d.num_accepted_tokens > 0
    assert d.draft_ms * 1e6 == pytest.approx(draft_ns)  # the host draft phase on the CPU
    assert 0 < d.draft_time_share < 1
