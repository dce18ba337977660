"""Queries over the host sampler's ``host_samples`` table: stacks per phase, the top frames."""

from __future__ import annotations

from typing import Any

from mrv2_prof.store.db import Store


def stack_counts(store: Store, run_id: str) -> list[tuple[str, str, int]]:
    """``(phase, stack, samples)`` of a run, most sampled first."""
    return store.connection.execute(
        "SELECT phase, stack, count(*) AS n FROM host_samples WHERE run_id = ? "
        "GROUP BY phase, stack ORDER BY n DESC, phase, stack",
        [run_id],
    ).fetchall()


def top_host_frames(store: Store, run_id: str, n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` frames most often on top of the stack (self samples), each with its phase and
    share of all the run's samples."""
    rows = store.connection.execute(
        "SELECT phase, string_split(stack, ';')[-1] AS frame, count(*) AS self_samples, "
        "count(*) / sum(count(*)) OVER () AS share FROM host_samples WHERE run_id = ? "
        "GROUP BY phase, frame ORDER BY self_samples DESC, phase, frame LIMIT ?",
        [run_id, n],
    ).fetchall()
    return [
        {"phase": phase, "frame": frame, "self_samples": k, "share": share}
        for phase, frame, k, share in rows
    ]
