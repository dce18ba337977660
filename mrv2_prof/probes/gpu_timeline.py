"""The GPU timeline from CUDA events: device time per step and per phase (architecture: Probes).

The runner marks four boundaries of every step that runs GPU work on its stream:
``G_PREPARE`` (before the step's first copy or kernel), ``G_FORWARD``, ``G_SAMPLE`` and
``G_END`` (after the sampled tokens' copy to the host; the runner's output waits on that
event as its ready event, so the mark adds no record of its own). An event completes when the stream
reaches it, so the ``G_PREPARE`` event is the moment the GPU started on the step (or finished the
previous one, whichever came later) and ``G_END`` the moment it finished. Phase spans are
``prepare`` = G_PREPARE→G_FORWARD, ``forward`` = G_FORWARD→G_SAMPLE and ``sample`` =
G_SAMPLE→G_END; a step that runs a draft model (speculative decoding) also marks ``G_DRAFT``
between them, and its ``sample`` ends there and ``draft`` = G_DRAFT→G_END follows. Every
boundary is recorded outside the CUDA graphs, so a replayed step keeps its phase times. A FULL
decode step with ``runner.full_step_graph`` builds its inputs and writes its new block-table
entries inside its forward graph, so its ``forward`` holds both and its ``prepare`` only the
other staged writes and the step's copy;
its ``sample`` is the sample graph (sampling and the state advance) and the copy out.

Costs: an event record is a few µs of host time (2.2–12 µs measured on an H200's host, the CUDA
call itself 2.2 µs of it), so four marks per step, not one per kernel, and three records: ``G_END``
is the output's own event. The stream they are recorded on is looked up once per step, and its
``Stream`` object is built again only when the raw stream changed (torch's ``Event.record()``
without a stream builds one per call). A torch event is recorded and read through its class's C
methods, without ``torch.cuda.Event``'s Python frames. Events come from a pool allocated at
start; a step's events are reused only after its last event is known complete. Nothing waits:
``poll()`` asks ``query()`` of the oldest step's last event and resolves whatever is complete.
The runner's output wait calls it first (``poll_while``, through the probe's ``before_wait``)
when the device is still busy, so the resolution (a few event reads and the overlap
arithmetic, tens of µs a step on the H200's host) runs where the host would wait. After a step,
``backstop`` resolves one step, only when more than two are in flight (a host-bound run, whose
waits never block). When every slot of the pool is still in
flight, the next step goes unmeasured (counted in ``dropped``) instead of waiting.

Clock: CUDA events give device time relative to each other (``elapsed_time``, float32 ms, about
0.5 µs resolution). An *anchor* event, recorded on an idle stream right after reading
``perf_counter_ns``, ties device time to the host clock; every step is mapped from the current
reference event. Anchors are re-taken at idle points (``anchor()``) and at the end; each new
anchor is first predicted from the previous reference and the difference is recorded as the
drift. Between anchors the reference moves to a resolved step's last event about once a second,
so float32 ``elapsed_time`` never spans much more than that (its resolution stays near 0.1 µs,
under the events' own 0.5 µs).

The host time of each mark's record is kept too: against the device time the stream reached the
mark it gives each phase's starved time (``probes.starvation``, the events rule), handed to the
sink with the span when the timeline is built ``with_starved``.

The timeline also keeps running totals of overlap, bubbles and starved time for the live view,
each step through ``probes.overlap.against_previous``, the rule the stored per-step values
(computed from the spans at the end of the run) use too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns

import torch

from mrv2_prof.probes.api import G_DRAFT, G_END, G_FORWARD, G_PREPARE, G_SAMPLE
from mrv2_prof.probes.overlap import HOST_BOUND, OTHER, against_previous
from mrv2_prof.probes.starvation import starved_from_marks
from mrv2_prof.probes.sync_site import wait_deliberately

NUM_MARKS = 5
GPU_PHASES = ("prepare", "forward", "sample", "draft")  # between consecutive recorded marks
_ALL_MARKS = (1 << 4) - 1  # every step records these four; G_DRAFT is optional
_ORDER = (G_PREPARE, G_FORWARD, G_SAMPLE, G_END)  # the marks in stream order, no draft
_ORDER_DRAFT = (G_PREPARE, G_FORWARD, G_SAMPLE, G_DRAFT, G_END)
BACKLOG = 2  # steps in flight with async scheduling: the one waited for and the one queued
ANCHOR_TRIES, TIGHT_ANCHOR_NS = 5, 20_000  # an anchor's record call should take < 20 µs
REBASE_AFTER_NS = 1_000_000_000  # float32 ms: ~0.12 µs resolution up to 2 s

# (step, phase index into GPU_PHASES, start_ns, end_ns[, starved_ns])
SpanSink = Callable[..., None]


@dataclass
class Anchor:
    t_ns: int  # host clock of the anchor
    uncertainty_ns: int  # half the host time the event record took
    drift_ns: int | None  # measured − predicted from the previous reference (None: the first)
    since_ns: int  # host time since the previous anchor


@dataclass
class LiveTotals:
    """Overlap and bubbles so far (the live view's numbers)."""

    prep_ns: int = 0
    hidden_ns: int = 0
    host_bound_bubble_ns: int = 0
    other_bubble_ns: int = 0
    starved_ns: int = 0  # device waiting for the host inside steps (a host-bound bubble too)
    steps: int = 0
    # (step, device ns from its first to its last mark) of the last steps resolved: the live
    # roofline (pipeline/live_roofline.py) pairs them with the steps' rows
    recent_gpu: deque = field(default_factory=lambda: deque(maxlen=256))

    @property
    def overlap(self) -> float | None:
        return self.hidden_ns / self.prep_ns if self.prep_ns > 0 else None


@dataclass
class _Slot:
    events: list[torch.cuda.Event]
    step: int = -1
    marks: int = 0  # bit i: mark i recorded
    prep_start_ns: int = -1  # host: start of the step's schedule
    enqueue_end_ns: int = -1  # host: when its last mark was recorded
    times: list[int] = field(default_factory=lambda: [0] * NUM_MARKS)
    host_ns: list[int] = field(default_factory=lambda: [0] * NUM_MARKS)  # each mark's record


class GpuTimeline:
    def __init__(self, sink: SpanSink, capacity: int = 64, with_starved: bool = False) -> None:
        self._sink = sink
        self._with_starved = with_starved
        self._slots = [
            _Slot([self._new_event() for _ in range(NUM_MARKS)]) for _ in range(capacity)
        ]
        self._head = 0  # oldest slot in flight
        self._count = 0  # slots in flight
        self._current: _Slot | None = None  # the step being recorded
        self._stream = None  # the stream the step's marks are recorded on
        self._raw_stream = self._stream_obj = None  # ``_current_stream``'s cache
        self._skip_step = -1  # a step dropped because the pool was full
        self.dropped = 0
        self.anchors: list[Anchor] = []
        self._ref = self._new_event()
        self._record, self._elapsed = _event_calls(self._ref)
        self._ref_ns = -1
        self._prev_gpu: tuple[int, int] | None = None  # (start, end) of the last resolved step
        self._prev_starved: list[tuple[int, int]] = []  # its starved windows
        self.live = LiveTotals()

    # ---- the runner's side (hot path: records, never waits) -----------------------------------
    def mark(self, step: int, mark: int, prep_start_ns: int):
        """Record ``mark`` of ``step`` on the step's stream; returns the event recorded (None
        when the step goes unmeasured). A step's events are reused only after it resolved, so
        the runner may wait on its ``G_END`` event as its output's ready event."""
        if step == self._skip_step:
            return None
        slot = self._current
        if slot is None or slot.step != step:
            slot = self._open(step)
            if slot is None:
                return None
            slot.prep_start_ns = prep_start_ns
        slot.host_ns[mark] = perf_counter_ns()
        event, stream = slot.events[mark], self._stream
        if stream is None:
            event.record()
        else:  # the step's stream, looked up once (``Event.record()`` builds one each call)
            self._record(event, stream)
        slot.marks |= 1 << mark
        if mark == G_END:
            slot.enqueue_end_ns = perf_counter_ns()
            self._current = None
        return event

    def _open(self, step: int) -> _Slot | None:
        if self._count == len(self._slots):
            self.poll()
            if self._count == len(self._slots):
                self.dropped += 1
                self._skip_step = step
                return None
        slot = self._slots[(self._head + self._count) % len(self._slots)]
        self._count += 1
        slot.step, slot.marks = step, 0
        self._current = slot
        self._stream = self._current_stream()
        return slot

    # ---- resolution (between steps; query() only) ---------------------------------------------
    @property
    def in_flight(self) -> int:
        """Steps recorded and not resolved yet."""
        return self._count

    def poll_while(self, ready) -> int:
        """Before the host blocks until ``ready`` (an event) completes: resolve what is complete
        while the device is still busy, so that the resolution costs the step loop nothing;
        when ``ready`` is complete already (the host is behind the device) nothing is done
        here and ``poll`` resolves later (``backstop``). Returns the steps resolved."""
        return 0 if ready.query() else self.poll()

    def backstop(self) -> int:
        """After a step: resolve one step when more than ``BACKLOG`` are in flight (no wait of
        the step loop gave ``poll_while`` its chance), so that a host-bound run resolves one
        step per step instead of a pool at once."""
        return self.poll(1) if self._count > BACKLOG else 0

    def poll(self, limit: int | None = None) -> int:
        """Resolve every complete step (at most ``limit``), oldest first; returns how many."""
        done = 0
        while self._count and done != limit:
            slot = self._slots[self._head]
            if slot is self._current or not slot.events[G_END].query():
                break
            self._resolve(slot)
            self._head = (self._head + 1) % len(self._slots)
            self._count -= 1
            done += 1
        return done

    def _resolve(self, slot: _Slot) -> None:
        if self._ref_ns < 0 or slot.marks & _ALL_MARKS != _ALL_MARKS:
            return  # no anchor yet, or a step that did not record every boundary
        ref, ref_ns = self._ref, self._ref_ns
        t = slot.times
        order = _ORDER_DRAFT if slot.marks & (1 << G_DRAFT) else _ORDER
        elapsed, events = self._elapsed, slot.events
        for m in order:
            t[m] = ref_ns + round(elapsed(ref, events[m]) * 1e6)
        tt = [t[m] for m in order]
        starved = starved_from_marks([slot.host_ns[m] for m in order], tt)
        for i in range(len(order) - 1):  # phase i: prepare, forward, sample[, draft]
            if self._with_starved:
                self._sink(slot.step, i, tt[i], tt[i + 1], starved[i])
            else:
                self._sink(slot.step, i, tt[i], tt[i + 1])
        windows = [(tt[i], tt[i] + starved[i]) for i in range(len(order) - 1) if starved[i] > 0]
        self._account(slot.prep_start_ns, slot.enqueue_end_ns, t[G_PREPARE], t[G_END], windows)
        self.live.recent_gpu.append((slot.step, tt[-1] - tt[0]))
        if t[G_END] - ref_ns > REBASE_AFTER_NS:
            # The step's last event becomes the reference; the old reference joins the pool.
            self._ref, slot.events[G_END] = slot.events[G_END], ref
            self._ref_ns = t[G_END]

    def _account(
        self,
        prep_start: int,
        enqueue_end: int,
        gpu_start: int,
        gpu_end: int,
        starved: list[tuple[int, int]],
    ) -> None:
        live, prev = self.live, self._prev_gpu
        live.steps += 1
        live.starved_ns += sum(b - a for a, b in starved)
        if prev is not None:
            prep, hidden, bubble, kind = against_previous(
                prep_start, enqueue_end, gpu_start, prev[0], prev[1], self._prev_starved
            )
            if prep > 0 and prep_start >= 0:
                live.prep_ns += prep
                live.hidden_ns += hidden
            if kind == HOST_BOUND:
                live.host_bound_bubble_ns += bubble
            elif kind == OTHER:
                live.other_bubble_ns += bubble
        self._prev_gpu = (gpu_start, gpu_end)
        self._prev_starved = starved

    # ---- anchors (idle points only: they wait for the stream) ---------------------------------
    def anchor(self) -> Anchor | None:
        """Tie device time to the host clock again; call only when the stream is idle.
        Returns None (and takes no anchor) while a step is still in flight."""
        return wait_deliberately(self._anchor)

    # the CUDA calls, apart so that tests can stand in a fake device for them
    @staticmethod
    def _new_event():
        return torch.cuda.Event(enable_timing=True)

    def _current_stream(self):
        """The current stream, as a ``torch.cuda.Stream`` built again only when the raw stream
        changed (building one per step cost about 8 µs of host time on the H200's host)."""
        raw = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
        if raw != self._raw_stream:
            self._raw_stream, self._stream_obj = raw, torch.cuda.current_stream()
        return self._stream_obj

    @staticmethod
    def _sync_stream() -> None:
        torch.cuda.current_stream().synchronize()

    def _anchor(self) -> Anchor | None:
        self._sync_stream()
        self.poll()
        if self._count:
            return None
        ev = self._slots[self._head].events[G_PREPARE]  # free: nothing is in flight
        for _ in range(ANCHOR_TRIES):  # a record call that was preempted is tried again
            t0 = perf_counter_ns()
            ev.record()
            t1 = perf_counter_ns()
            ev.synchronize()
            if t1 - t0 <= TIGHT_ANCHOR_NS:
                break
        t_ns = (t0 + t1) // 2
        drift = since = None
        if self._ref_ns >= 0:
            drift = t_ns - (self._ref_ns + round(self._ref.elapsed_time(ev) * 1e6))
            since = t_ns - self.anchors[-1].t_ns
        a = Anchor(t_ns, (t1 - t0) // 2, drift, since or 0)
        self.anchors.append(a)
        # The anchor event becomes the reference; the old reference takes its place in the pool.
        self._ref, self._slots[self._head].events[G_PREPARE] = ev, self._ref
        self._ref_ns = t_ns
        return a

    def finish(self) -> None:
        """End of the run: wait for the stream, resolve everything, take the last anchor."""
        self._current = None
        self.anchor()

    def summary(self) -> dict[str, object]:
        """The clock facts stored on the run (``runs.info['gpu_timeline']``)."""
        drifts = [abs(a.drift_ns) for a in self.anchors if a.drift_ns is not None]
        return {
            "anchors": len(self.anchors),
            "max_abs_drift_ns": max(drifts) if drifts else None,
            "drift_ns": [a.drift_ns for a in self.anchors if a.drift_ns is not None][:100],
            "anchor_uncertainty_ns": max((a.uncertainty_ns for a in self.anchors), default=None),
            "steps_measured": self.live.steps,
            "steps_dropped": self.dropped,
        }


def _event_calls(event) -> tuple[Callable, Callable]:
    """``record(event, stream)`` and ``elapsed_time(start, end)`` of ``event``'s class,
    unbound: for a torch event its C methods, since ``torch.cuda.Event``'s own add a Python
    frame each (``record``'s only defaults the stream)."""
    base = getattr(torch._C, "_CudaEventBase", None)
    if base is not None and isinstance(event, base):
        record, elapsed = getattr(base, "record", None), getattr(base, "elapsed_time", None)
        if record is not None and elapsed is not None:
            return record, elapsed
    return type(event).record, type(event).elapsed_time
