"""A run's requests as the views list them: latencies, finish and the decoded texts.

One row per request (``RequestRow``) with TTFT, TPOT and E2E by the definitions of
``store.latency`` (ms; None where the request has no such time: TPOT needs two output tokens)
and ``requests.prompt_text`` / ``output_text`` (NULL on a run whose model had no tokenizer, and
the output of a request never finished). ``request_page`` orders and pages them (the browser's
request table), ``request_sample`` picks the slowest and some typical ones (the report),
``first_answers`` the first few answered (the printed summary), ``token_times`` one request's
tokens with their times.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrv2_prof.analysis.latency import COMPLETED, E2E_MS, TPOT_MS, TTFT_MS
from mrv2_prof.store.db import Store

_SELECT = f"""
    SELECT req_id, arrival_ns, prompt_tokens, output_tokens, finish_reason,
           {TTFT_MS} AS ttft_ms, {TPOT_MS} AS tpot_ms, {E2E_MS} AS e2e_ms,
           prompt_text, output_text
    FROM requests WHERE run_id = $run"""
# The orders of ``request_page``: a column of ``RequestRow`` -> its SQL (the key to sort by).
ORDERS = {
    "arrival": "arrival_ns",
    "req_id": "req_id",
    "prompt_tokens": "prompt_tokens",
    "output_tokens": "output_tokens",
    "finish": "finish_reason",
    "ttft": "ttft_ms",
    "tpot": "tpot_ms",
    "e2e": "e2e_ms",
}


@dataclass(frozen=True)
class RequestRow:
    req_id: str
    arrival_ns: int | None
    prompt_tokens: int | None
    output_tokens: int | None
    finish_reason: str | None  # stop | length | abort; None: never finished
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    prompt_text: str | None
    output_text: str | None


def _rows(store: Store, sql: str, **params: object) -> list[RequestRow]:
    cursor = store.connection.execute(sql, params)
    return [RequestRow(*row) for row in cursor.fetchall()]


def has_text(store: Store, run_id: str) -> bool:
    """Whether any request of the run has a decoded prompt or output."""
    row = store.connection.execute(
        "SELECT EXISTS (SELECT 1 FROM requests WHERE run_id = ? "
        "AND (prompt_text IS NOT NULL OR output_text IS NOT NULL))",
        [run_id],
    ).fetchone()
    return bool(row and row[0])


def request_page(
    store: Store,
    run_id: str,
    start: int,
    limit: int,
    order: str = "arrival",
    descending: bool = False,
) -> tuple[list[RequestRow], int]:
    """Rows ``start`` .. ``start + limit`` of the run's requests in ``order`` (a key of
    ``ORDERS``; ties, and NULLs last, by arrival then id), and how many requests it has."""
    key = ORDERS[order]
    way = "DESC" if descending else "ASC"
    sql = (
        f"SELECT * FROM ({_SELECT}) ORDER BY {key} {way} NULLS LAST, arrival_ns, req_id "
        "LIMIT $limit OFFSET $start"
    )
    rows = _rows(store, sql, run=run_id, limit=limit, start=start)
    (total,) = store.connection.execute(
        "SELECT count(*) FROM requests WHERE run_id = ?", [run_id]
    ).fetchone()
    return rows, int(total)


def request_sample(
    store: Store, run_id: str, slowest: int = 3, typical: int = 5
) -> list[tuple[str, RequestRow]]:
    """The ``slowest`` completed requests by E2E (slowest first), then the ``typical``
    completed ones of the rest whose E2E is nearest the median E2E (in E2E order), each named
    ``"slowest"`` or ``"typical"``."""
    ranked = f"""
        WITH done AS (SELECT * FROM ({_SELECT}) WHERE {COMPLETED} AND e2e_ms IS NOT NULL),
        ranked AS (SELECT *, row_number() OVER (ORDER BY e2e_ms DESC, req_id) AS rank FROM done)
        SELECT * EXCLUDE (rank) FROM ranked"""
    worst = _rows(store, f"{ranked} WHERE rank <= $n ORDER BY rank", run=run_id, n=slowest)
    near = (
        f"{ranked} WHERE rank > $n "
        "ORDER BY abs(e2e_ms - (SELECT quantile_cont(e2e_ms, 0.5) FROM done)), req_id LIMIT $k"
    )
    rest = _rows(store, near, run=run_id, n=slowest, k=typical)
    rest.sort(key=lambda r: (r.e2e_ms, r.req_id))
    return [("slowest", r) for r in worst] + [("typical", r) for r in rest]


def first_answers(store: Store, run_id: str, n: int = 3) -> tuple[list[RequestRow], int]:
    """The first ``n`` requests (by arrival) with an output text, and how many have one."""
    answered = f"SELECT * FROM ({_SELECT}) WHERE output_text IS NOT NULL"
    rows = _rows(store, f"{answered} ORDER BY arrival_ns, req_id LIMIT $n", run=run_id, n=n)
    (total,) = store.connection.execute(
        "SELECT count(*) FROM requests WHERE run_id = ? AND output_text IS NOT NULL", [run_id]
    ).fetchone()
    return rows, int(total)


def request_texts(store: Store, run_id: str, req_id: str) -> tuple[str | None, str | None]:
    """One request's decoded prompt and output (None where not stored, or no such request)."""
    row = store.connection.execute(
        "SELECT prompt_text, output_text FROM requests WHERE run_id = ? AND req_id = ?",
        [run_id, req_id],
    ).fetchone()
    return (row[0], row[1]) if row else (None, None)


def token_times(store: Store, run_id: str, req_id: str) -> list[tuple[int, int | None, int]]:
    """``(idx, t_ns, token_id)`` of each output token of one request, in output order."""
    return [
        (int(i), None if t is None else int(t), int(tok))
        for i, t, tok in store.connection.execute(
            "SELECT idx, t_ns, token_id FROM tokens WHERE run_id = ? AND req_id = ? ORDER BY idx",
            [run_id, req_id],
        ).fetchall()
    ]
