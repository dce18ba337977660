"""The one object the runner talks to (DESIGN §4): phase spans and typed records.

``Probe`` is the no-op default: every hook is an empty method, so an uninstrumented runner pays
one method call per hook. ``RecordingProbe`` writes each record into preallocated numpy columns
(``RecordBuffer``); nothing is allocated per event except when a buffer is full and doubles.
Strings (phase names, tensor names, sync sites, graph reasons, request ids) are interned to small
integers on the hot path and turned back into strings only when the buffers are drained.

``drain()`` hands the columns over as ``{table: {column: array}}`` in the store's column names;
the probe never imports the store. Timestamps are ``time.perf_counter_ns()``; ``-1`` in an
``*_ns`` column (and ``None`` in a string column) means "not measured" and is stored as NULL.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from time import perf_counter_ns
from types import FrameType
from typing import TypeVar

import numpy as np

# Phase names are the NVTX range names (domain ``mrv2``) and ``spans.name`` values.
PHASES = (
    "step",  # schedule → execute → update, one per engine step
    "schedule",  # Scheduler.schedule
    "execute",  # ModelRunner.execute_model
    "prepare",  # request-state diff, staged writes, input prep
    "forward",  # the model
    "sample",  # the sampler
    "output_wait",  # waiting for the sampled tokens (the designed sync point)
    "update",  # Scheduler.update_from_output
    "flush",  # the harness writing probe buffers to the store
)
PH = {name: i for i, name in enumerate(PHASES)}
STEP, SCHEDULE, EXECUTE, PREPARE, FORWARD, SAMPLE, OUTPUT_WAIT, UPDATE, FLUSH = range(len(PHASES))
# The boundaries of a step's GPU work the runner marks on its stream (probes.gpu_timeline).
G_PREPARE, G_FORWARD, G_SAMPLE, G_END = range(4)

_I8, _I32, _F64, _BOOL = np.int64, np.int32, np.float64, np.bool_
# GPU_PHASES of probes.gpu_timeline ("prepare", "forward", "sample") as PHASES indices
_GPU_PHASE_IDS = (PREPARE, FORWARD, SAMPLE)


T = TypeVar("T")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../mrv2_prof
_ROOT = os.path.dirname(_PACKAGE_DIR)


def sync_site(frame: FrameType | None, skip_file: str) -> str:
    """A sync's ``site``: ``path:line`` of the first frame inside ``mrv2_prof`` other than
    ``skip_file`` (the module that noticed the sync), walking outwards from ``frame``; else of the
    first frame outside torch, the warnings module and ``skip_file``."""
    skip = os.path.abspath(skip_file)
    fallback = None
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path != skip:
            if path.startswith(_PACKAGE_DIR + os.sep):
                return f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno}"
            if fallback is None and not _is_library(path):
                fallback = f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "<unknown>"


def _is_library(path: str) -> bool:
    return f"{os.sep}torch{os.sep}" in path or path.endswith("warnings.py")


def wait_deliberately(wait: Callable[[], T]) -> T:
    """Call ``wait``, a wait the code means to make (the runner's output wait, a clock anchor),
    with a sync debug mode (the sync finder's) lifted around it, so it is not reported as a
    hidden sync."""
    import torch

    mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_initialized() else 0
    if mode:
        torch.cuda.set_sync_debug_mode(0)
    try:
        return wait()
    finally:
        if mode:
            torch.cuda.set_sync_debug_mode(mode)


class RecordBuffer:
    """Columns of one record type in preallocated arrays; ``n`` rows are valid."""

    def __init__(self, columns: dict[str, type], capacity: int) -> None:
        self.capacity = capacity
        self.n = 0
        self.cols = {name: np.zeros(capacity, dtype=dt) for name, dt in columns.items()}
        for name, col in self.cols.items():
            setattr(self, name, col)

    def reserve(self, k: int = 1) -> int:
        """Index of the next row, making room for ``k`` rows (doubling when full)."""
        n = self.n
        if n + k > self.capacity:
            self.capacity = max(2 * self.capacity, n + k)
            for name, col in self.cols.items():
                grown = np.zeros(self.capacity, dtype=col.dtype)
                grown[:n] = col[:n]
                self.cols[name] = grown
                setattr(self, name, grown)
        return n

    @property
    def fill(self) -> float:
        return self.n / self.capacity

    def take(self) -> dict[str, np.ndarray]:
        out = {name: col[: self.n].copy() for name, col in self.cols.items()}
        self.n = 0
        return out


class Probe:
    """The no-op probe. Subclasses override the hooks they record."""

    enabled = False

    def step_begin(self, step: int) -> None:
        pass

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
    ) -> None:
        pass

    def begin(self, phase: int) -> None:
        pass

    def end(self, phase: int) -> None:
        pass

    def staged_write(
        self, tensor: str, rows: int, elements: int, staged_bytes: int, dense_bytes: int
    ) -> None:
        pass

    def graph_dispatch(
        self,
        num_tokens: int,
        padded_tokens: int,
        requested_mode: str,
        mode: str,
        hit: bool,
        reason: str,
    ) -> None:
        pass

    def graph_capture(
        self, key: str, mode: str, num_tokens: int, capture_s: float, mem_bytes: int
    ) -> None:
        pass

    def sync(self, kind: str, site: str, blocked_ns: int, t_ns: int = -1) -> None:
        pass

    # GPU timeline: the runner marks each step's boundaries on its stream (``gpu_timeline``).
    def gpu_mark(self, mark: int) -> None:
        pass

    # Copy audit: ``runner.copy_audit.CopyAudit`` reports each host<->device copy when
    # ``audits_copies`` is set (it times nothing otherwise).
    audits_copies = False

    def copy(
        self,
        direction: str,
        num_bytes: int,
        pinned: bool,
        contiguous: bool,
        non_blocking: bool,
        host_ns: int,
    ) -> None:
        pass

    def request_arrival(self, req_id: str, arrival_ns: int, prompt_tokens: int) -> None:
        pass

    def token(self, req_id: str, idx: int, t_ns: int, token_id: int) -> None:
        pass

    def request_finish(
        self,
        req_id: str,
        finish_ns: int,
        output_tokens: int,
        num_preemptions: int,
        finish_reason: str | None,
        cached_tokens: int,
    ) -> None:
        pass


class RecordingProbe(Probe):
    """Records every hook into preallocated buffers; ``drain()`` empties them for the store."""

    enabled = True

    def __init__(self, capacity: int = 1 << 14) -> None:
        self.step = -1
        self._open = np.zeros(len(PHASES), dtype=_I8)  # start of the open span per phase
        self._names: dict[str, int] = {}
        self._name_list: list[str | None] = []
        self.steps = RecordBuffer(
            dict(
                step=_I8, cpu_start_ns=_I8, cpu_end_ns=_I8, num_reqs=_I32, num_tokens=_I32,
                num_prefill_tokens=_I32, num_decode_tokens=_I32, num_waiting=_I32,
                num_running=_I32, kv_used_blocks=_I32, num_preempted=_I32, output_wait_ns=_I8,
                graph_mode=_I32,
            ),
            capacity,
        )  # fmt: skip
        self.spans = RecordBuffer(
            dict(step=_I8, gpu=_BOOL, name=_I32, start_ns=_I8, end_ns=_I8), 8 * capacity
        )
        self.copies = RecordBuffer(
            dict(
                step=_I8, direction=_I32, bytes=_I8, pinned=_BOOL, contiguous=_BOOL,
                non_blocking=_BOOL, host_ns=_I8,
            ),
            4 * capacity,
        )  # fmt: skip
        self.timeline = None  # a probes.gpu_timeline.GpuTimeline on CUDA with cuda_events
        self.staged = RecordBuffer(
            dict(step=_I8, tensor=_I32, rows=_I32, elements=_I8, staged_bytes=_I8, dense_bytes=_I8),
            4 * capacity,
        )
        self.dispatch = RecordBuffer(
            dict(
                step=_I8, num_tokens=_I32, padded_tokens=_I32, requested_mode=_I32, mode=_I32,
                hit=_BOOL, reason=_I32,
            ),
            capacity,
        )  # fmt: skip
        self.syncs = RecordBuffer(
            dict(step=_I8, t_ns=_I8, kind=_I32, site=_I32, blocked_ns=_I8), capacity
        )
        self.tokens = RecordBuffer(
            dict(req_id=_I32, idx=_I32, t_ns=_I8, token_id=_I8), 16 * capacity
        )
        self.arrivals: dict[int, tuple[int, int]] = {}  # req → (arrival_ns, prompt_tokens)
        self.first_token: dict[int, int] = {}  # req → first token t_ns
        self.finished = RecordBuffer(
            dict(
                req_id=_I32, arrival_ns=_I8, first_token_ns=_I8, finish_ns=_I8, prompt_tokens=_I32,
                output_tokens=_I32, num_preemptions=_I32, finish_reason=_I32, cached_tokens=_I32,
            ),
            capacity,
        )  # fmt: skip
        self.captures: list[tuple[str, str, int, float, int]] = []  # start-up only, few
        self._buffers = (
            self.steps, self.spans, self.staged, self.dispatch, self.syncs, self.tokens,
            self.finished, self.copies,
        )  # fmt: skip

    # ---- interning ------------------------------------------------------------------------------
    def intern(self, name: str | None) -> int:
        i = self._names.get(name)  # type: ignore[arg-type]
        if i is None:
            i = self._names[name] = len(self._name_list)  # type: ignore[index]
            self._name_list.append(name)
        return i

    def name_of(self, name_id: int) -> str | None:
        """The name interned as ``name_id`` (``intern``'s inverse)."""
        return self._name_list[name_id]

    # ---- steps and spans -----------------------------------------------------------------------
    def step_begin(self, step: int) -> None:
        self.step = step
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
    ) -> None:
        t = perf_counter_ns()
        b = self.steps
        i = b.reserve()
        b.step[i] = self.step
        b.cpu_start_ns[i] = self._open[STEP]
        b.cpu_end_ns[i] = t
        b.num_reqs[i] = num_reqs
        b.num_tokens[i] = num_tokens
        b.num_prefill_tokens[i] = num_prefill_tokens
        b.num_decode_tokens[i] = num_tokens - num_prefill_tokens
        b.num_waiting[i] = num_waiting
        b.num_running[i] = num_running
        b.kv_used_blocks[i] = kv_used_blocks
        b.num_preempted[i] = num_preempted
        b.output_wait_ns[i] = output_wait_ns
        b.graph_mode[i] = self.intern(graph_mode)
        b.n = i + 1
        self._span(STEP, self._open[STEP], t)
        self._step_recorded(num_reqs, num_tokens, num_prefill_tokens, graph_mode)

    def _step_recorded(
        self, num_reqs: int, num_tokens: int, num_prefill_tokens: int, graph_mode: str
    ) -> None:
        """After a step's row: for subclasses that emit the step elsewhere too."""

    def begin(self, phase: int) -> None:
        self._open[phase] = perf_counter_ns()

    def end(self, phase: int) -> None:
        self._span(phase, self._open[phase], perf_counter_ns())

    def _span(self, phase: int, start_ns: int, end_ns: int) -> None:
        b = self.spans
        i = b.reserve()
        b.step[i] = self.step
        b.gpu[i] = False
        b.name[i] = phase
        b.start_ns[i] = start_ns
        b.end_ns[i] = end_ns
        b.n = i + 1

    def gpu_span(self, step: int, gpu_phase: int, start_ns: int, end_ns: int) -> None:
        """A resolved device span (the timeline's sink); ``gpu_phase`` indexes ``GPU_PHASES``."""
        b = self.spans
        i = b.reserve()
        b.step[i] = step
        b.gpu[i] = True
        b.name[i] = _GPU_PHASE_IDS[gpu_phase]
        b.start_ns[i] = start_ns
        b.end_ns[i] = end_ns
        b.n = i + 1

    def gpu_mark(self, mark: int) -> None:
        t = self.timeline
        if t is not None:
            t.mark(self.step, mark, int(self._open[SCHEDULE]))

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
        i = b.reserve()
        b.step[i] = self.step
        b.tensor[i] = self.intern(tensor)
        b.rows[i] = rows
        b.elements[i] = elements
        b.staged_bytes[i] = staged_bytes
        b.dense_bytes[i] = dense_bytes
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
        i = b.reserve()
        b.step[i] = self.step
        b.num_tokens[i] = num_tokens
        b.padded_tokens[i] = padded_tokens
        b.requested_mode[i] = self.intern(requested_mode)
        b.mode[i] = self.intern(mode)
        b.hit[i] = hit
        b.reason[i] = self.intern(reason)
        b.n = i + 1

    def graph_capture(
        self, key: str, mode: str, num_tokens: int, capture_s: float, mem_bytes: int
    ) -> None:
        self.captures.append((key, mode, num_tokens, capture_s, mem_bytes))

    def sync(self, kind: str, site: str, blocked_ns: int, t_ns: int = -1) -> None:
        b = self.syncs
        i = b.reserve()
        b.step[i] = self.step
        b.t_ns[i] = perf_counter_ns() - blocked_ns if t_ns < 0 else t_ns
        b.kind[i] = self.intern(kind)
        b.site[i] = self.intern(site)
        b.blocked_ns[i] = blocked_ns
        b.n = i + 1

    def request_arrival(self, req_id: str, arrival_ns: int, prompt_tokens: int) -> None:
        self.arrivals[self.intern(req_id)] = (arrival_ns, prompt_tokens)

    def token(self, req_id: str, idx: int, t_ns: int, token_id: int) -> None:
        r = self.intern(req_id)
        if idx == 0:
            self.first_token[r] = t_ns
        b = self.tokens
        i = b.reserve()
        b.req_id[i] = r
        b.idx[i] = idx
        b.t_ns[i] = t_ns
        b.token_id[i] = token_id
        b.n = i + 1

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

    # ---- handing over --------------------------------------------------------------------------
    @property
    def fill(self) -> float:
        """The fullest buffer's fill fraction; flush before it reaches 1 to avoid growing."""
        return max(b.fill for b in self._buffers)

    def drain(self) -> dict[str, dict[str, np.ndarray]]:
        """Everything recorded since the last drain, as store tables; the buffers are reset."""
        names = np.array(self._name_list + [None], dtype=object)

        def s(ids: np.ndarray) -> np.ndarray:
            return names[ids]

        out: dict[str, dict[str, np.ndarray]] = {}
        st = self.steps.take()
        st["graph_mode"] = s(st["graph_mode"])
        out["steps"] = st
        sp = self.spans.take()
        out["spans"] = {
            "step": sp["step"],
            "track": np.where(sp["gpu"], "gpu", "cpu").astype(object),
            "name": np.array(PHASES, dtype=object)[sp["name"]],
            "start_ns": sp["start_ns"],
            "end_ns": sp["end_ns"],
        }
        sw = self.staged.take()
        sw["tensor"] = s(sw["tensor"])
        out["staged_writes"] = sw
        gd = self.dispatch.take()
        for k in ("requested_mode", "mode", "reason"):
            gd[k] = s(gd[k])
        out["graph_dispatch"] = gd
        cp = self.copies.take()
        cp["direction"] = s(cp["direction"])
        out["copies"] = cp
        sy = self.syncs.take()
        sy["kind"], sy["site"] = s(sy["kind"]), s(sy["site"])
        out["syncs"] = sy
        tk = self.tokens.take()
        tk["req_id"] = s(tk["req_id"])
        out["tokens"] = tk
        rq = self.finished.take()
        rq["req_id"], rq["finish_reason"] = s(rq["req_id"]), s(rq["finish_reason"])
        out["requests"] = rq
        if self.captures:
            key, mode, num_tokens, capture_s, mem_bytes = zip(*self.captures, strict=True)
            out["graph_captures"] = {
                "key": np.array(key, dtype=object),
                "mode": np.array(mode, dtype=object),
                "num_tokens": np.array(num_tokens, dtype=_I32),
                "capture_s": np.array(capture_s, dtype=_F64),
                "mem_bytes": np.array(mem_bytes, dtype=_I8),
            }
            self.captures = []
        return out

    def unfinished(self) -> list[str]:
        """Requests that arrived and never finished (for the end of an interrupted run)."""
        return [self._name_list[r] for r in self.arrivals]  # type: ignore[misc]
