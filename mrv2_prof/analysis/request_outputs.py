"""What each request of a run put out, as the output contract compares two runs: its finish
reason with its place in arrival order, and its stored token ids in output order."""

from __future__ import annotations

from mrv2_prof.store import Store


def finish_reasons(store: Store, run_id: str) -> dict[str, tuple[str | None, int]]:
    """Each request's finish reason and its position in arrival order (ties by request id)."""
    rows = store.connection.execute(
        "SELECT req_id, finish_reason, arrival_ns FROM requests WHERE run_id = ? "
        "ORDER BY arrival_ns, req_id",
        [run_id],
    ).fetchall()
    return {req: (reason, i) for i, (req, reason, _) in enumerate(rows)}


def token_ids(store: Store, run_id: str) -> dict[str, list[int | None]]:
    """Each request's stored token ids in output order (None where an id was not stored)."""
    rows = store.connection.execute(
        "SELECT req_id, token_id FROM tokens WHERE run_id = ? ORDER BY req_id, idx", [run_id]
    ).fetchall()
    out: dict[str, list[int | None]] = {}
    for req, token in rows:
        out.setdefault(req, []).append(token)
    return out
