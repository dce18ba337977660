"""Tensor parallelism in the store: what ``rank_steps`` says about a run's ranks.

Per rank, ``comm_share`` is its time in collectives over its step time (the sums of ``comm_ns``
and of ``end_ns - start_ns`` over its rows). A step's *skew* is its slowest rank's step time less
its fastest rank's; the summary gives the median over the steps every rank has a row for, and
how many of those steps each rank was the slowest in (ties go to the lower rank).
``rank_columns``: each rank's step time and its time in collectives, step by step (the report's
panel).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mrv2_prof.store.db import Store

Ranks = dict[int, dict[str, np.ndarray]]  # rank -> step, step_ms, comm_ms


@dataclass(frozen=True)
class RankSummary:
    ranks: int
    steps: int  # steps with a row from every rank
    comm_share: dict[int, float]  # rank -> collectives / step time
    skew_p50_ms: float | None
    slowest: dict[int, int]  # rank -> steps it was the slowest in


def rank_summary(store: Store, run_id: str) -> RankSummary | None:
    """None when the run has no ``rank_steps`` rows (one rank)."""
    con = store.connection
    shares = con.execute(
        "SELECT rank, sum(comm_ns) / nullif(sum(end_ns - start_ns), 0) FROM rank_steps "
        "WHERE run_id = ? GROUP BY rank ORDER BY rank",
        [run_id],
    ).fetchall()
    if not shares:
        return None
    ranks = len(shares)
    per_step = con.execute(
        """
        WITH t AS (SELECT step, rank, end_ns - start_ns AS d FROM rank_steps WHERE run_id = ?),
        every_rank AS (SELECT step FROM t GROUP BY step HAVING count(*) = ?)
        SELECT step, max(d) - min(d), arg_max(rank, d * 1024 - rank)
        FROM t WHERE step IN (SELECT step FROM every_rank) GROUP BY step
        """,
        [run_id, ranks],
    ).fetchall()
    slowest = {int(r): 0 for r, _ in shares}
    for _, _, rank in per_step:
        slowest[int(rank)] += 1
    skews = sorted(int(s) for _, s, _ in per_step)
    p50 = None
    if skews:
        mid = len(skews) // 2
        p50 = (skews[mid] if len(skews) % 2 else (skews[mid - 1] + skews[mid]) / 2) / 1e6
    return RankSummary(
        ranks=ranks,
        steps=len(per_step),
        comm_share={int(r): float(v or 0.0) for r, v in shares},
        skew_p50_ms=p50,
        slowest=slowest,
    )


def rank_columns(store: Store, run_id: str) -> Ranks:
    rows = store.connection.execute(
        "SELECT rank, step, (end_ns - start_ns) / 1e6, comm_ns / 1e6 FROM rank_steps "
        "WHERE run_id = ? ORDER BY rank, step",
        [run_id],
    ).fetchall()
    out: Ranks = {}
    for rank in sorted({int(r[0]) for r in rows}):
        mine = [r for r in rows if r[0] == rank]
        out[rank] = {
            "step": np.array([r[1] for r in mine], dtype=np.int64),
            "step_ms": np.array([r[2] for r in mine], dtype=np.float64),
            "comm_ms": np.array([r[3] for r in mine], dtype=np.float64),
        }
    return out


def rank_line(r: RankSummary) -> str:
    """The summary's one line about the ranks."""
    comm = ", ".join(f"rank {k} {100 * v:.0f}%" for k, v in r.comm_share.items())
    skew = "-" if r.skew_p50_ms is None else f"{r.skew_p50_ms:,.2f} ms"
    slow = max(r.slowest, key=lambda k: (r.slowest[k], -k))
    share = r.slowest[slow] / r.steps if r.steps else 0.0
    return (
        f"{r.ranks} ranks; collectives {comm} of step time; skew p50 {skew} "
        f"(slowest: rank {slow} in {100 * share:.0f}% of {r.steps} steps)"
    )
