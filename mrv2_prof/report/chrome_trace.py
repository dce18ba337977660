"""Chrome Trace Event Format plumbing: exact µs timestamps, laminar slice tracks, streaming writer.

The store-specific part lives in ``trace_export``; this module knows only the JSON format and what
Perfetto's legacy JSON importer does with it:

* ``ts``/``dur`` are µs. Perfetto turns a JSON real into ns by ``int64(x * 1000.0)`` (truncation),
  so ``us()`` returns the double nearest ``ns / 1000`` that truncates back to ``ns``: a child
  ending where its parent ends stays inside it instead of poking out by 1 ns.
* Slices on one track form a stack; a crossing pair (B starts inside A and ends after it) makes
  Perfetto cut and drop slices (``misplaced_end_event``). ``laminar()`` clips the earlier slice's
  end to the later one's start and records the cut in the slice's args.
* ``displayTimeUnit`` is written *after* ``traceEvents``: old trace processors read a leading
  ``"ns"`` as the unit of ``ts``; placed after the events it only sets the display unit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

Event = dict[str, Any]


def us(ns: int) -> float:
    """``ns`` (≥ 0) as µs, the float Perfetto reads back as exactly ``ns`` nanoseconds."""
    value = ns / 1000
    while int(value * 1000.0) < ns:
        value = math.nextafter(value, math.inf)
    return value


def metadata(pid: int, tid: int, kind: str, **args: Any) -> Event:
    """An ``M`` event, e.g. ``metadata(1, 0, "process_name", name="runner")``."""
    return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": args}


@dataclass
class Slice:
    """One slice of a track before it is written: times in ns relative to the trace origin.

    ``event`` holds everything but ``ts``/``dur``; an ``instant`` becomes a thread-scoped ``i``.
    """

    start_ns: int
    end_ns: int
    event: Event
    instant: bool = False

    def to_event(self) -> Event:
        event = dict(self.event)
        event["ts"] = us(self.start_ns)
        if self.instant:
            event.update(ph="i", s="t")
        else:
            event.update(ph="X", dur=us(self.end_ns - self.start_ns))
        return event


def laminar(slices: Iterable[Slice]) -> Iterator[Event]:
    """Events of one track from slices sorted by (start, longer first), nested or disjoint.

    A slice is held until the outermost slice around it closes (a step's subtree at most), so the
    output streams. A crossing slice's end is clipped to the start of the one it crosses
    (``args.clipped_ns`` says by how much), which keeps Perfetto's slice stack valid.
    """
    pending: list[Slice] = []
    stack: list[Slice] = []
    for item in slices:
        item.end_ns = max(item.end_ns, item.start_ns)
        while stack:
            top = stack[-1]
            if top.end_ns <= item.start_ns:
                stack.pop()
            elif top.end_ns < item.end_ns and not item.instant:
                args = top.event.setdefault("args", {})
                args["clipped_ns"] = top.end_ns - item.start_ns
                top.end_ns = item.start_ns
                stack.pop()
            else:
                break
        if not stack:
            yield from (s.to_event() for s in pending)
            pending.clear()
        pending.append(item)
        if not item.instant:
            stack.append(item)
    yield from (s.to_event() for s in pending)


@dataclass
class WriteStats:
    num_events: int = 0
    by_phase: dict[str, int] = field(default_factory=dict)


def write_trace(out: TextIO, events: Iterable[Event], other_data: dict[str, Any]) -> WriteStats:
    """Stream ``events`` to ``out`` as one JSON object, an event per line; ``other_data`` is
    serialised after the events, so a generator may still fill it in while it runs."""
    stats = WriteStats()
    out.write('{"traceEvents": [\n')
    for event in events:
        if stats.num_events:
            out.write(",\n")
        out.write(json.dumps(event, separators=(",", ":"), allow_nan=False))
        stats.num_events += 1
        stats.by_phase[event["ph"]] = stats.by_phase.get(event["ph"], 0) + 1
    other_data["num_events"] = stats.num_events
    out.write('\n],\n"displayTimeUnit": "ns",\n"otherData": ')
    out.write(json.dumps(other_data, indent=1, allow_nan=False))
    out.write("}\n")
    return stats
