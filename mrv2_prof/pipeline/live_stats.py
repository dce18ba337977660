"""Running aggregates of a run for the live ``Snapshot``, kept in the runner process.

``LiveStats`` is updated from each engine step's result (tokens, TTFT/TPOT/ITL, staged bytes)
and from the rows the recording probe added since the last look (sync points, CUDA graph
dispatches); ``snapshot()`` turns them into the small plain-data ``Snapshot`` the parent shows,
with the latencies observed since the previous one (``live_latencies``, for the metrics exporter).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mrv2_prof.pipeline.live_latencies import NewLatencies
from mrv2_prof.pipeline.live_roofline import LiveRoofline
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.views.snapshot import Snapshot

ITL_WINDOW = 8192  # live ITL percentiles cover the most recent gaps
TOP_SYNC_SITES = 5  # sites with the most syncs, in the snapshot
TOP_FALLBACK_REASONS = 3


class LiveStats:
    """Running aggregates for the snapshot, updated from each step's result.

    Sync points and graph dispatches come from the probe's buffers: after each step only the
    rows added since the last look are counted, into a few counters keyed by the probe's interned
    name ids (names are looked up at snapshot time). The harness's flush drains those buffers;
    that shows as a different first row in the probe's step buffer, and counting starts again
    at row 0. The probe is the engine's, found at the first snapshot unless passed here: rows
    recorded before then are still in the buffers (the first flush comes later).
    """

    def __init__(
        self,
        run_id: str,
        label: str,
        num_requests: int,
        num_kv_blocks: int,
        probe: RecordingProbe | None = None,
        max_tokens: dict[str, int] | None = None,
    ) -> None:
        self.run_id, self.label = run_id, label
        # each request's max_tokens, and its max_tokens less its tokens so far (0 once finished):
        # their sum bounds the tokens still to come (``Snapshot.tokens_left``); None: not given
        self._max_tokens = dict(max_tokens) if max_tokens is not None else {}
        self._left = dict(self._max_tokens)
        self.tokens_left = sum(self._left.values()) if max_tokens is not None else None
        self.tokens_due = self.tokens_left  # the total of max_tokens (Snapshot.tokens_due)
        self.num_requests, self.num_kv_blocks = num_requests, num_kv_blocks
        self.t0_ns = time.perf_counter_ns()
        self.steps = self.output_tokens = self.num_finished = self.num_aborted = 0
        self.prompt_tokens = 0  # of the requests with a first token (Snapshot.prompt_tokens)
        self.new = NewLatencies()  # seconds, not yet in a snapshot (the metrics' histograms)
        self.staged_bytes = self.dense_bytes = 0
        self.ttft_ms: list[float] = []
        self.tpot_ms: list[float] = []
        self.itl_ms = np.zeros(ITL_WINDOW)
        self.num_itl = 0
        self.first_token_ns: dict[str, int] = {}
        self.last_token_ns: dict[str, int] = {}
        self._last = (self.t0_ns, 0, 0)  # (t_ns, steps, output_tokens) at the last snapshot
        self.probe = probe
        self.num_syncs = self.sync_blocked_ns = 0
        self.num_dispatches = self.num_graph_hits = 0
        self._sync_sites: dict[int, int] = {}  # interned site -> syncs
        self._graph_modes: dict[int, int] = {}  # interned chosen mode -> dispatches
        self._fallbacks: dict[int, int] = {}  # interned reason -> dispatches without a graph
        self._buffer_first_step = -1  # step of the probe's first buffered step row, last look
        self._seen_syncs = self._seen_dispatches = self._seen_steps = 0  # rows already counted
        # speculative decoding from the step rows: slots reserved, reclaimed, requests sat out;
        # the latest k and dynamic-k decision (``Snapshot.spec_*``)
        self.spec_reserved = self.spec_reclaimed = self.spec_sat_out = self.spec_k = 0
        self.spec_expected_tokens: float | None = None
        self.spec_cost_ratio: float | None = None
        self.roofline: LiveRoofline | None = None  # set by the harness once start-up is known

    def on_step(self, res, t_ns: int) -> None:
        self.steps += 1
        self.output_tokens += len(res.updated)
        for ws in res.write_stats.values():
            self.staged_bytes += ws.staged_bytes
            self.dense_bytes += ws.dense_bytes
        for r in res.updated:
            rid = r.request_id
            self._count_left(rid, None if r.is_finished else r.num_output_tokens)
            prev = self.last_token_ns.get(rid)
            if prev is None:
                self.ttft_ms.append((t_ns - r.arrival_time * 1e9) / 1e6)
                self.new.ttft.append((t_ns - r.arrival_time * 1e9) / 1e9)
                self.prompt_tokens += getattr(r, "num_prompt_tokens", 0)
                self.first_token_ns[rid] = t_ns
            else:
                self.itl_ms[self.num_itl % ITL_WINDOW] = (t_ns - prev) / 1e6
                self.new.itl.append((t_ns - prev) / 1e9)
                self.num_itl += 1
            if r.is_finished:
                self.last_token_ns.pop(rid, None)
                first_ns = self.first_token_ns.pop(rid, t_ns)
                completed = r.finish_reason != "abort"
                self.num_finished += completed
                if completed:
                    self.new.e2e.append((t_ns - r.arrival_time * 1e9) / 1e9)
                if completed and r.num_output_tokens > 1:
                    self.tpot_ms.append((t_ns - first_ns) / 1e6 / (r.num_output_tokens - 1))
            else:
                self.last_token_ns[rid] = t_ns
        self._count_probe_rows()

    def _count_left(self, rid: str, produced: int | None) -> None:
        """Request ``rid`` has produced ``produced`` tokens (None: it finished, none to come)."""
        old = self._left.get(rid)
        if old is None or self.tokens_left is None:
            return
        left = 0 if produced is None else max(self._max_tokens[rid] - produced, 0)
        self._left[rid] = left
        self.tokens_left += left - old

    def on_abort(self, req_id: str) -> None:
        self._count_left(req_id, None)
        self.num_aborted += 1
        self.last_token_ns.pop(req_id, None)
        self.first_token_ns.pop(req_id, None)

    def _count_probe_rows(self) -> None:
        """Count the sync, graph-dispatch and step rows the probe recorded since the last look."""
        p = self.probe
        if p is None:
            return
        first_step = int(p.steps.step[0]) if p.steps.n else -1
        if first_step != self._buffer_first_step:  # drained by a flush since the last look
            self._buffer_first_step = first_step
            self._seen_syncs = self._seen_dispatches = self._seen_steps = 0
        st = p.steps
        if st.n > self._seen_steps:
            self._count_spec(st, self._seen_steps, st.n)
            if self.roofline is not None:
                self.roofline.add_steps(st.w, self._seen_steps, st.n)
            self._seen_steps = st.n
        sy = p.syncs
        for i in range(self._seen_syncs, sy.n):
            self.num_syncs += 1
            self.sync_blocked_ns += max(int(sy.blocked_ns[i]), 0)  # -1: not measured
            site = int(sy.site[i])
            self._sync_sites[site] = self._sync_sites.get(site, 0) + 1
        self._seen_syncs = sy.n
        gd = p.dispatch
        for i in range(self._seen_dispatches, gd.n):
            self.num_dispatches += 1
            mode = int(gd.mode[i])
            self._graph_modes[mode] = self._graph_modes.get(mode, 0) + 1
            if gd.hit[i]:
                self.num_graph_hits += 1
            else:
                reason = int(gd.reason[i])
                self._fallbacks[reason] = self._fallbacks.get(reason, 0) + 1
        self._seen_dispatches = gd.n

    def _count_spec(self, st, lo: int, hi: int) -> None:
        """Speculative decoding's columns of the step rows ``lo:hi`` of the probe's buffer (read
        through its memoryviews: usually one row, on the step loop)."""
        w = st.w
        for i in range(lo, hi):
            self.spec_reserved += w.spec_reserved[i]
            self.spec_reclaimed += w.spec_reclaimed[i]
            self.spec_sat_out += w.spec_sat_out[i]
            expected = w.spec_expected_tokens[i]
            if expected == expected:  # not NaN: a dynamic-k decision
                cost = w.spec_cost_ratio[i]
                self.spec_expected_tokens = expected
                self.spec_cost_ratio = cost if cost == cost else None
        self.spec_k = w.spec_k[hi - 1]

    def _named(self, counts: dict[int, int], top: int | None) -> tuple[tuple[str, int], ...]:
        """``(name, count)`` most first (ties by name), names from the probe's interned ids."""
        assert self.probe is not None or not counts
        name_of = self.probe.name_of if self.probe is not None else str
        pairs = sorted(
            ((str(name_of(i)), n) for i, n in counts.items()), key=lambda p: (-p[1], p[0])
        )
        return tuple(pairs[:top])

    def snapshot(self, engine, final: bool = False) -> Snapshot:
        """The run so far; ``final``: the run's last (its loop has ended, whatever ended it),
        carrying every latency not yet handed over, as does one with nothing left to run."""
        if self.probe is None and isinstance(getattr(engine, "probe", None), RecordingProbe):
            self.probe = engine.probe
            self._count_probe_rows()
        now = time.perf_counter_ns()
        t_last, steps_last, tokens_last = self._last
        dt_s = max((now - t_last) / 1e9, 1e-9)
        self._last = (now, self.steps, self.output_tokens)
        itl = self.itl_ms[: min(self.num_itl, ITL_WINDOW)]

        def pct(values, q: float) -> float | None:
            return float(np.percentile(values, q)) if len(values) else None

        return Snapshot(
            run_id=self.run_id,
            label=self.label,
            elapsed_s=(now - self.t0_ns) / 1e9,
            steps=self.steps,
            steps_per_s=(self.steps - steps_last) / dt_s,
            output_tokens=self.output_tokens,
            tokens_per_s=(self.output_tokens - tokens_last) / dt_s,
            num_requests=self.num_requests,
            num_waiting=engine.num_waiting,
            num_running=engine.num_running,
            num_finished=self.num_finished,
            num_aborted=self.num_aborted,
            ttft_ms_p50=pct(self.ttft_ms, 50),
            ttft_ms_p99=pct(self.ttft_ms, 99),
            itl_ms_p50=pct(itl, 50),
            itl_ms_p99=pct(itl, 99),
            kv_usage=engine.num_kv_blocks_used / max(self.num_kv_blocks, 1),
            num_preemptions=engine.scheduler.num_preemptions,
            staged_bytes=self.staged_bytes,
            dense_bytes=self.dense_bytes,
            device=str(getattr(getattr(engine, "info", None), "device", "")),
            tpot_ms_p50=pct(self.tpot_ms, 50),
            tpot_ms_p99=pct(self.tpot_ms, 99),
            num_syncs=self.num_syncs,
            sync_blocked_ns=self.sync_blocked_ns,
            top_sync_sites=self._named(self._sync_sites, TOP_SYNC_SITES),
            graph_mode_counts=self._named(self._graph_modes, None),
            graph_hit_rate=(
                self.num_graph_hits / self.num_dispatches if self.num_dispatches else None
            ),
            top_fallback_reasons=self._named(self._fallbacks, TOP_FALLBACK_REASONS),
            **self._gpu_timeline(),
            **spec_decode_counts(engine),
            spec_reserved_slots=self.spec_reserved,
            spec_reclaimed_slots=self.spec_reclaimed,
            spec_sat_out=self.spec_sat_out,
            spec_k=self.spec_k,
            spec_expected_tokens=self.spec_expected_tokens,
            spec_cost_ratio=self.spec_cost_ratio,
            tokens_left=self.tokens_left,
            tokens_due=self.tokens_due,
            prompt_tokens=self.prompt_tokens,
            # the run's last snapshot (or one with nothing left to run) carries every latency left
            **self.new.take(everything=final or not _has_work(engine)),
        )

    def _gpu_timeline(self) -> dict[str, Any]:
        """Overlap and bubbles so far, from the GPU timeline's running totals (CUDA runs)."""
        timeline = getattr(self.probe, "timeline", None)
        if timeline is None:
            return {}
        live = timeline.live
        roof = self.roofline
        return {
            "roofline_decode": roof.decode_fraction(live.recent_gpu) if roof else None,
            "overlap_frac": live.overlap,
            # the device starved inside a step waited for the host too (a host-bound bubble)
            "bubble_host_bound_ns": live.host_bound_bubble_ns + live.starved_ns,
            "bubble_other_ns": live.other_bubble_ns,
        }


def _has_work(engine) -> bool:
    """Whether ``engine`` still has requests to run (True when it cannot say)."""
    has_unfinished = getattr(engine, "has_unfinished_requests", None)
    return bool(has_unfinished()) if has_unfinished is not None else True


def spec_decode_counts(engine) -> dict[str, int]:
    """Speculative decoding's counters so far (the scheduler's own; none when it is off)."""
    spec = getattr(getattr(engine, "scheduler", None), "spec", None)
    if spec is None:
        return {}
    stats = spec.stats
    return {
        "spec_num_drafts": stats.num_drafts,
        "spec_num_draft_tokens": stats.num_draft_tokens,
        "spec_num_accepted_tokens": stats.num_accepted_tokens,
    }
