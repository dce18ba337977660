"""The live snapshot: the small aggregate the runner process sends to the parent ~4 times a second.

Plain data only (stdlib), so the dashboard and the progress bar never import the runner.
Latencies are in milliseconds over the requests seen so far; ``None`` where nothing was measured
yet. TTFT is arrival to first token, TPOT a request's mean time per output token after the
first, ITL each gap between two tokens of a request; overlap and bubbles are defined in
docs/architecture.md (Probes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    run_id: str
    label: str  # scenario name, with the matrix combination when there is one
    elapsed_s: float  # since the first step
    steps: int
    steps_per_s: float  # over the last snapshot interval
    output_tokens: int
    tokens_per_s: float  # output tokens/s over the last snapshot interval
    num_requests: int  # total the workload will submit
    num_waiting: int  # arrived, not yet running (includes preempted)
    num_running: int
    num_finished: int  # completed, not aborted
    num_aborted: int
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    itl_ms_p50: float | None
    itl_ms_p99: float | None
    kv_usage: float  # fraction of KV blocks in use, 0..1
    num_preemptions: int
    staged_bytes: int  # cumulative bytes moved by staged writes
    dense_bytes: int  # what dense copies of the same tensors would have moved
    # Fields below have defaults so that a producer may leave out what it does not measure.
    device: str = ""  # the run's torch device ("cpu", "cuda:0"); "" before it is known
    tpot_ms_p50: float | None = None  # over completed requests with more than one token
    tpot_ms_p99: float | None = None
    # GPU timeline: None / 0 where there is none (a CPU run, or not measured yet).
    overlap_frac: float | None = None  # hidden / total host prep time so far
    roofline_decode: float | None = None  # recent decode steps' median fraction of the roofline
    bubble_host_bound_ns: int = 0  # GPU idle time while it waited for the host
    bubble_other_ns: int = 0  # the rest of the GPU idle time between steps
    # Sync points (all kinds, as ``syncs`` rows): count, blocked time where measured, and the
    # sites with the most syncs as ``(site, count)``, most first.
    num_syncs: int = 0
    sync_blocked_ns: int = 0
    top_sync_sites: tuple[tuple[str, int], ...] = ()
    # CUDA graph dispatches: ``(chosen mode, count)`` most first, the fraction that replayed a
    # graph (None before any dispatch) and the reasons of the others as ``(reason, count)``.
    graph_mode_counts: tuple[tuple[str, int], ...] = ()
    graph_hit_rate: float | None = None
    top_fallback_reasons: tuple[tuple[str, int], ...] = ()
    # Speculative decoding so far: verifies of drafts, drafted and accepted tokens (0: off).
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    # Its slots and dynamic k so far (the probe's step rows): draft slots reserved and reclaimed,
    # requests that sat out (host drafts under async scheduling), the latest step's k and the
    # latest dynamic-k decision (None: none made).
    spec_reserved_slots: int = 0
    spec_reclaimed_slots: int = 0
    spec_sat_out: int = 0
    spec_k: int = 0
    spec_expected_tokens: float | None = None
    spec_cost_ratio: float | None = None
    # What is left to do: each unfinished request's max_tokens less its tokens so far, summed
    # (an upper bound on the output tokens still to come: a stop token ends a request sooner);
    # None where the producer does not know the workload's max_tokens.
    tokens_left: int | None = None
    # The workload's total of max_tokens (None where not known): 1 - tokens_left / tokens_due is
    # the dashboard's progress, which moves in a burst run (every request finishing at the end).
    tokens_due: int | None = None
    # For the metrics exporter's counters and histograms: the prompt tokens of the requests that
    # got their first token so far, and each latency observed since the previous snapshot, in
    # seconds (TTFT, ITL, E2E of completed requests; pipeline/live_latencies.py).
    prompt_tokens: int = 0
    new_ttft_s: tuple[float, ...] = ()
    new_itl_s: tuple[float, ...] = ()
    new_e2e_s: tuple[float, ...] = ()

    @property
    def num_done(self) -> int:
        return self.num_finished + self.num_aborted

    @property
    def progress(self) -> float:
        return self.num_done / self.num_requests if self.num_requests else 1.0
