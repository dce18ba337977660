"""The steady decode step over columns of the running requests: no Python work per request.

When every running request that has work needs exactly one token, the budget covers them all
and the blocks they need are free, the scheduler's general loop would schedule each for one
token in running order with no preemption; ``SteadyDecode.schedule`` decides the same with
numpy over the running requests, and ``SteadyDecode.update`` applies that step's tokens the
way ``update_from_output``'s loop does. (vLLM's scheduler has one loop for every step; MRV2's
host path wants the steady decode step to cost no Python work per request.)

``DecodeColumns`` holds the running requests in running order: what does not change while
they decode (ids, prompt lengths, max tokens, stop and logprobs flags, the token lists) and
what only these passes and the KV allocations they make change (computed tokens, block
capacity, hashed blocks). The scheduler calls ``invalidate`` whenever anything else changes
the running set or a request's computed tokens (admission, finish, abort, preemption, a step
of the general loop); the next steady step builds the columns again. Token counts and, with
async scheduling, output placeholders follow both updates (the general one through
``note_tokens``). The requests stay the truth: each step writes their new counts back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter
from typing import Any

import numpy as np

from mrv2_prof.runner.core.kv_cache_manager import KVCacheManager
from mrv2_prof.runner.core.request import Request, RequestStatus

_PLACEHOLDERS = attrgetter("num_output_placeholders")
# Below this many running requests a loop over them is cheaper than numpy's cost per call.
COLUMNS_FROM = 32


def _consume(it: Iterable[Any]) -> None:
    deque(it, maxlen=0)


def _set_all(objs: list[Request], name: str, values: np.ndarray) -> None:
    """``obj.name = value`` for each pair, without a Python loop."""
    _consume(map(setattr, objs, repeat(name), values.tolist()))


def _count(lists: Iterable[list], n: int) -> np.ndarray:
    return np.fromiter(map(len, lists), np.int64, n)


class DecodeColumns:
    """The running requests, in running order, as columns (see the module docstring)."""

    def __init__(self, running: list[Request], kv: KVCacheManager, max_model_len: int) -> None:
        n = len(running)
        self.reqs = list(running)
        self.ids = [r.request_id for r in running]
        self.all_lists = [r.all_token_ids for r in running]
        self.out_lists = [r.output_token_ids for r in running]
        params = [r.sampling_params for r in running]
        self.row_of = {rid: i for i, rid in enumerate(self.ids)}
        self.computed = np.fromiter((r.num_computed_tokens for r in running), np.int64, n)
        self.num_tokens = _count(self.all_lists, n)
        self.pending = np.fromiter(map(_PLACEHOLDERS, running), np.int64, n)
        self.prompt = np.fromiter((len(r.prompt_token_ids) for r in running), np.int64, n)
        self.max_tokens = np.fromiter((p.max_tokens for p in params), np.int64, n)
        # the length a request finishes at: its max tokens, or the model's limit
        self.limit = np.minimum(self.prompt + self.max_tokens, max_model_len)
        self.has_stop_ids = np.fromiter((bool(p.stop_token_ids) for p in params), bool, n)
        # the update's one test for "may stop": the length limit, or 0 with stop ids
        self.stop_at = np.where(self.has_stop_ids, 0, self.limit)
        self.prompt1 = self.prompt + 1  # a row's last output index is num_tokens - prompt1
        self.below_prompt = int(np.count_nonzero(self.computed < self.prompt))
        self.logprobs = np.fromiter((p.logprobs > 0 for p in params), bool, n)
        self.any_logprobs = bool(np.count_nonzero(self.logprobs))
        held, hashes = kv.req_to_blocks, kv.req_to_block_hashes
        self.capacity = np.fromiter((len(held[i]) for i in self.ids), np.int64, n)
        self.capacity *= kv.block_size
        self.hashed = np.fromiter((len(hashes.get(i, ())) for i in self.ids), np.int64, n)
        # the token count at which a row's next block is full and hashed (never: no caching)
        self.next_full = (self.hashed + 1) * kv.block_size
        if not kv.enable_caching:
            self.next_full[:] = np.iinfo(np.int64).max
        # One EOS set for all (the engine's case): a vector test; else every row with one
        # is checked in full.
        eos = {r.eos_token_ids for r in running}
        self.eos = np.array(next(iter(eos)), np.int64) if len(eos) == 1 else None
        self.eos_list = self.eos.tolist() if self.eos is not None else []
        self.has_eos = np.fromiter((bool(r.eos_token_ids) for r in running), bool, n)


@dataclass
class SteadyBatch:
    """One steady decode step, kept by the scheduler until its tokens come back."""

    reqs: list[Request]  # batch order
    ids: list[str]
    computed: np.ndarray | list[int]  # before the step
    num_prompt: int  # tokens of the step that are prompt tokens
    new_blocks: dict[str, list[int]]  # only the requests that got blocks
    cols: DecodeColumns | None  # None: decided by the loop (a few requests)
    rows: np.ndarray | None  # the batch's rows of ``cols``; None: all of them
    finishes: int  # the scheduler's finish count when it was scheduled


class SteadyDecode:
    def __init__(self, kv: KVCacheManager, max_model_len: int, async_scheduling: bool) -> None:
        self.kv = kv
        self.max_model_len = max_model_len
        self.async_scheduling = async_scheduling
        self._cols: DecodeColumns | None = None
        # the last ``update``'s return value, its ids, output indices and tokens
        self.last_tokens: tuple[list[Request], list[str], np.ndarray, list[int], bool] | None = None
        # columnar steps whose tokens are still to come (one, two with async scheduling)
        self._batches: list[tuple[Any, SteadyBatch]] = []
        # a columnar schedule's counters for its requests, written back by ``settle``
        self._write_backs: list[tuple[list[Request], str, np.ndarray]] = []

    def settle(self) -> None:
        """Write the last columnar schedule's counters back into its requests (``schedule``
        leaves them for after the step is queued: nothing reads them before)."""
        if self._write_backs:
            for reqs, name, values in self._write_backs:
                _set_all(reqs, name, values)
            self._write_backs = []

    def invalidate(self) -> None:
        """The running set or a request's computed tokens changed outside these passes."""
        self._cols = None

    def keep(self, so: Any, batch: SteadyBatch) -> None:
        """``batch`` was scheduled as ``so``, alone (no new request): its tokens may take the
        columnar update."""
        if batch.cols is not None and batch.reqs:
            self._batches = [*self._batches[-1:], (so, batch)]

    def take(self, so: Any, finishes: int) -> SteadyBatch | None:
        """The kept steady step of ``so``, if nothing finished since it was scheduled
        (``finishes``: the scheduler's finish count now): its requests are all still here."""
        batches = self._batches
        for i, (out, batch) in enumerate(batches):
            if out is so:
                del batches[: i + 1]  # older ones will never be updated
                return batch if batch.finishes == finishes else None
        return None

    def token_rows(
        self, updated: list[Request]
    ) -> tuple[list[str], Sequence[int], list[int], bool]:
        """Each of ``updated``'s id, last output index and last token, and whether any index
        may be 0 (a first token): the columns' own after a columnar update that returned
        ``updated``, else read from the requests. A columnar step gives a request its first
        token only where it computed a prompt token (its last one, after a prefix hit)."""
        last = self.last_tokens
        if last is not None and last[0] is updated:
            return last[1], last[2], last[3], last[4]
        return (
            [r.request_id for r in updated],
            [len(r.output_token_ids) - 1 for r in updated],
            [r.output_token_ids[-1] for r in updated],
            True,
        )

    def note_tokens(self, req_ids: Iterable[str]) -> None:
        """Requests that got a token outside ``update`` (the general update): their token
        counts and placeholders follow, where the columns hold them."""
        cols = self._cols
        if cols is None:
            return
        for rid in req_ids:
            i = cols.row_of.get(rid)
            if i is not None:
                cols.num_tokens[i] += 1
                if self.async_scheduling:
                    cols.pending[i] -= 1

    def schedule(self, running: list[Request], budget: int, finishes: int) -> SteadyBatch | None:
        """The steady decode step, its new blocks allocated; None, having changed nothing,
        when the general loop must decide. ``finishes``: the scheduler's finish count now."""
        n = len(running)
        if not n or budget < n:
            return None
        if n < COLUMNS_FROM:
            self._cols = None
            return self._schedule_few(running, finishes)
        cols = self._cols
        if cols is None:
            cols = self._cols = DecodeColumns(running, self.kv, self.max_model_len)
        num_tokens, computed, pending = cols.num_tokens, cols.computed, cols.pending
        todo = num_tokens - computed
        if self.async_scheduling:
            todo += pending
        active = None  # None: every row
        if np.count_nonzero(todo != 1):
            if np.count_nonzero(todo > 1):
                return None  # a prefill chunk
            active = todo == 1
        if self.async_scheduling:
            # sure to finish by length once its tokens land: sits out (a request without
            # tokens in flight is below its limit, else an update had finished it)
            sits_out = num_tokens + pending >= cols.limit
            if np.count_nonzero(sits_out):
                active = ~sits_out if active is None else active & ~sits_out
        kv = self.kv
        touched = computed >= cols.capacity  # the next token starts a block
        if active is not None:
            touched &= active
        if np.count_nonzero(touched) > kv.num_free_blocks:
            return None  # someone is preempted
        # a block fills up: its hash goes into the cache (an active row computes up to its
        # last token: min(computed + 1, num_tokens) is num_tokens)
        fills = num_tokens >= cols.next_full
        touched |= fills if active is None else fills & active
        new_blocks: dict[str, list[int]] = {}
        if np.count_nonzero(touched):
            for i in np.flatnonzero(touched).tolist():
                request, rid = cols.reqs[i], cols.ids[i]
                blocks = kv.append_slot(request)
                if blocks:
                    new_blocks[rid] = blocks
                cols.capacity[i] = len(kv.req_to_blocks[rid]) * kv.block_size
                if kv.enable_caching:
                    cols.hashed[i] = hashed = len(kv.req_to_block_hashes.get(rid, ()))
                    cols.next_full[i] = (hashed + 1) * kv.block_size
        if active is None:
            rows, reqs, ids = None, list(cols.reqs), list(cols.ids)
            before = computed.copy()
            computed += 1
            num_prompt = 0
            if cols.below_prompt:  # a prompt token left after a prefix hit
                num_prompt = np.count_nonzero(before < cols.prompt)
                cols.below_prompt = np.count_nonzero(computed < cols.prompt)
            later = self._write_backs  # for ``settle``, once the step is queued
            later.append((reqs, "num_computed_tokens", computed.copy()))  # columns move on
            if self.async_scheduling:  # each reaches num_tokens + placeholders: all sample
                pending += 1
                later.append((reqs, "num_output_placeholders", pending.copy()))
        else:
            mask = active.tolist()
            rows = np.flatnonzero(active)
            reqs, ids = list(compress(cols.reqs, mask)), list(compress(cols.ids, mask))
            before = computed[rows]
            computed[rows] += 1
            num_prompt = 0
            if cols.below_prompt:
                num_prompt = np.count_nonzero(before < cols.prompt[rows])
                cols.below_prompt = np.count_nonzero(computed < cols.prompt)
            later = self._write_backs  # for ``settle``, once the step is queued
            later.append((reqs, "num_computed_tokens", before + 1))  # new arrays, not views
            if self.async_scheduling:
                pending[rows] += 1
                later.append((reqs, "num_output_placeholders", pending[rows]))
        return SteadyBatch(reqs, ids, before, num_prompt, new_blocks, cols, rows, finishes)

    def _schedule_few(self, running: list[Request], finishes: int) -> SteadyBatch | None:
        """``schedule`` for a few requests: the same decision, one request at a time."""
        kv = self.kv
        block_size, held = kv.block_size, kv.req_to_blocks
        hashes = kv.req_to_block_hashes if kv.enable_caching else None
        batch, ids, computed, touched = [], [], [], []
        num_new_blocks = num_prompt = 0
        for request in running:
            c = request.num_computed_tokens
            num_tokens = len(request.all_token_ids)
            pending = request.num_output_placeholders
            n = num_tokens + pending - c
            if n != 1:
                if n <= 0:
                    continue
                return None  # a prefill chunk
            if pending and num_tokens + pending >= min(
                len(request.prompt_token_ids) + request.sampling_params.max_tokens,
                self.max_model_len,
            ):
                continue  # sure to finish by length once its tokens land
            rid = request.request_id
            if c >= len(held[rid]) * block_size:
                num_new_blocks += 1
                touched.append(request)
            elif hashes is not None and len(hashes.get(rid, ())) < num_tokens // block_size:
                touched.append(request)  # a block fills up: its hash goes into the cache
            batch.append(request)
            ids.append(rid)
            computed.append(c)
            if c < len(request.prompt_token_ids):
                num_prompt += 1
        if num_new_blocks > kv.num_free_blocks:
            return None  # someone is preempted
        new_blocks = {}
        for request in touched:
            blocks = kv.append_slot(request)
            if blocks:
                new_blocks[request.request_id] = blocks
        for request in batch:
            request.num_computed_tokens += 1
            if self.async_scheduling:  # each reaches num_tokens + placeholders: all sample
                request.num_output_placeholders += 1
        return SteadyBatch(batch, ids, computed, num_prompt, new_blocks, None, None, finishes)

    def update(
        self,
        batch: SteadyBatch,
        sampled_token_ids: list[int],
        logprobs: list | None,
        finish: Callable[[Request, RequestStatus], None],
    ) -> list[Request]:
        """The tokens of ``batch`` (one per request, batch order), with nothing finished since it
        was scheduled: appended, placeholders released, stops applied (``stop_status`` only
        for the requests the vector test says may stop)."""
        reqs, cols, rows = batch.reqs, batch.cols, batch.rows
        n = len(reqs)
        tokens = sampled_token_ids if len(sampled_token_ids) == n else sampled_token_ids[:n]
        if rows is None:
            out_lists, all_lists = cols.out_lists, cols.all_lists
        else:
            mask = np.zeros(len(cols.reqs), bool)
            mask[rows] = True
            mask = mask.tolist()
            out_lists = compress(cols.out_lists, mask)
            all_lists = compress(cols.all_lists, mask)
        _consume(map(list.append, out_lists, tokens))
        _consume(map(list.append, all_lists, tokens))

        def col(a: np.ndarray) -> np.ndarray:
            return a if rows is None else a[rows]

        if cols is self._cols:  # the columns follow in place
            if rows is None:
                cols.num_tokens += 1
            else:
                cols.num_tokens[rows] += 1
            num_tokens = col(cols.num_tokens)
            if self.async_scheduling:
                if rows is None:
                    cols.pending -= 1
                else:
                    cols.pending[rows] -= 1
                _set_all(reqs, "num_output_placeholders", col(cols.pending))
        else:  # built again since this step was scheduled: its rows are elsewhere now
            num_tokens = np.fromiter((len(r.all_token_ids) for r in reqs), np.int64, n)
            if self.async_scheduling:
                pending = np.fromiter(map(_PLACEHOLDERS, reqs), np.int64, n)
                _set_all(reqs, "num_output_placeholders", pending - 1)
            self.note_tokens(batch.ids)
        if logprobs is not None and cols.any_logprobs:
            for i in np.flatnonzero(col(cols.logprobs)).tolist():
                reqs[i].output_logprobs.append(logprobs[i])
        maybe = num_tokens >= col(cols.stop_at)
        if cols.eos is None:
            maybe |= col(cols.has_eos)
        elif len(cols.eos) <= 4:  # a few EOS ids (llama-3 has 3): one compare each, no isin
            sampled = np.array(tokens, np.int64)
            for e in cols.eos_list:
                maybe |= sampled == e
        else:
            maybe |= np.isin(np.array(tokens, np.int64), cols.eos)
        updated = list(reqs)
        idx = num_tokens - col(cols.prompt1)
        self.last_tokens = (updated, batch.ids, idx, tokens, batch.num_prompt > 0)
        if np.count_nonzero(maybe):
            for i in np.flatnonzero(maybe).tolist():
                status = reqs[i].stop_status(tokens[i], self.max_model_len)
                if status is not None:
                    finish(reqs[i], status)
        return updated
