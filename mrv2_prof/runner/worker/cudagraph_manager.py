"""CUDA graphs: which steps replay a captured graph, which run eagerly, and why (MRV2
``cudagraph_utils.py`` / vLLM's ``CudagraphDispatcher``), all decided in one class.

Modes:

* ``full`` — the whole forward pass (embedding, every layer with its KV write and paged attention,
  the final norm and the LM head) for a batch in which every request has one query token (a
  uniform decode batch), captured once per capture size. The batch is padded up to the smallest
  captured size: padding tokens get slot -1 (the KV write skips them) and a one-token context.
  Static input buffers are allocated once at the largest size; every graph shares one memory
  pool and they are captured largest first. With ``runner.full_step_graph`` the graph also builds
  the step's inputs, and a second graph per size samples plainly and advances the state
  (``full_step.py``); a step with top-k / top-p or logprobs samples eagerly after the replay.
* ``piecewise`` — one graph per segment between attention calls (embedding → layer 0's q/k/v;
  layer i's output projection and MLP → layer i+1's q/k/v; the last layer's → the final norm),
  for any batch shape up to the largest capture size in tokens. The KV write and attention run
  eagerly between the segments with the batch's real metadata, so mixed prefill/decode batches
  can use them.
* ``none`` — eager.

With speculative decoding a FULL graph is also captured for every uniform verify shape that can
be chosen: (batch size, query length 1 + k) for each k > 0 that ``dynamic_k`` (or the fixed k)
gives some batch size up to ``max_num_seqs``, at each FULL capture size whose tokens fit
``max_num_batched_tokens``; its logits cover every token (every row a verify needs). A verify
step in which every request verifies the same k replays it; the reasons name k. The scheduler
pads the verifies of a uniform decode batch up to the step's k (placeholder draft slots, never
accepted; ``verify_capacity`` tells it which k have graphs and for how many requests), so such a
step has that shape even when its requests drafted different numbers of tokens or none; the
reason then says how many draft slots were padded.

``cudagraph_plan.plan_graphs`` turns the scenario's request into what this runner will capture.
``CudaGraphManager.dispatch`` is a pure function of the batch shape and what was captured; every
decision carries its reason. The
capture itself goes through a ``GraphBackend`` (``cudagraph_runner.GraphRunner`` on CUDA; tests
can pass a fake), timed and measured per key; what the graphs run is ``cudagraph_bodies.py``.
"""

from __future__ import annotations

import abc
import bisect
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mrv2_prof.runner.worker.cudagraph_plan import FULL, NONE, PIECEWISE, GraphPlan


@dataclass(frozen=True)
class BatchDescriptor:
    num_tokens: int
    num_reqs: int
    uniform_query_len: int | None  # every request schedules this many tokens; None if mixed

    @classmethod
    def of(cls, num_scheduled_tokens: np.ndarray, total: int | None = None) -> BatchDescriptor:
        """The batch of these per-request counts (``total``: their sum, when the caller has it:
        a total equal to the count of requests is a decode batch, with no numpy call)."""
        n = len(num_scheduled_tokens)
        if total is not None and total == n and n > 0:  # counts >= 1 each: all ones
            return cls(n, n, 1)
        total = int(num_scheduled_tokens.sum()) if total is None else total
        uniform = n > 0 and total == n * int(num_scheduled_tokens[0])
        if uniform:
            uniform = bool((num_scheduled_tokens == num_scheduled_tokens[0]).all())
        return cls(total, n, int(num_scheduled_tokens[0]) if uniform else None)


@dataclass(frozen=True)
class Decision:
    requested: str
    mode: str  # full | piecewise | none
    key: int | None  # the capture size replayed
    num_tokens: int
    padded_tokens: int  # key, or num_tokens when eager
    reason: str
    query_len: int = 1  # a FULL verify graph's 1 + k (1: a decode graph)
    capture_first: bool = False  # a PIECEWISE key planned for first use, not captured yet

    @property
    def hit(self) -> bool:
        return self.mode != NONE


@dataclass
class CaptureRecord:
    key: str
    mode: str
    num_tokens: int
    capture_s: float
    mem_bytes: int  # growth of the graph memory pool's reserved bytes
    query_len: int = 1  # a FULL verify graph's 1 + k (num_tokens = batch size x query_len)
    on_first_use: bool = False  # captured by the step that first needed it, not at start-up

    @property
    def replay_key(self) -> tuple:
        """The key ``CudaGraphManager.replays`` counts this graph's replays under."""
        if self.query_len == 1:
            return (self.mode, self.num_tokens)
        return (self.mode, (self.num_tokens // self.query_len, self.query_len))


class GraphBackend(abc.ABC):
    """What the manager needs from the runner: capture one key, measure memory."""

    @abc.abstractmethod
    def capture_full(self, size: int, pool) -> None: ...

    @abc.abstractmethod
    def capture_piecewise(self, size: int, pool) -> None: ...

    def capture_verify(self, size: int, query_len: int, pool) -> None:
        """A FULL graph of ``size`` requests of ``query_len`` tokens each (speculative verify)."""
        raise NotImplementedError(f"{type(self).__name__} captures no verify graphs")

    def new_pool(self):
        return None

    def memory_reserved(self) -> int:
        return 0

    def synchronize(self) -> None:  # optional: by default there is nothing to wait for
        return None


@dataclass
class CudaGraphManager:
    plan: GraphPlan
    full_keys: list[int] = field(default_factory=list)  # captured, ascending
    piecewise_keys: list[int] = field(default_factory=list)
    verify_keys: dict[int, list[int]] = field(default_factory=dict)  # 1 + k -> sizes, ascending
    captures: list[CaptureRecord] = field(default_factory=list)
    replays: dict[tuple[str, int], int] = field(default_factory=dict)
    # (batch, needs_hidden, verify, padded) -> its decision: a pure function of them and of what
    # was captured, so a steady run decides each shape once (cleared by ``capture``)
    _decided: dict[tuple, Decision] = field(default_factory=dict, repr=False)
    _pool: object = field(default=None, repr=False)  # the graphs' shared memory pool

    def capture(
        self, backend: GraphBackend, on_capture: Callable[[CaptureRecord], None] | None = None
    ) -> float:
        """Capture every planned key, largest first, into one shared pool (PIECEWISE keys
        planned for first use are left to ``capture_first_use``). Returns seconds."""
        t_start = time.perf_counter()
        self.forget_decisions()
        self._pool = pool = backend.new_pool()
        jobs = [(FULL, s, 1) for s in self.plan.full_sizes]
        jobs += [(FULL, s, q) for s, q in self.plan.verify_shapes]
        if not self.plan.piecewise_on_first_use:
            jobs += [(PIECEWISE, s, 1) for s in self.plan.piecewise_sizes]
        for mode, size, q in sorted(jobs, key=lambda j: (j[0] != FULL, -j[1] * j[2], -j[2])):
            record = self._capture_one(backend, mode, size, q, pool)
            if on_capture is not None:
                on_capture(record)
        return time.perf_counter() - t_start

    def capture_first_use(self, backend: GraphBackend, decision: Decision) -> CaptureRecord:
        """Capture the PIECEWISE key a step was dispatched to before its first replay
        (``Decision.capture_first``), into the start-up graphs' pool; later dispatches of that
        size replay it."""
        assert decision.capture_first and decision.mode == PIECEWISE, decision
        record = self._capture_one(backend, PIECEWISE, decision.key, 1, self._pool, True)
        self.forget_decisions()
        return record

    def _capture_one(
        self, backend: GraphBackend, mode: str, size: int, q: int, pool, first_use: bool = False
    ) -> CaptureRecord:
        before = backend.memory_reserved()
        t0 = time.perf_counter()
        if q > 1:
            backend.capture_verify(size, q, pool)
        elif mode == FULL:
            backend.capture_full(size, pool)
        else:
            backend.capture_piecewise(size, pool)
        backend.synchronize()
        record = CaptureRecord(
            f"{mode}:{size}" if q == 1 else f"{mode}:{size}x{q}",
            mode,
            size * q,
            time.perf_counter() - t0,
            backend.memory_reserved() - before,
            q,
            first_use,
        )
        self.captures.append(record)
        if q > 1:
            bisect.insort(self.verify_keys.setdefault(q, []), size)
        else:
            bisect.insort(self.full_keys if mode == FULL else self.piecewise_keys, size)
        return record

    def forget_decisions(self) -> None:
        """Drop the memoised dispatch decisions: for a caller that changes the captured keys
        other than through ``capture`` (which forgets them itself)."""
        self._decided.clear()

    def verify_capacity(self) -> dict[int, int]:
        """k -> the most requests a captured FULL verify graph of query length 1 + k holds."""
        return {q - 1: sizes[-1] for q, sizes in self.verify_keys.items() if sizes}

    def dispatch(
        self,
        batch: BatchDescriptor,
        needs_hidden: bool = False,
        verify: bool = False,
        padded: int = 0,
    ) -> Decision:
        """FULL if a captured size holds this uniform decode batch, else PIECEWISE if one holds
        its tokens, else NONE; the reason names what ruled out the better modes.
        ``needs_hidden``: the step needs every token's hidden state (FULL keeps only logits);
        ``verify``: a speculative verify step (it needs the logits of every draft row);
        ``padded``: its placeholder draft slots (the reason names them)."""
        key = (batch, needs_hidden, verify, padded)
        d = self._decided.get(key)
        if d is None:
            d = self._decided[key] = self._decide(batch, needs_hidden, verify, padded)
            if len(self._decided) > 4096:  # the shapes of a long mixed run: keep the newest
                self._decided.pop(next(iter(self._decided)))
        return d

    def _decide(
        self, batch: BatchDescriptor, needs_hidden: bool, verify: bool, padded: int
    ) -> Decision:
        d = self._dispatch(batch, needs_hidden, verify)
        if not padded:
            return d
        if d.query_len > 1:  # a FULL verify: every request has query_len - 1 draft slots
            slots = batch.num_reqs * (d.query_len - 1)
            reason = f"{d.reason}, {padded} of {slots} draft slots padded"
            return dataclasses.replace(d, reason=reason)
        return dataclasses.replace(d, reason=f"{d.reason}; {padded} draft slots padded")

    def _dispatch(self, batch: BatchDescriptor, needs_hidden: bool, verify: bool) -> Decision:
        n = batch.num_tokens
        requested = self.plan.requested
        why_not_full = self._why_not_full(batch)
        if verify:
            why_not_full, d = self._verify(batch)
            if d is not None:
                if not needs_hidden:
                    return d
                why_not_full = "prompt logprobs need every hidden state"
        if why_not_full is None and needs_hidden:
            why_not_full = "prompt logprobs need every hidden state"
        if why_not_full is None:
            key = self.full_keys[bisect.bisect_left(self.full_keys, n)]
            return Decision(requested, FULL, key, n, key, f"uniform decode, {n} → {key}")
        sizes = self._piecewise_sizes()
        if sizes and n <= sizes[-1]:
            key = sizes[bisect.bisect_left(sizes, n)]
            if key in self.piecewise_keys:
                return Decision(requested, PIECEWISE, key, n, key, why_not_full)
            reason = f"{why_not_full}; PIECEWISE {key} captured on first use, this step"
            return Decision(requested, PIECEWISE, key, n, key, reason, capture_first=True)
        if sizes:
            reason = f"num_tokens {n} > largest capture size {sizes[-1]}"
        elif not self.full_keys:
            reason = self.plan.none_reason
        else:
            reason = f"{why_not_full}; no piecewise graphs"
        return Decision(requested, NONE, None, n, n, reason)

    def _piecewise_sizes(self) -> list[int] | tuple[int, ...]:
        """The PIECEWISE sizes a step can be dispatched to: every planned one when they are
        captured on first use, else those captured."""
        if self.plan.piecewise_on_first_use:
            return self.plan.piecewise_sizes
        return self.piecewise_keys

    def _verify(self, batch: BatchDescriptor) -> tuple[str | None, Decision | None]:
        """A verify step: FULL when every request verifies the same k and a verify graph of
        that shape holds the batch; else why not, naming k."""
        q, n = batch.uniform_query_len, batch.num_reqs
        if q is None:
            return "verify batch with different k per request (or decodes without drafts)", None
        sizes = self.verify_keys.get(q)
        if not sizes:
            return f"verify k={q - 1}: no FULL graph captured for query length {q}", None
        if n > sizes[-1]:
            return f"verify k={q - 1}: {n} requests > largest FULL size {sizes[-1]}", None
        size = sizes[bisect.bisect_left(sizes, n)]
        reason = f"uniform verify k={q - 1}, {n} → {size}"
        return None, Decision(self.plan.requested, FULL, size, n * q, size * q, reason, q)

    def _why_not_full(self, batch: BatchDescriptor) -> str | None:
        if not self.full_keys:
            return "no FULL graphs captured"
        if batch.uniform_query_len is None:
            return "mixed prefill/decode batch"
        if batch.uniform_query_len != 1:
            return f"prefill batch (query length {batch.uniform_query_len})"
        if batch.num_tokens > self.full_keys[-1]:
            return f"num_tokens {batch.num_tokens} > largest FULL size {self.full_keys[-1]}"
        return None

    def count_replay(self, decision: Decision) -> None:
        k = (decision.mode, decision.key)
        if decision.query_len > 1:
            k = (decision.mode, (decision.key, decision.query_len))
        self.replays[k] = self.replays.get(k, 0) + 1

    def usage(self) -> dict[str, float | int]:
        """Captured keys against replayed ones, and what the never-replayed keys cost."""
        unused = [r for r in self.captures if r.replay_key not in self.replays]
        return {
            "graph_keys_captured": len(self.captures),
            "graph_keys_replayed": len(self.captures) - len(unused),
            "graph_replays": sum(self.replays.values()),
            "unused_capture_s": sum(r.capture_s for r in unused),
            "unused_graph_bytes": sum(r.mem_bytes for r in unused),
        }
