"""What one ``schedule()`` hands the model runner (vLLM's ``v1/core/sched/output.py``).

``SchedulerOutput`` names the step's new requests (every token they hold, their blocks), the
requests already holding a runner slot as columns (only their new blocks travel), the token
count of every scheduled request in batch order, and the ids that leave the runner first
(finished, aborted, preempted). It is plain data: a tensor-parallel runner sends it to its
worker ranks as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from mrv2_prof.runner.core.request import SamplingParams


@dataclass
class NewRequestData:
    """A request the runner has not seen (or sees again after a preemption)."""

    req_id: str
    token_ids: list[int]  # every token known now: prompt, plus outputs when resumed
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int  # prefix-cache hit
    num_prompt_tokens: int  # of token_ids, the original prompt (the rest: earlier outputs)


class CachedRequest(NamedTuple):
    """One row of ``CachedRequestData``."""

    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """The requests already holding a runner slot, as columns (vLLM's ``CachedRequestData``):
    only their new blocks travel. No object per request: iterating makes ``CachedRequest``
    rows for readers that want them."""

    req_ids: list[str]
    # before this step: a list, or an int64 array from the steady decode pass
    num_computed_tokens: Sequence[int]
    new_block_ids: dict[str, list[int]]  # only the requests that got blocks this step

    def __len__(self) -> int:
        return len(self.req_ids)

    def __iter__(self) -> Iterator[CachedRequest]:
        blocks = self.new_block_ids
        for rid, n in zip(self.req_ids, self.num_computed_tokens, strict=True):
            yield CachedRequest(rid, blocks.get(rid, []), int(n))


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]  # batch order
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]  # leave the runner before this step: finished, aborted, preempted
    preempted_req_ids: set[str] = field(default_factory=set)
    # Requests whose sampled token this step is a real output (their last known token is in
    # the step); the others are prefill chunks whose sample is dropped.
    sampling_req_ids: set[str] = field(default_factory=set)
    # Tokens of the step that are not a decode (a prompt token), when the scheduler counted
    # them on its way (the steady decode step); None: count them from the requests.
    num_prefill_tokens: int | None = None
    # Speculative decoding: each verifying request's drafts, then PAD_DRAFT slots up to its k.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def num_reqs(self) -> int:
        return len(self.num_scheduled_tokens)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0

    def attention_extent(self) -> tuple[int, int]:
        """``(context_tokens, attn_pairs)`` of the step: the KV cache tokens its attention reads
        (each request's context after the step, its new tokens included) and the query-key
        pairs it scores (a request with ``c`` tokens computed and ``n`` scheduled scores
        ``n * c + n * (n + 1) / 2``). With one token per request both are the same sum."""
        new, cached = self.scheduled_new_reqs, self.scheduled_cached_reqs
        computed = sum(r.num_computed_tokens for r in new)
        columns = cached.num_computed_tokens  # an int64 array (a numpy sum: ~1 us) or a list
        computed += int(columns.sum()) if hasattr(columns, "sum") else sum(columns)
        total = self.total_num_scheduled_tokens
        if total == len(self.num_scheduled_tokens):  # one token each (decode): pairs = context
            return computed + total, computed + total
        sched = self.num_scheduled_tokens
        n = np.fromiter(map(sched.__getitem__, cached.req_ids), np.int64, len(cached.req_ids))
        c = np.asarray(columns, dtype=np.int64)
        pairs = int((n * c + n * (n + 1) // 2).sum())
        for r in new:
            n = sched[r.req_id]
            pairs += n * r.num_computed_tokens + n * (n + 1) // 2
        return computed + total, pairs
