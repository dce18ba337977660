"""The V1 engine scheduler: token budget, RUNNING before WAITING, chunked prefill, preemption.

Mirrors ``vllm/v1/core/sched/scheduler.py``: each step spends ``max_num_batched_tokens`` on the
running requests first (a prefill continues in chunks), then admits waiting requests in
(priority, arrival) order up to ``max_num_seqs``, reusing prefix-cached blocks. When the block
pool runs dry the lowest-priority running request is preempted: its blocks are freed, it goes
back to WAITING and is later re-added to the runner as a new request. A step that preempted
admits nobody from WAITING.

With ``async_scheduling`` the scheduler runs one step ahead of the host's knowledge: a request
whose step N will sample a token gets an output *placeholder*, so step N+1 can schedule its next
decode before the token is back (the GPU feeds it from ``last_sampled_tokens``). Tokens then
arrive one step late through ``update_from_output``; a request that finished in step N may
already be in step N+1, and that extra token is discarded. A request sure to finish by length
once its placeholders land is not scheduled again.

Speculative decoding (``spec``, core/spec_scheduling.py) adds each verifying request's drafts
to its step and rolls it back by the rejected count when the tokens come back.

The steady decode step (every running request needs one token) is decided and updated over
columns of the running requests (core/steady_decode.py), with the general loop's result;
the step's output types are in core/scheduler_output.py.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from mrv2_prof.runner.core.kv_cache_manager import KVCacheManager
from mrv2_prof.runner.core.request import Request, RequestStatus
from mrv2_prof.runner.core.scheduler_output import (
    CachedRequest,
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)
from mrv2_prof.runner.core.spec_scheduling import SpecScheduling
from mrv2_prof.runner.core.steady_decode import SteadyDecode

__all__ = ["CachedRequest", "CachedRequestData", "NewRequestData", "Scheduler", "SchedulerOutput"]


class Scheduler:
    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        async_scheduling: bool = False,
        spec: SpecScheduling | None = None,
    ) -> None:
        self.kv = kv_cache_manager
        self.spec = spec  # speculative decoding (core/spec_scheduling.py), None: off
        self.async_scheduling = async_scheduling
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting: list[tuple[int, float, int, Request]] = []  # sorted by schedule key
        self.running: list[Request] = []
        self._finished_ids: set[str] = set()
        self._order = itertools.count()
        self.num_preemptions = 0
        self.num_finishes = 0  # finished or aborted so far
        self._steady = SteadyDecode(kv_cache_manager, max_model_len, async_scheduling)

    # ---- request lifecycle -------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        if request.num_tokens >= self.max_model_len:
            raise ValueError(
                f"request {request.request_id}: prompt of {request.num_tokens} tokens leaves no "
                f"room under max_model_len {self.max_model_len}"
            )
        self.requests[request.request_id] = request
        self._enqueue(request)

    def _enqueue(self, request: Request) -> None:
        request.status = (
            RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
        )
        bisect.insort(
            self.waiting, (*request.schedule_key, next(self._order), request), key=lambda e: e[:3]
        )

    def abort_request(self, request_id: str) -> bool:
        """Finish a request now, wherever it is. Returns False for an unknown/finished id."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        self.settle()
        self._finish(request, RequestStatus.FINISHED_ABORTED)
        return True

    def settle(self) -> None:
        """Write back what a steady decode step left in its columns (the requests' computed
        counts and placeholders): the engine calls it once the step is queued, where the host
        works while the device runs. Everything that reads the requests settles first."""
        self._steady.settle()

    @property
    def finished_ids_to_send(self) -> frozenset[str]:
        """Requests finished since the last schedule: the next ``SchedulerOutput`` tells the
        runner to release their slots."""
        return frozenset(self._finished_ids)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        self._steady.invalidate()
        self.num_finishes += 1
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting = [e for e in self.waiting if e[3] is not request]
        self.kv.free(request)
        request.status = status
        request.finish_reason = status.value
        del self.requests[request.request_id]
        self._finished_ids.add(request.request_id)

    def _preempt(self, request: Request) -> None:
        self._steady.invalidate()
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(request)

    def _lowest_priority_running(self) -> Request:
        """Largest (priority, arrival); among equals the one admitted last."""
        j = max(range(len(self.running)), key=lambda k: (self.running[k].schedule_key, k))
        return self.running[j]

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    # ---- one step ----------------------------------------------------------------------------
    def schedule(self, settle_later: bool = False) -> SchedulerOutput:
        """The next step. ``settle_later``: a steady decode step's write-back into its requests
        waits for ``settle`` (the engine's, once the step is queued); until then only the
        returned output may be read."""
        self._steady.settle()
        budget = self.max_num_batched_tokens
        new_blocks: dict[str, list[int]] = {}
        preempted: list[Request] = []
        spec = self.spec
        steady = None
        if spec is not None:  # drafts change the token counts: the general loop decides
            spec.begin_step(self.running, self.max_model_len)
        else:
            steady = self._steady.schedule(self.running, budget, self.num_finishes)
        if steady is not None and not settle_later:
            self._steady.settle()
        if steady is not None:  # every running request decodes one token: no preemption
            decode_ids = steady.ids
            num_scheduled = dict.fromkeys(decode_ids, 1)
            budget -= len(decode_ids)
        else:
            self._steady.invalidate()  # the general loop changes the running requests
            num_scheduled = self._schedule_running(budget, new_blocks, preempted)
            budget -= sum(num_scheduled.values())

        new_reqs = self._schedule_waiting(budget, num_scheduled, preempted)
        budget -= sum(num_scheduled[d.req_id] for d in new_reqs)

        if steady is not None:
            decode_computed, new_blocks = steady.computed, steady.new_blocks
        else:
            new_ids = {d.req_id for d in new_reqs}
            decode_ids = [rid for rid in num_scheduled if rid not in new_ids]
            decode_computed = [self.requests[rid].num_computed_tokens for rid in decode_ids]
            new_blocks = {rid: b for rid, b in new_blocks.items() if b}
        preempted_ids = {r.request_id for r in preempted}
        spec_tokens = spec.end_step(num_scheduled) if spec is not None else {}
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=CachedRequestData(decode_ids, decode_computed, new_blocks),
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=self.max_num_batched_tokens - budget,
            finished_req_ids=self._finished_ids | preempted_ids,
            preempted_req_ids=preempted_ids,
            scheduled_spec_decode_tokens=spec_tokens,
        )
        self._finished_ids = set()
        if steady is not None:
            out.sampling_req_ids.update(decode_ids)  # each reaches num_tokens + placeholders
            if not new_reqs:
                out.num_prefill_tokens = steady.num_prompt
                self._steady.keep(out, steady)
            updates = [(d.req_id, num_scheduled[d.req_id]) for d in new_reqs]
        else:
            updates = num_scheduled.items()
        for rid, n in updates:
            request = self.requests[rid]
            request.num_computed_tokens += n
            verify = rid in spec_tokens  # 1 + k tokens, all but the rejected emitted
            if verify or request.num_computed_tokens == (
                request.num_tokens + request.num_output_placeholders
            ):
                out.sampling_req_ids.add(rid)
                if self.async_scheduling:
                    request.num_output_placeholders += n if verify else 1
        return out

    def _schedule_running(
        self, budget: int, new_blocks: dict[str, list[int]], preempted: list[Request]
    ) -> dict[str, int]:
        """The general loop over the running requests: chunks, allocation, preemption."""
        num_scheduled: dict[str, int] = {}
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(
                request.num_tokens + request.num_output_placeholders - request.num_computed_tokens,
                budget,
            )
            if self.spec is not None and num_new == 1:  # 1 + drafts, or 0: it sits out
                num_new = self.spec.num_new_tokens(request, budget)
            if num_new <= 0 or self._finishes_in_flight(request):
                i += 1
                continue
            while (blocks := self.kv.allocate_slots(request, num_new)) is None:
                victim = self._lowest_priority_running()
                if victim.request_id in num_scheduled:  # undo its place in this step
                    budget += num_scheduled.pop(victim.request_id)
                    new_blocks.pop(victim.request_id)
                    i -= 1
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if blocks is None:
                continue  # the request itself was preempted; self.running[i] is the next one
            num_scheduled[request.request_id] = num_new
            new_blocks[request.request_id] = blocks
            budget -= num_new
            i += 1
        return num_scheduled

    def _schedule_waiting(
        self, budget: int, num_scheduled: dict[str, int], preempted: list[Request]
    ) -> list[NewRequestData]:
        """Admit waiting requests in order while the budget and ``max_num_seqs`` allow; nobody
        in a step that preempted."""
        new_reqs: list[NewRequestData] = []
        while not preempted and self.waiting and budget > 0:
            if len(self.running) >= self.max_num_seqs:
                break
            request = self.waiting[0][3]
            if request.sampling_params.prompt_logprobs is None:
                cached_blocks, num_cached = self.kv.get_computed_blocks(request)
            else:  # every prompt position must be computed for its logprobs
                cached_blocks, num_cached = [], 0
            num_new = min(request.num_tokens - num_cached, budget)
            blocks = self.kv.allocate_slots(request, num_new, cached_blocks, num_cached)
            if blocks is None:
                break
            self.waiting.pop(0)
            self._steady.invalidate()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_cached
            num_scheduled[request.request_id] = num_new
            new_reqs.append(
                NewRequestData(
                    req_id=request.request_id,
                    token_ids=list(request.all_token_ids),
                    sampling_params=request.sampling_params,
                    block_ids=cached_blocks + blocks,
                    num_computed_tokens=num_cached,
                    num_prompt_tokens=request.num_prompt_tokens,
                )
            )
            budget -= num_new
        return new_reqs

    def _finishes_in_flight(self, request: Request) -> bool:
        """Async only: the tokens still in flight already take the request to its length limit."""
        # a step in flight surely emits one token (a verify's other slots may be rejected)
        pending = min(request.num_output_placeholders, 1)
        return pending > 0 and (
            request.num_output_tokens + pending >= request.sampling_params.max_tokens
            or request.num_tokens + pending >= self.max_model_len
        )

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: list[int],
        logprobs: list[list[tuple[int, float]]] | None = None,
        prompt_logprobs: dict[str, tuple[int, list]] | None = None,
        spec_token_ids: list[list[int]] | None = None,
        spec_num_drafts: list[int] | None = None,
    ) -> list[Request]:
        """Append the token of each request that sampled in the step of ``scheduler_output``;
        return the requests that received a token (finished ones have ``is_finished``).

        With async scheduling this is the step before the one just scheduled: a request that
        finished or was aborted since has its token discarded. ``spec_token_ids``: per batch row
        the tokens a verify emitted (accepted drafts, then one); its logprobs row: one per token;
        ``spec_num_drafts``: per batch row the drafts the device had (drafts on the device)."""
        self._steady.settle()
        for rid, (start, entries) in (prompt_logprobs or {}).items():
            request = self.requests.get(rid)
            if request is not None:
                request.add_prompt_logprobs(start, entries)
        steady = self._steady.take(scheduler_output, self.num_finishes)
        if steady is not None:
            return self._steady.update(steady, sampled_token_ids, logprobs, self._finish)
        updated, note = [], []  # note: the requests whose token counts the columns follow
        sampling = scheduler_output.sampling_req_ids
        batch = scheduler_output.num_scheduled_tokens
        all_sample = len(sampling) == len(batch)  # the steady decode step: no membership test
        requests, max_len = self.requests, self.max_model_len
        is_async = self.async_scheduling
        for b, rid in enumerate(batch):
            if not all_sample and rid not in sampling:
                continue  # a prefill chunk that is not the last
            request = requests.get(rid)
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(rid)
            if request is None:  # finished or aborted meanwhile: the extra token is discarded
                if drafts is not None:  # and its draft slots went back with its blocks
                    self.spec.num_reclaimed += len(drafts)
                continue
            if drafts is not None:
                real = spec_num_drafts[b] if spec_num_drafts is not None else None
                run = self.spec.accept(request, drafts, spec_token_ids[b], logprobs, b, real)
                for token, lps in run:
                    request.append_output_token(token, lps)
                    status = request.stop_status(token, max_len)
                    if status is not None:
                        self._finish(request, status)
                        break
                updated.append(request)
                continue
            if is_async:
                request.num_output_placeholders -= 1
            note.append(rid)
            token = sampled_token_ids[b]
            request.output_token_ids.append(token)
            request.all_token_ids.append(token)
            params = request.sampling_params
            if logprobs is not None and params.logprobs:
                request.output_logprobs.append(logprobs[b])
            if (  # a cheap test first: only a request that may stop is checked in full
                token in request.eos_token_ids
                or len(request.output_token_ids) >= params.max_tokens
                or len(request.all_token_ids) >= max_len
                or params.stop_token_ids
            ):
                status = request.stop_status(token, max_len)
                if status is not None:
                    self._finish(request, status)
            updated.append(request)
        self._steady.note_tokens(note)
        return updated

    def token_rows(
        self, updated: list[Request]
    ) -> tuple[list[str], Sequence[int], list[int], bool]:
        """What ``updated`` (``update_from_output``'s last return) received: each request's
        id, the index of its last output token and that token, and whether any may be a first
        token (``SteadyDecode.token_rows``)."""
        return self._steady.token_rows(updated)
