"""One run's latency distributions as samples: TTFT and TPOT per completed request, and the
inter-token gaps (ITL), by the definitions of ``store.metrics`` (the gaps that end inside the
perturbed window, a kernel trace, left out as there). ``compare`` and ``gate`` bootstrap these
when one run a side is all there is."""

from __future__ import annotations

from mrv2_prof.store.db import Store
from mrv2_prof.store.metrics import perturbed_window

_COMPLETED = "finish_reason IN ('stop', 'length')"


def latency_samples(store: Store, run_id: str) -> dict[str, list[float]]:
    """``{"ttft": [...], "tpot": [...], "itl": [...]}`` in ms."""
    completed = f"SELECT * FROM requests WHERE run_id = ? AND {_COMPLETED}"
    window = perturbed_window(store, run_id)
    keep = "" if window is None else f"WHERE t_ns NOT BETWEEN {window[0]} AND {window[1]}"
    queries = {
        "ttft": f"SELECT (first_token_ns - arrival_ns) / 1e6 AS v FROM ({completed})",
        "tpot": f"SELECT (finish_ns - first_token_ns) / 1e6 / (output_tokens - 1) AS v "
        f"FROM ({completed}) WHERE output_tokens > 1",
        "itl": f"""SELECT v FROM (
              SELECT t.t_ns,
                     (t.t_ns - lag(t.t_ns) OVER (PARTITION BY t.req_id ORDER BY t.idx)) / 1e6 AS v
              FROM tokens t JOIN ({completed}) r USING (run_id, req_id)) {keep}""",
    }
    return {
        name: [
            float(row[0])
            for row in store.connection.execute(
                f"SELECT v FROM ({sql}) WHERE v IS NOT NULL ORDER BY v", [run_id]
            ).fetchall()
        ]
        for name, sql in queries.items()
    }
