"""The exported trace's requests: one slice per request, from its arrival to its finish.

Process ``REQUEST_PID`` (``requests``) holds them on lanes (threads ``lane 0``, ``lane 1``,
...): a request takes the first lane free at its arrival, so the slices of a lane never
overlap and Perfetto keeps every one. A request never finished ends at its last token (else its
first, else its arrival). Each slice (category ``request``, named ``request <req_id>``) carries
``req_id``, the token counts, ``finish_reason``, ``ttft_ms`` and ``e2e_ms`` and, on a run with
decoded text, ``prompt_text`` (its last ``TEXT_CHARS`` characters: what the model answers is at
the end) and ``output_text`` (its first ``TEXT_CHARS``), "…" where cut. With a window of steps
only the requests alive during it are exported.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from mrv2_prof.analysis.trace_rows import request_rows, request_spans
from mrv2_prof.analysis.trace_window import TrackQuery
from mrv2_prof.report.chrome_trace import Event, Slice

REQUEST_PID = 3
REQUEST_CATEGORY = "request"
TEXT_CHARS = 1000
ELLIPSIS = "…"


def request_lanes(q: TrackQuery) -> list[int]:
    """The lane of each exported request, in arrival order: the lowest lane free at arrival."""
    free: list[int] = []  # lanes whose last request has ended
    busy: list[tuple[int, int]] = []  # (end_ns, lane) of the lanes in use
    lanes: list[int] = []
    num_lanes = 0
    for start, end in request_spans(q):
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, num_lanes = num_lanes, num_lanes + 1
        heapq.heappush(busy, (max(end, start), lane))
        lanes.append(lane)
    return lanes


def _shortened(text: str | None, from_end: bool) -> str | None:
    if text is None or len(text) <= TEXT_CHARS:
        return text
    if from_end:
        return ELLIPSIS + text[len(text) - TEXT_CHARS + 1 :]
    return text[: TEXT_CHARS - 1] + ELLIPSIS


def request_slices(q: TrackQuery, lanes: list[int]) -> Iterator[Slice]:
    """The requests' slices, in arrival order, each on its lane (thread ``1 + lane``)."""
    rows = request_rows(q)
    for lane, row in zip(lanes, rows, strict=False):
        req, start, end, prompt_tokens, output_tokens, reason, ttft, e2e, prompt, output = row
        event: Event = {
            "name": f"request {req}",
            "cat": REQUEST_CATEGORY,
            "pid": REQUEST_PID,
            "tid": 1 + lane,
            "args": {
                key: value
                for key, value in (
                    ("req_id", req),
                    ("prompt_tokens", prompt_tokens),
                    ("output_tokens", output_tokens),
                    ("finish_reason", reason),
                    ("ttft_ms", ttft),
                    ("e2e_ms", e2e),
                    ("prompt_text", _shortened(prompt, from_end=True)),
                    ("output_text", _shortened(output, from_end=False)),
                )
                if value is not None
            },
        }
        origin = q.origin_ns
        yield Slice(max(start - origin, 0), max(end - origin, 0), event)
