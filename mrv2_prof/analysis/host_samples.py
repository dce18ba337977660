"""Queries over the host sampler's ``host_samples`` table: stacks per phase, the top frames
(while the run served, and in its start-up: phase ``startup``, step -1)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mrv2_prof.store.db import Store


def stack_seconds(store: Store, run_id: str) -> list[tuple[str, str, float, int]]:
    """``(phase, stack, seconds, samples)`` of a run, the most time first: each sample stands
    for the wall time since the run's sample before it (the first, for the median interval),
    start-up and serving alike (why time and not counts: ``startup_host_frames``)."""
    rows = store.connection.execute(
        "SELECT phase, stack, t_ns FROM host_samples WHERE run_id = ? ORDER BY t_ns, stack",
        [run_id],
    ).fetchall()
    weights = _weights([r[2] for r in rows])
    timed = _time_per([(phase, stack) for phase, stack, _ in rows], weights)
    return [(phase, stack, s, k) for (phase, stack), s, k in timed]


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


STALL_PERIODS = 4  # a start-up interval over this many median intervals: a stall


def _package_frame(stack: str) -> str:
    """The innermost frame of the package's own code on a stack; a stack with none, its top."""
    frames = stack.split(";")
    return next((f for f in reversed(frames) if "(mrv2_prof/" in f), frames[-1])


def _weights(t_ns: list[int]) -> np.ndarray:
    """The wall seconds each of samples taken at ``t_ns`` (ascending) stands for: the time
    since the one before; the first, the median interval (a single sample: 0)."""
    t = np.array(t_ns, dtype=np.int64)
    gaps = np.diff(t) / 1e9
    first = float(np.median(gaps)) if len(gaps) else 0.0
    return np.concatenate(([first], gaps)) if len(t) else gaps


def _time_per(keys: list, seconds: np.ndarray) -> list[tuple[Any, float, int]]:
    """``(key, seconds, samples)`` per distinct key of the samples (``keys[i]`` stands for
    ``seconds[i]``), the most time first; ties by samples, then key."""
    per_key: dict[Any, list] = {}
    for key, s in zip(keys, seconds.tolist(), strict=True):
        entry = per_key.setdefault(key, [0.0, 0])
        entry[0] += s
        entry[1] += 1
    return sorted(
        ((key, s, k) for key, (s, k) in per_key.items()), key=lambda r: (-r[1], -r[2], r[0])
    )


def _startup_samples(store: Store, run_id: str) -> tuple[list[str], np.ndarray]:
    """The start-up samples' stacks in time order, and the wall seconds each stands for."""
    rows = store.connection.execute(
        "SELECT stack, t_ns FROM host_samples WHERE run_id = ? AND phase = 'startup' "
        "ORDER BY t_ns, stack",
        [run_id],
    ).fetchall()
    return [r[0] for r in rows], _weights([r[1] for r in rows])


def startup_host_frames(store: Store, run_id: str, n: int = 10) -> list[dict[str, Any]]:
    """Where the runner's start-up went (samples of phase ``startup``), by wall time: each
    sample stands for the time since the sample before it (the first, for the median
    interval), counted for the innermost frame of the package's own code on its stack (the
    start-up step that led there: ``_import_torch``, ``profile_run``, ``capture_graphs``; what
    it called outside the package is counted with it; a stack with none, for its top frame).

    Why time and not counts: the sampler is a thread of the runner, and it cannot run while a
    C call holds the GIL (a shared library's load in torch's import, a database write); the
    sample after such a stall is taken where the GIL came back, in the frame that held it or
    just after it returned, so it stands for the stall. Counting samples made a 0.4 s load
    one 5 ms sample. The ``n`` frames with the most time, each with its samples, seconds and
    share of the sampled span; ties by samples, then frame."""
    stacks, seconds = _startup_samples(store, run_id)
    total = float(seconds.sum())  # 0: a single sample, which is all of it
    top = _time_per([_package_frame(stack) for stack in stacks], seconds)[:n]
    return [
        {"frame": f, "samples": k, "seconds": s, "share": s / total if total else 1.0}
        for f, s, k in top
    ]


def startup_stalls(store: Store, run_id: str) -> dict[str, float] | None:
    """The start-up samples' span (seconds from one interval before the first sample to the
    last), and the intervals over ``STALL_PERIODS`` median intervals in it (the sampler
    could not run: a C call held the GIL): their count and seconds. None: no samples."""
    _, seconds = _startup_samples(store, run_id)
    if not len(seconds):
        return None
    stalled = seconds[1:][seconds[1:] > STALL_PERIODS * seconds[0]]
    return {
        "span_s": float(seconds.sum()),
        "stalls": int(len(stalled)),
        "stalled_s": float(stalled.sum()),
    }
