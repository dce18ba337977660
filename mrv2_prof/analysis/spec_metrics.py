"""Speculative decoding's figures of one run, with vLLM's meanings (its spec-decode metrics).

* ``num_drafts``: verifies of a request's drafts (one per request and step that drafted);
  ``num_draft_tokens``: the drafts verified; ``num_accepted_tokens``: the accepted ones.
* ``acceptance_rate``: accepted / drafted tokens.
* ``acceptance_per_position[j]``: the share of drafts whose token at position j was accepted
  (accepted at j / ``num_drafts``, as vLLM's per-position rate; it can only fall with j).
* ``mean_acceptance_length``: 1 + accepted / ``num_drafts``, the tokens a verify emits on
  average (the one after the accepted drafts included).
* ``accepted_length_counts[a]``: verifies that accepted exactly ``a`` drafts.
* ``draft_ms``: time of the ``draft`` phase: on the device when a draft model ran there (its
  catch-up and k steps, the ``draft`` device span), else on the host (the n-gram lookup, or the
  draft model's steps on the CPU); ``verify_ms``: the forward and sample phases of
  the steps that verified drafts, on the device when the run has a GPU timeline (what the verify
  costs there), else on the host; ``draft_time_share`` = draft / (draft + verify). On the device
  both are busy time: each span less its ``starved_ns``, the time the device waited inside it
  for the host to enqueue the rest (``probes/starvation.py``). A host-bound step's draft span is
  mostly such waiting (92 % of it in a self-draft run on the H200), which is the host's cost,
  not the draft model's.

The slots and dynamic k, summed over the run's ``steps`` (schema version 7; None on a run stored
before, whose steps hold NULL):

* ``reserved_slots``: draft slots scheduled, KV slots and token budget reserved for drafts
  (sum of ``spec_reserved``, the batch queued in each step); ``reclaimed_slots``: the slots the
  verifies gave back, rejected drafts and placeholders (sum of ``spec_reclaimed``, the
  verifies read in each step); ``reclaimed_share`` = reclaimed / reserved, the share of the
  reservation that emitted nothing (None with nothing reserved).
* ``sat_out_steps``: steps in which at least one request sat out because of speculation
  (``spec_sat_out > 0``: drafts on the host under async scheduling); ``sat_out_requests``: the
  sum of ``spec_sat_out``, each request counted once per step it sat out.
* ``decided_steps``: steps with a dynamic-k decision (``spec_expected_tokens`` not NULL: dynamic
  k adaptive); ``k_off_steps``: of them, those where it chose k = 0 (speculation on, turned off
  for the step). ``last_expected_tokens`` / ``last_cost_ratio``: the latest step's value of
  each; ``mean_expected_tokens`` / ``mean_cost_ratio``: the mean over the steps that have one
  (None without a decision).

Read from ``spec_verifies`` (one row per verify), the steps and the spans; None for a run
without drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrv2_prof.store.db import Store

_NS_PER_MS = 1e6
# a span's time less what the device waited in it for the host (starved_ns: NULL on the host)
_BUSY = "sum(s.end_ns - s.start_ns - coalesce(s.starved_ns, 0))::BIGINT"


@dataclass(frozen=True)
class SpecDecodeSummary:
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float
    acceptance_per_position: list[float]
    mean_acceptance_length: float
    accepted_length_counts: list[int]
    draft_ms: float
    verify_ms: float
    verify_track: str  # gpu | cpu: where verify_ms was measured (gpu: busy time)
    draft_track: str  # gpu | cpu: where draft_ms was measured (gpu: busy time)
    draft_time_share: float | None  # None when neither was timed
    reserved_slots: int | None = None  # None: the run's steps did not record it (schema < 7)
    reclaimed_slots: int | None = None
    reclaimed_share: float | None = None  # reclaimed / reserved (None: nothing reserved)
    sat_out_steps: int | None = None
    sat_out_requests: int | None = None
    decided_steps: int = 0  # steps with a dynamic-k decision
    k_off_steps: int = 0  # of them, k = 0 chosen
    last_expected_tokens: float | None = None
    mean_expected_tokens: float | None = None
    last_cost_ratio: float | None = None
    mean_cost_ratio: float | None = None


def spec_decode_summary(store: Store, run_id: str) -> SpecDecodeSummary | None:
    con = store.connection
    rows = con.execute(
        "SELECT num_draft_tokens, num_accepted_tokens, count(*) FROM spec_verifies "
        "WHERE run_id = ? GROUP BY ALL ORDER BY ALL",
        [run_id],
    ).fetchall()
    num_drafts = sum(n for _, _, n in rows)
    if num_drafts == 0:
        return None
    drafted = sum(d * n for d, _, n in rows)
    accepted = sum(a * n for _, a, n in rows)
    max_k = max(d for d, _, _ in rows)
    per_position = [
        sum(n for _, a, n in rows if a > j) / num_drafts for j in range(max_k)
    ]  # fmt: skip
    counts = [sum(n for _, a, n in rows if a == x) for x in range(max_k + 1)]

    drafts = dict(
        con.execute(
            f"SELECT s.track, {_BUSY} FROM spans s "
            "WHERE s.run_id = ? AND s.name = 'draft' GROUP BY s.track",
            [run_id],
        ).fetchall()
    )
    draft_track = "gpu" if drafts.get("gpu") else "cpu"  # a draft model's device time
    draft_ns = drafts.get(draft_track) or 0
    verify = dict(
        con.execute(
            f"SELECT s.track, {_BUSY} FROM spans s "
            "JOIN steps t ON t.run_id = s.run_id AND t.step = s.step "
            "WHERE s.run_id = ? AND t.num_draft_tokens > 0 AND s.name IN ('forward', 'sample') "
            "GROUP BY s.track",
            [run_id],
        ).fetchall()
    )
    track = "gpu" if verify.get("gpu") else "cpu"
    verify_ns = verify.get(track) or 0
    total = draft_ns + verify_ns
    reserved, reclaimed, sat_out_steps, sat_out, decided, k_off = con.execute(
        "SELECT sum(spec_reserved), sum(spec_reclaimed), count(*) FILTER (WHERE spec_sat_out > 0),"
        " sum(spec_sat_out), count(spec_expected_tokens), "
        "count(*) FILTER (WHERE spec_expected_tokens IS NOT NULL AND spec_k = 0) "
        "FROM steps WHERE run_id = ?",
        [run_id],
    ).fetchone()
    expected = _decisions(store, run_id, "spec_expected_tokens")
    cost = _decisions(store, run_id, "spec_cost_ratio")
    return SpecDecodeSummary(
        num_drafts=num_drafts,
        num_draft_tokens=drafted,
        num_accepted_tokens=accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        acceptance_per_position=per_position,
        mean_acceptance_length=1 + accepted / num_drafts,
        accepted_length_counts=counts,
        draft_ms=draft_ns / _NS_PER_MS,
        verify_ms=verify_ns / _NS_PER_MS,
        verify_track=track,
        draft_track=draft_track,
        draft_time_share=draft_ns / total if total > 0 else None,
        reserved_slots=None if reserved is None else int(reserved),
        reclaimed_slots=None if reclaimed is None else int(reclaimed),
        reclaimed_share=reclaimed / reserved if reserved and reclaimed is not None else None,
        sat_out_steps=None if sat_out is None else int(sat_out_steps),
        sat_out_requests=None if sat_out is None else int(sat_out),
        decided_steps=int(decided),
        k_off_steps=int(k_off),
        last_expected_tokens=expected[0],
        mean_expected_tokens=expected[1],
        last_cost_ratio=cost[0],
        mean_cost_ratio=cost[1],
    )


def _decisions(store: Store, run_id: str, column: str) -> tuple[float | None, float | None]:
    """The latest step's value of a dynamic-k column and its mean over the steps with one."""
    row = store.connection.execute(
        f"SELECT arg_max({column}, step), avg({column}) FROM steps "
        f"WHERE run_id = ? AND {column} IS NOT NULL",
        [run_id],
    ).fetchone()
    return (None, None) if row is None else (row[0], row[1])
