"""The recording probe: every hook into preallocated numpy columns, drained for the store.

``RecordingProbe`` writes each record into a ``RecordBuffer`` per table; nothing is allocated per
event except when a buffer is full and doubles. The tables, the interned strings and their
hand-over to the store (``swap``, ``decode``, ``drain``) are ``RecordTables``
(``probes/record_tables.py``). The phase names are interned first, in ``PHASES`` order, and the
span tracks next, so a phase's id is its index and a span's ``name`` and ``track`` need no
lookup.

Only ``steps`` lists its columns here, the ones a step's row gets when the step ends; the rest of
that table (device times, overlap, bubbles) is written after the run (``store.step_timeline``).
Timestamps are ``time.perf_counter_ns()``; ``-1`` in an ``*_ns`` column means "not measured".
"""

from __future__ import annotations

from collections.abc import Sequence
from math import nan
from time import perf_counter_ns

from mrv2_prof.probes.api import DRAFT, FORWARD, PHASES, PREPARE, SAMPLE, SCHEDULE, STEP, Probe
from mrv2_prof.probes.record_tables import (
    ARRIVED,
    CPU_TRACK,
    FINISHED,
    FIRST_TOKEN,
    GPU_TRACK,
    RecordTables,
)

# GPU_PHASES of probes.gpu_timeline ("prepare", "forward", "sample", "draft") as PHASES indices
_GPU_PHASE_IDS = (PREPARE, FORWARD, SAMPLE, DRAFT)
# spec_step's columns of the step row, in SPEC_COLUMNS order, and their defaults (no drafts; NaN:
# no dynamic-k decision, stored as NULL)
SPEC_COLUMNS = (
    "spec_k", "num_draft_tokens", "num_accepted_tokens", "spec_reserved", "spec_reclaimed",
    "spec_sat_out", "spec_expected_tokens", "spec_cost_ratio",
)  # fmt: skip
_NO_SPEC = (0, 0, 0, 0, 0, 0, nan, nan)

# The columns of a ``steps`` row at the step's end, in the order ``step_end`` takes them.
STEP_COLUMNS = (
    "step", "cpu_start_ns", "cpu_end_ns", "num_reqs", "num_tokens", "num_prefill_tokens",
    "num_decode_tokens", "num_waiting", "num_running", "kv_used_blocks", "num_preempted",
    "output_wait_ns", "graph_mode", "context_tokens", "attn_pairs", *SPEC_COLUMNS,
)  # fmt: skip
# The columns of a ``requests`` row the probe records; its text columns are decoded from the
# token ids on the writer thread (request_texts.py), never here.
REQUEST_COLUMNS = (
    "req_id", "arrival_ns", "first_token_ns", "finish_ns", "prompt_tokens", "output_tokens",
    "num_preemptions", "finish_reason", "cached_tokens",
)  # fmt: skip


class RecordingProbe(RecordTables, Probe):
    """Records every hook into preallocated buffers; ``drain()`` empties them for the store."""

    enabled = True

    def __init__(self, capacity: int = 1 << 14) -> None:
        super().__init__()  # the interned names (PHASES, then the tracks) and the hand-over state
        self.step = -1
        self._open = [0] * len(PHASES)  # start of the open span per phase
        # The innermost open phase (-1: none), read by the host sampler; each phase's parent.
        self.phase = -1
        self._parent = [-1] * len(PHASES)
        self._dispatch_ids: dict[tuple[str, str, str], tuple[int, int, int]] = {}
        # defaults: a host span's track, a step's speculative-decoding columns (no drafts)
        self.steps = self._buffer(
            "steps", capacity, STEP_COLUMNS, dict(zip(SPEC_COLUMNS, _NO_SPEC, strict=True))
        )
        self.spans = self._buffer("spans", 8 * capacity, defaults={"track": CPU_TRACK})
        self.staged = self._buffer("staged_writes", 4 * capacity)
        self.dispatch = self._buffer("graph_dispatch", capacity)
        self.syncs = self._buffer("syncs", capacity)
        self.tokens = self._buffer("tokens", 16 * capacity)
        self.finished = self._buffer("requests", capacity, REQUEST_COLUMNS)
        self.copies = self._buffer("copies", 4 * capacity)
        self.ranks = self._buffer("rank_steps", capacity)
        self.verifies = self._buffer("spec_verifies", capacity)
        self.compiles = self._buffer("compiles", 256)  # rare: a launcher's cache miss
        self._spec = _NO_SPEC  # spec_step's values (SPEC_COLUMNS) until step_end
        self.timeline = None  # a probes.gpu_timeline.GpuTimeline on CUDA with cuda_events

    # ---- steps and spans -----------------------------------------------------------------------
    def step_begin(self, step: int) -> None:
        self.step = step
        self._parent[STEP] = self.phase  # inside the step, outside its phases: "step"
        self.phase = STEP
        self._open[STEP] = perf_counter_ns()

    def step_end(
        self,
        num_reqs: int,
        num_tokens: int,
        num_prefill_tokens: int,
        num_waiting: int,
        num_running: int,
        kv_used_blocks: int,
        num_preempted: int,
        output_wait_ns: int,
        graph_mode: str,
        context_tokens: int = -1,
        attn_pairs: int = -1,
    ) -> None:
        t = perf_counter_ns()
        b = self.steps
        i = b.n if b.n < b.capacity else b.reserve()
        w = b.w
        w.step[i] = self.step
        w.cpu_start_ns[i] = self._open[STEP]
        w.cpu_end_ns[i] = t
        w.num_reqs[i] = num_reqs
        w.num_tokens[i] = num_tokens
        w.num_prefill_tokens[i] = num_prefill_tokens
        w.num_decode_tokens[i] = num_tokens - num_prefill_tokens
        w.num_waiting[i] = num_waiting
        w.num_running[i] = num_running
        w.kv_used_blocks[i] = kv_used_blocks
        w.num_preempted[i] = num_preempted
        w.output_wait_ns[i] = output_wait_ns
        w.context_tokens[i] = context_tokens
        w.attn_pairs[i] = attn_pairs
        mode = self._names.get(graph_mode)
        w.graph_mode[i] = self.intern(graph_mode) if mode is None else mode
        if self._spec is not _NO_SPEC:  # else the columns' defaults
            (
                w.spec_k[i], w.num_draft_tokens[i], w.num_accepted_tokens[i], w.spec_reserved[i],
                w.spec_reclaimed[i], w.spec_sat_out[i], w.spec_expected_tokens[i],
                w.spec_cost_ratio[i],
            ) = self._spec  # fmt: skip
            self._spec = _NO_SPEC
        b.n = i + 1
        self._span(STEP, self._open[STEP], t)
        self.phase = self._parent[STEP]
        if self._step_recorded is not None:
            self._step_recorded(num_reqs, num_tokens, num_prefill_tokens, graph_mode)

    # After a step's row, ``(num_reqs, num_tokens, num_prefill_tokens, graph_mode)``: a
    # subclass that emits the step elsewhere too sets it (None: no call on the step loop).
    _step_recorded = None

    def begin(self, phase: int) -> None:
        self._parent[phase] = self.phase
        self.phase = phase
        self._open[phase] = perf_counter_ns()

    def end(self, phase: int) -> None:
        t = perf_counter_ns()
        b = self.spans  # ``_span``, inlined: the hottest hook; ``track``: CPU by default
        i = b.n if b.n < b.capacity else b.reserve()
        w = b.w
        w.step[i] = self.step
        w.name[i] = phase
        w.start_ns[i] = self._open[phase]
        w.end_ns[i] = t
        b.n = i + 1
        self.phase = self._parent[phase]

    def switch(self, ending: int, beginning: int) -> None:
        t = perf_counter_ns()
        b = self.spans  # ``end(ending)``, inlined
        i = b.n if b.n < b.capacity else b.reserve()
        w = b.w
        w.step[i] = self.step
        w.name[i] = ending
        w.start_ns[i] = self._open[ending]
        w.end_ns[i] = t
        b.n = i + 1
        self._parent[beginning] = self._parent[ending]  # ``begin(beginning)``, at the same t
        self.phase = beginning
        self._open[beginning] = t

    def _span(self, phase: int, start_ns: int, end_ns: int) -> None:
        b = self.spans  # ``track``: CPU by default
        i = b.n if b.n < b.capacity else b.reserve()
        w = b.w
        w.step[i] = self.step
        w.name[i] = phase
        w.start_ns[i] = start_ns
        w.end_ns[i] = end_ns
        b.n = i + 1

    def gpu_span(
        self, step: int, gpu_phase: int, start_ns: int, end_ns: int, starved_ns: int = -1
    ) -> None:
        """A resolved device span (the timeline's sink); ``gpu_phase`` indexes ``GPU_PHASES``;
        ``starved_ns`` the part of it the device waited for the host (-1: not known)."""
        b = self.spans
        i = b.reserve()
        b.step[i] = step
        b.track[i] = GPU_TRACK
        b.name[i] = _GPU_PHASE_IDS[gpu_phase]
        b.start_ns[i] = start_ns
        b.end_ns[i] = end_ns
        b.starved_ns[i] = starved_ns
        b.n = i + 1

    def gpu_mark(self, mark: int) -> object | None:
        t = self.timeline
        return None if t is None else t.mark(self.step, mark, self._open[SCHEDULE])

    def before_wait(self, ready: object) -> None:
        t = self.timeline
        if t is not None:
            t.poll_while(ready)

    def copy(
        self,
        direction: str,
        num_bytes: int,
        pinned: bool,
        contiguous: bool,
        non_blocking: bool,
        host_ns: int,
    ) -> None:
        b = self.copies
        i = b.reserve()
        b.step[i] = self.step
        b.direction[i] = self.intern(direction)
        b.bytes[i] = num_bytes
        b.pinned[i] = pinned
        b.contiguous[i] = contiguous
        b.non_blocking[i] = non_blocking
        b.host_ns[i] = host_ns
        b.n = i + 1

    # ---- typed records -------------------------------------------------------------------------
    def staged_write(
        self, tensor: str, rows: int, elements: int, staged_bytes: int, dense_bytes: int
    ) -> None:
        b = self.staged
        i = b.n if b.n < b.capacity else b.reserve()
        w = b.w
        w.step[i] = self.step
        name = self._names.get(tensor)
        w.tensor[i] = self.intern(tensor) if name is None else name
        w.rows[i] = rows
        w.elements[i] = elements
        w.staged_bytes[i] = staged_bytes
        w.dense_bytes[i] = dense_bytes
        b.n = i + 1

    def graph_dispatch(
        self,
        num_tokens: int,
        padded_tokens: int,
        requested_mode: str,
        mode: str,
        hit: bool,
        reason: str,
    ) -> None:
        b = self.dispatch
        i = b.n if b.n < b.capacity else b.reserve()
        key = (requested_mode, mode, reason)  # one lookup for the step's three strings
        ids = self._dispatch_ids.get(key)
        if ids is None:
            ids = (self.intern(requested_mode), self.intern(mode), self.intern(reason))
            self._dispatch_ids[key] = ids
        w = b.w
        w.step[i] = self.step
        w.num_tokens[i] = num_tokens
        w.padded_tokens[i] = padded_tokens
        w.requested_mode[i], w.mode[i], w.reason[i] = ids
        b.hit[i] = hit  # numpy: takes any truth value
        b.n = i + 1

    def graph_capture(
        self, key: str, mode: str, num_tokens: int, capture_s: float, mem_bytes: int
    ) -> None:
        # the step that captured it (on first use), -1 at start-up as in ``compiles``
        self.captures.append((key, mode, num_tokens, capture_s, mem_bytes, self.step))

    def sync(self, kind: str, site: str, blocked_ns: int, t_ns: int = -1) -> None:
        b = self.syncs
        i = b.n if b.n < b.capacity else b.reserve()
        w = b.w
        w.step[i] = self.step
        w.t_ns[i] = perf_counter_ns() - blocked_ns if t_ns < 0 else t_ns
        names = self._names
        k, s = names.get(kind), names.get(site)
        w.kind[i] = self.intern(kind) if k is None else k
        w.site[i] = self.intern(site) if s is None else s
        w.blocked_ns[i] = blocked_ns
        b.n = i + 1

    def kernel_compile(self, source: str, kernel: str, key: str, compile_ms: float) -> None:
        b = self.compiles
        i = b.reserve()
        b.step[i] = self.step
        b.t_ns[i] = perf_counter_ns() - int(compile_ms * 1e6)  # when it began
        b.source[i] = self.intern(source)
        b.kernel[i] = self.intern(kernel)
        b.key[i] = self.intern(key)
        b.compile_ms[i] = compile_ms
        b.after_warmup[i] = self.step >= 0  # a step has begun: a request paid for it
        b.n = i + 1

    def rank_step(self, rank: int, step: int, start_ns: int, end_ns: int, comm_ns: int) -> None:
        b = self.ranks
        i = b.reserve()
        b.rank[i], b.step[i], b.start_ns[i] = rank, step, start_ns
        b.end_ns[i], b.comm_ns[i] = end_ns, comm_ns
        b.n = i + 1

    def spec_step(
        self,
        k: int,
        num_draft_tokens: int,
        verifies: list[tuple[str, int, int]],
        reserved: int = 0,
        reclaimed: int = 0,
        sat_out: int = 0,
        expected_tokens: float | None = None,
        cost_ratio: float | None = None,
    ) -> None:
        b = self.verifies
        i = b.reserve(len(verifies))
        accepted = 0
        for j, (req_id, drafted, num_accepted) in enumerate(verifies, start=i):
            b.step[j] = self.step
            b.req_id[j] = self.intern(req_id)
            b.num_draft_tokens[j] = drafted
            b.num_accepted_tokens[j] = num_accepted
            accepted += num_accepted
        b.n = i + len(verifies)
        self._spec = (
            int(k), int(num_draft_tokens), accepted, int(reserved), int(reclaimed), int(sat_out),
            nan if expected_tokens is None else float(expected_tokens),
            nan if cost_ratio is None else float(cost_ratio),
        )  # fmt: skip

    def request_arrival(self, req_id: str, arrival_ns: int, prompt_tokens: int) -> None:
        r = self.intern(req_id)
        self.arrivals[r] = (arrival_ns, prompt_tokens)
        self._request_events.append((ARRIVED, r, arrival_ns, prompt_tokens))

    def token(self, req_id: str, idx: int, t_ns: int, token_id: int) -> None:
        r = self.intern(req_id)
        if idx == 0:
            self.first_token[r] = t_ns
            self._request_events.append((FIRST_TOKEN, r, t_ns))
        b = self.tokens
        i = b.reserve()
        b.req_id[i] = r
        b.idx[i] = idx
        b.t_ns[i] = t_ns
        b.token_id[i] = token_id
        b.n = i + 1

    def step_tokens(
        self,
        req_ids: list[str],
        idx: Sequence[int],
        t_ns: int,
        token_ids: list[int],
        first_tokens: bool = True,
    ) -> None:
        """One step's tokens at once: ``req_ids[j]`` got token ``token_ids[j]``, its output
        number ``idx[j]``. The lists themselves are kept (the caller never changes them) and
        made into rows on the writer thread: one tuple per step on the step loop. With
        ``first_tokens`` False (no ``idx`` is 0) the scan for first tokens is skipped: on a
        numpy ``idx`` it costs a few µs whatever the batch."""
        if not req_ids:
            return
        self._step_tokens.append((req_ids, idx, t_ns, token_ids))
        self._num_step_tokens += len(req_ids)
        if first_tokens and 0 in idx:  # first tokens: the finish row's time to first token
            for j, n in enumerate(idx):
                if n == 0:
                    r = self.intern(req_ids[j])
                    self.first_token[r] = t_ns
                    self._request_events.append((FIRST_TOKEN, r, t_ns))

    def request_finish(
        self,
        req_id: str,
        finish_ns: int,
        output_tokens: int,
        num_preemptions: int,
        finish_reason: str | None,
        cached_tokens: int,
    ) -> None:
        r = self.intern(req_id)
        arrival_ns, prompt_tokens = self.arrivals.pop(r, (-1, 0))
        self._request_events.append((FINISHED, r))
        b = self.finished
        i = b.reserve()
        b.req_id[i] = r
        b.arrival_ns[i] = arrival_ns
        b.first_token_ns[i] = self.first_token.pop(r, -1)
        b.finish_ns[i] = finish_ns
        b.prompt_tokens[i] = prompt_tokens
        b.output_tokens[i] = output_tokens
        b.num_preemptions[i] = num_preemptions
        b.finish_reason[i] = self.intern(finish_reason)
        b.cached_tokens[i] = max(cached_tokens, 0)
        b.n = i + 1
