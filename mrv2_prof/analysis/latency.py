"""The tool's latency definitions, in one place: which requests count, which steps are perturbed,
and how TTFT, TPOT, ITL and E2E are computed from the stored tables. Every figure the tool prints
(``show``, the report, ``compare`` and ``gate``, the run browser) is read through this module.

* A *completed* request finished with reason ``stop`` or ``length`` (``COMPLETED``). A partial
  run (aborted or failed) also counts, for TTFT and ITL, the requests *in flight* at the stop: no
  finish reason yet (``IN_FLIGHT``); their tokens so far.
* A *perturbed* step is one a probe slowed: ``steps.perturbed`` (the kernel-trace window). The
  *perturbed window* is host time from the first perturbed step's CPU start to the last one's
  CPU end (``perturbed_window``).
* TTFT = first token − arrival, per request (completed; partial run: or in flight).
* TPOT = (finish − first token) / (output tokens − 1), per completed request with more than one
  output token.
* ITL = each gap between two consecutive tokens (by ``idx``) of a request (the requests TTFT
  counts), leaving out the gaps that end inside the perturbed window unless the caller includes
  the perturbed steps.
* E2E = finish − arrival, per completed request.

All in ms. ``values_sql`` is one metric's values as a query (column ``v``, parameter ``$run``);
``TTFT_MS``, ``TPOT_MS`` and ``E2E_MS`` are the per-request expressions over ``requests``.
"""

from __future__ import annotations

from typing import Any

import duckdb

METRICS = ("ttft", "tpot", "itl", "e2e")

COMPLETED = "finish_reason IN ('stop', 'length')"
IN_FLIGHT = "finish_reason IS NULL"
PERTURBED = "coalesce(perturbed, false)"  # over ``steps``

# per request, over a row of ``requests`` (NULL where the request has no such time)
TTFT_MS = "(first_token_ns - arrival_ns) / 1e6"
TPOT_MS = (
    "CASE WHEN output_tokens > 1 THEN (finish_ns - first_token_ns) / 1e6 / (output_tokens - 1) END"
)
E2E_MS = "(finish_ns - arrival_ns) / 1e6"

_WINDOW = (
    f"SELECT min(cpu_start_ns) AS lo, max(cpu_end_ns) AS hi FROM steps "
    f"WHERE run_id = $run AND {PERTURBED}"
)


def _requests(in_flight: bool) -> str:
    who = f"({COMPLETED} OR {IN_FLIGHT})" if in_flight else COMPLETED
    return f"SELECT * FROM requests WHERE run_id = $run AND {who}"


def values_sql(metric: str, *, partial: bool = False, include_perturbed: bool = False) -> str:
    """The values of ``metric`` (one of ``METRICS``) for run ``$run``, in ms, as a query with one
    column ``v`` (no NULLs, unordered). ``partial``: the run stopped early, so TTFT and ITL also
    count the requests in flight at the stop. ``include_perturbed``: keep the ITL gaps that end
    inside the perturbed window."""
    if metric == "ttft":
        return f"SELECT {TTFT_MS} AS v FROM ({_requests(partial)}) WHERE {TTFT_MS} IS NOT NULL"
    if metric == "tpot":
        return f"SELECT {TPOT_MS} AS v FROM ({_requests(False)}) WHERE {TPOT_MS} IS NOT NULL"
    if metric == "e2e":
        return f"SELECT {E2E_MS} AS v FROM ({_requests(False)}) WHERE {E2E_MS} IS NOT NULL"
    if metric != "itl":
        raise ValueError(f"no latency metric {metric!r}; metrics: {', '.join(METRICS)}")
    keep = (
        "true"
        if include_perturbed
        else f"NOT coalesce(g.t_ns BETWEEN (SELECT lo FROM ({_WINDOW})) "
        f"AND (SELECT hi FROM ({_WINDOW})), false)"
    )
    return f"""
        SELECT g.v FROM (
          SELECT t.t_ns,
                 (t.t_ns - lag(t.t_ns) OVER (PARTITION BY t.req_id ORDER BY t.idx)) / 1e6 AS v
          FROM tokens t JOIN ({_requests(partial)}) r USING (run_id, req_id)
        ) g WHERE g.v IS NOT NULL AND {keep}"""


def latency_values(
    connection: duckdb.DuckDBPyConnection,
    run_id: str,
    metric: str,
    *,
    partial: bool = False,
    include_perturbed: bool = False,
) -> list[float]:
    """``values_sql``'s values for ``run_id``, sorted ascending."""
    sql = values_sql(metric, partial=partial, include_perturbed=include_perturbed)
    rows = connection.execute(f"SELECT v FROM ({sql}) ORDER BY v", {"run": run_id}).fetchall()
    return [float(v) for (v,) in rows]


def perturbed_window(connection: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, int] | None:
    """Host time from the first perturbed step's start to the last one's end (None: none)."""
    row: Any = connection.execute(_WINDOW, {"run": run_id}).fetchone()
    return None if row is None or row[0] is None else (int(row[0]), int(row[1]))


def perturbed_steps(connection: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """How many steps of the run are perturbed."""
    row: Any = connection.execute(
        f"SELECT count(*) FROM steps WHERE run_id = $run AND {PERTURBED}", {"run": run_id}
    ).fetchone()
    return int(row[0])
