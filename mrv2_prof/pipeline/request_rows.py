"""The ``requests`` rows of a live run's flushes: a request is in the table from its arrival.

The probe records a request's row when it finishes; alone, a run killed mid-way would keep the
tokens of every request still in flight and no row for them. ``InFlightRows`` adds to each
flush a row for every request that arrived or got tokens since the last one (``finish_reason``
NULL, ``output_tokens`` = its tokens written so far), so the flush's one transaction commits
tokens and their request rows together; the store keeps one row per ``req_id``, so the
finished row replaces it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mrv2_prof.probes.recording import ARRIVED, FIRST_TOKEN

if TYPE_CHECKING:
    from mrv2_prof.probes.record_tables import Handoff
    from mrv2_prof.probes.recording import RecordingProbe

Batches = dict[str, dict[str, np.ndarray]]


@dataclass(frozen=True)
class InFlight:
    """The probe's in-flight requests as of a buffer swap (``InFlightRows.follow``)."""

    arrivals: dict[int, tuple[int, int]]  # req -> (arrival_ns, prompt_tokens)
    first_token: dict[int, int]  # req -> first token t_ns
    name_of: Callable[[int], str | None]


class InFlightRows:
    """Per run: the tokens written so far of each request that has not finished."""

    def __init__(self) -> None:
        self.tokens_written: dict[str, int] = {}
        # the requests in flight as of the last hand-over followed, as the probe has them
        self._arrivals: dict[int, tuple[int, int]] = {}
        self._first_token: dict[int, int] = {}

    def follow(self, handoff: Handoff, name_of: Callable[[int], str | None]) -> InFlight:
        """On the writer thread: the requests in flight as of ``handoff``'s swap, from the
        request events it carries (nothing about requests is copied on the step loop)."""
        arrivals, first = self._arrivals, self._first_token
        for event in handoff.request_events:
            kind, rid = event[0], event[1]
            if kind == ARRIVED:
                arrivals[rid] = (event[2], event[3])
            elif kind == FIRST_TOKEN:
                first[rid] = event[2]
            else:  # finished
                arrivals.pop(rid, None)
                first.pop(rid, None)
        return InFlight(arrivals, first, name_of)

    def add_to(self, batches: Batches, probe: RecordingProbe | InFlight) -> None:
        """Append to ``batches["requests"]`` (the decoded hand-over of one swap) the rows of the
        requests in flight that arrived or got tokens since the last one (``probe``: what
        ``follow`` made of that hand-over, or the probe itself where nothing runs meanwhile)."""
        finals = batches.get("requests")
        finished = set(finals["req_id"].tolist()) if finals is not None else set()
        changed: set[str] = set()
        tokens = batches.get("tokens")
        if tokens is not None and len(tokens["req_id"]):
            names, counts = np.unique(tokens["req_id"].astype(str), return_counts=True)
            for name, count in zip(names.tolist(), counts.tolist(), strict=True):
                self.tokens_written[name] = self.tokens_written.get(name, 0) + count
                changed.add(name)
        for name in finished:
            self.tokens_written.pop(name, None)
        rows: list[tuple[str, int, int, int]] = []
        for rid, (arrival_ns, prompt_tokens) in probe.arrivals.items():
            name = probe.name_of(rid)
            if name is None or name in finished:
                continue
            if name in changed or name not in self.tokens_written:
                self.tokens_written.setdefault(name, 0)
                rows.append((name, arrival_ns, probe.first_token.get(rid, -1), prompt_tokens))
        if rows:
            batches["requests"] = _concat(finals, self._columns(rows))

    def _columns(self, rows: list[tuple[str, int, int, int]]) -> dict[str, np.ndarray]:
        n = len(rows)
        names = [r[0] for r in rows]
        unknown = np.full(n, None, dtype=object)  # not known until it finishes: NULL
        return {
            "req_id": np.array(names, dtype=object),
            "arrival_ns": np.array([r[1] for r in rows], dtype=np.int64),
            "first_token_ns": np.array([r[2] for r in rows], dtype=np.int64),
            "finish_ns": np.full(n, -1, dtype=np.int64),
            "prompt_tokens": np.array([r[3] for r in rows], dtype=np.int64),
            "output_tokens": np.array([self.tokens_written[k] for k in names], dtype=np.int64),
            "num_preemptions": unknown,
            "finish_reason": unknown,
            "cached_tokens": unknown,
        }


def _concat(
    finals: dict[str, np.ndarray] | None, rows: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The drained finished rows followed by the in-flight ones, column by column."""
    if finals is None or not len(finals["req_id"]):
        if finals is not None:
            rows = {k: v for k, v in rows.items() if k in finals}
        return rows
    out = {}
    for name, values in finals.items():
        extra = rows.get(name)
        if extra is None:
            extra = np.full(len(rows["req_id"]), None, dtype=object)
        if values.dtype != extra.dtype:
            values, extra = values.astype(object), extra.astype(object)
        out[name] = np.concatenate([values, extra])
    return out
