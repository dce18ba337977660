"""The one object the runner talks to: phase spans and typed records (architecture: Probes).

``Probe`` is the no-op default: every hook is an empty method, so an uninstrumented runner pays
one method call per hook. The recording implementation (``probes.recording.RecordingProbe``) and
everything behind it live in their own modules; the runner imports only this one, and gets the
probe it records into passed in. What the runner needs besides the interface is here too: the
phase names it brackets, the GPU marks it records, and the sync-site helpers (re-exported from
``probes.sync_site``). This module imports no numpy and no torch.

Timestamps are ``time.perf_counter_ns()``; ``-1`` for a time (and ``None`` for a string) means
"not measured".
"""

from __future__ import annotations

from collections.abc import Sequence

# re-exported for the runner (the copy audit's sites, the output wait)
from mrv2_prof.probes.sync_site import host_waits_active as host_waits_active
from mrv2_prof.probes.sync_site import sync_site as sync_site
from mrv2_prof.probes.sync_site import wait_deliberately as wait_deliberately

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
    "draft",  # speculative decoding: the drafter proposing the step's drafts
)
STEP, SCHEDULE, EXECUTE, PREPARE, FORWARD, SAMPLE, OUTPUT_WAIT, UPDATE, FLUSH, DRAFT = range(
    len(PHASES)
)
# The boundaries of a step's GPU work the runner marks on its stream (probes.gpu_timeline).
G_PREPARE, G_FORWARD, G_SAMPLE, G_END = range(4)
G_DRAFT = 4  # optional, between G_SAMPLE and G_END: a draft model's work (speculative decoding)


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
        context_tokens: int = -1,
        attn_pairs: int = -1,
    ) -> None:
        """The step's figures; ``context_tokens`` and ``attn_pairs``: its attention extent
        (``SchedulerOutput.attention_extent``; -1: not known, stored as NULL)."""
        pass

    def begin(self, phase: int) -> None:
        pass

    def end(self, phase: int) -> None:
        pass

    def switch(self, ending: int, beginning: int) -> None:
        """``end(ending)`` then ``begin(beginning)`` at one instant: the two spans share the
        timestamp (one call and one clock read where one phase follows another directly)."""
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

    def kernel_compile(self, source: str, kernel: str, key: str, compile_ms: float) -> None:
        """A kernel compiled (``source``: triton | torch) with specialization ``key``, costing
        ``compile_ms`` of wall time; before the first step it belongs to start-up."""
        pass

    # Tensor parallelism: one rank's host span of one step and its time in collectives.
    def rank_step(self, rank: int, step: int, start_ns: int, end_ns: int, comm_ns: int) -> None:
        pass

    # GPU timeline: the runner marks each step's boundaries on its stream (``gpu_timeline``).
    def before_wait(self, ready: object) -> None:
        """The runner is about to block until ``ready`` (a CUDA event) completes: a probe may do
        its deferred work first, where the host would otherwise wait (the GPU timeline resolves
        finished steps; ``ready.query()`` says whether the wait would block)."""
        pass

    def gpu_mark(self, mark: int) -> object | None:
        """A step boundary on the runner's stream (``G_*``). Returns the CUDA event the probe
        recorded for it, or None: the runner's output uses the ``G_END`` event as its own
        ready event (the same point of the stream), so that mark costs no record of its own."""
        return None

    # Copy audit: ``runner.worker.copy_audit.CopyAudit`` reports each host<->device copy when
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

    # Speculative decoding, once per step before ``step_end``: the step's k and drafted tokens
    # (the batch queued), and the verifies whose tokens were read in it, as
    # ``(req_id, drafted, accepted)``. ``reserved``: draft slots scheduled in the batch queued
    # (KV slots and token budget reserved optimistically); ``reclaimed``: draft slots given back
    # by the verifies read (slots less accepted drafts, summed); ``sat_out``: requests that could
    # have decoded but sat out the step because of speculation (host drafts under async
    # scheduling). Dynamic k's decision (None: none made, dynamic k not adaptive):
    # ``expected_tokens``, the tokens a verifying request emits per step at the best k > 0 it
    # considered, and ``cost_ratio``, the step time at that k over the time at k = 0; the step's
    # k is what it chose (0: off). Speculation pays when expected_tokens / cost_ratio > 1.
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
        pass

    def token(self, req_id: str, idx: int, t_ns: int, token_id: int) -> None:
        pass

    def step_tokens(
        self,
        req_ids: list[str],
        idx: Sequence[int],
        t_ns: int,
        token_ids: list[int],
        first_tokens: bool = True,
    ) -> None:
        """One step's tokens at once (``token`` for each j); the lists are not modified later.
        ``first_tokens`` False: the caller knows no ``idx`` is 0 (no request got its first
        token this step), so a recorder need not look."""
        for j, req_id in enumerate(req_ids):
            self.token(req_id, idx[j], t_ns, token_ids[j])

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
