"""Queries over the host sampler's ``host_samples`` table: stacks per phase, the top frames
(while the run served, and in its start-up: phase ``startup``, step -1)."""

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
    """The ``n`` frames most often on top of the stack (self samples) while the run served (not
    in its start-up), each with its phase and share of those samples."""
    rows = store.connection.execute(
        "SELECT phase, string_split(stack, ';')[-1] AS frame, count(*) AS self_samples, "
        "count(*) / sum(count(*)) OVER () AS share FROM host_samples WHERE run_id = ? "
        "AND phase <> 'startup' "
        "GROUP BY phase, frame ORDER BY self_samples DESC, phase, frame LIMIT ?",
        [run_id, n],
    ).fetchall()
    return [
        {"phase": phase, "frame": frame, "self_samples": k, "share": share}
        for phase, frame, k, share in rows
    ]


def startup_host_frames(store: Store, run_id: str, n: int = 10) -> list[dict[str, Any]]:
    """Where the runner's start-up went (samples of phase ``startup``): each sample counted
    for the innermost frame of the package's own code on its stack (the start-up step that
    led there: ``_import_torch``, ``profile_run``, ``capture_graphs``; what it
    called outside the package is counted with it; a stack with none, for its top frame). The
    ``n`` most sampled, with their share of the start-up samples; ties by frame."""
    rows = store.connection.execute(
        "SELECT stack, count(*) FROM host_samples WHERE run_id = ? AND phase = 'startup' "
        "GROUP BY stack",
        [run_id],
    ).fetchall()
    counts: dict[str, int] = {}
    for stack, k in rows:
        frames = stack.split(";")
        frame = next((f for f in reversed(frames) if "(mrv2_prof/" in f), frames[-1])
        counts[frame] = counts.get(frame, 0) + k
    total = sum(counts.values())
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [{"frame": f, "samples": k, "share": k / total} for f, k in top]
