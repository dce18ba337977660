"""The live snapshot: the small aggregate the runner process sends to the parent ~4 times a second.

Plain data only (stdlib), so the dashboard and the progress bar never import the runner.
Latencies are in milliseconds over the requests seen so far; ``None`` where nothing was measured
yet.
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

    @property
    def num_done(self) -> int:
        return self.num_finished + self.num_aborted

    @property
    def progress(self) -> float:
        return self.num_done / self.num_requests if self.num_requests else 1.0
