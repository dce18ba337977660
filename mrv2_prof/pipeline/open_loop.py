"""The open-loop client of a run: requests arrive in wall time and the engine steps until done.

A request arrives at ``t0 + arrival_s`` even when the engine is busy, so queueing counts towards
its latency (as in vLLM's serving benchmark). Between steps the loop also aborts requests the
workload asks to abort, sends a ``Snapshot`` about four times a second and drains the probe's
buffers about once a second (or sooner when one is half full).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mrv2_prof.pipeline.live_stats import LiveStats
    from mrv2_prof.probes.recording import RecordingProbe
    from mrv2_prof.probes.session import ProbeSession

SNAPSHOT_INTERVAL_NS = 250_000_000
FLUSH_INTERVAL_NS = 1_000_000_000


def drive(
    engine,
    requests: Iterable,
    probe: RecordingProbe,
    flush: Callable[[], None],
    emit: Callable[[Any], None],
    live: LiveStats,
    should_stop: Callable[[], bool],
    session: ProbeSession | None = None,
) -> bool:
    """Step ``engine`` through ``requests`` (``WorkloadRequest``s sorted by arrival). Returns
    True when every request finished, False when ``should_stop`` said to stop."""
    from mrv2_prof.runner.core.request import SamplingParams

    pending = deque(requests)
    abort_at: dict[str, int] = {}
    t0 = live.t0_ns
    next_snapshot, next_flush = t0 + SNAPSHOT_INTERVAL_NS, t0 + FLUSH_INTERVAL_NS
    while True:
        if should_stop():
            return False
        now = time.perf_counter_ns()
        while pending and t0 + round(pending[0].arrival_s * 1e9) <= now:
            w = pending.popleft()
            params = SamplingParams(
                temperature=w.temperature,
                top_k=w.top_k,
                top_p=w.top_p,
                seed=w.seed,
                max_tokens=w.max_tokens,
                logprobs=w.logprobs,
                prompt_logprobs=w.prompt_logprobs,
                ignore_eos=w.ignore_eos,
                stop_token_ids=w.stop_token_ids,
            )
            arrival_s = (t0 + round(w.arrival_s * 1e9)) / 1e9
            engine.add_request(w.req_id, list(w.prompt_token_ids), params, arrival_time=arrival_s)
            if w.abort_after_tokens == 0:
                engine.abort_request(w.req_id)
                live.on_abort(w.req_id)
            elif w.abort_after_tokens is not None:
                abort_at[w.req_id] = w.abort_after_tokens
        if engine.has_unfinished_requests():
            res = engine.step()
            if session is not None:
                session.after_step(engine.step_index - 1)
            now = time.perf_counter_ns()
            live.on_step(res, now)
            for r in res.updated:
                k = abort_at.get(r.request_id)
                if k is not None and not r.is_finished and r.num_output_tokens >= k:
                    engine.abort_request(r.request_id)
                    live.on_abort(r.request_id)
        elif pending:
            if session is not None:
                session.at_idle()
            wait_ns = t0 + round(pending[0].arrival_s * 1e9) - now
            # A snapshot or flush can be overdue (a slow flush): never a negative sleep.
            time.sleep(max(0, min(wait_ns, next_snapshot - now, 50_000_000)) / 1e9)
            now = time.perf_counter_ns()
        else:
            return True
        if now >= next_snapshot:
            emit(("snapshot", live.snapshot(engine)))
            next_snapshot = now + SNAPSHOT_INTERVAL_NS
        if now >= next_flush or probe.fill > 0.5:
            flush()
            next_flush = time.perf_counter_ns() + FLUSH_INTERVAL_NS
