"""The scheduler's diff applied to the runner's persistent state, the first thing a step does:
finished requests leave their slots, new ones take slots (their token ids, sampling parameters
and seed, their block-table row, a prompt-logprobs request kept for the steps that compute it),
and the drafters learn of them; running requests append their new blocks; with dense writes
(``staged_writes: false``) each request's computed count is set again, as the CPU copy is
re-sent every step. Everything here is a staged write or host state: nothing runs on the device
until the writes are applied (``ModelRunner._apply_diff``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mrv2_prof.runner.core.scheduler import SchedulerOutput
from mrv2_prof.runner.worker.request_states import request_seed

if TYPE_CHECKING:
    from mrv2_prof.runner.worker.model_runner import ModelRunner


def update_states(runner: ModelRunner, so: SchedulerOutput) -> None:
    """Apply ``so``'s new, finished and cached requests to ``runner``'s slots and tables."""
    rs = runner.req_states
    for req_id in so.finished_req_ids:
        rs.remove_request(req_id)
        runner.prompt_logprob_requests.pop(req_id, None)
    for new in so.scheduled_new_reqs:
        k = new.sampling_params.prompt_logprobs
        if k is not None:
            prompt = np.asarray(new.token_ids[: new.num_prompt_tokens], dtype=np.int64)
            runner.prompt_logprob_requests[new.req_id] = (k, prompt)
        seed = request_seed(runner.config.seed, new.req_id, new.sampling_params.seed)
        slot = rs.add_request(
            new.req_id, new.token_ids, new.num_computed_tokens, new.sampling_params, seed
        )
        runner.block_tables.set_row(slot, new.block_ids)
    if runner.drafter is not None:  # prefix-cache hits: the draft computes the cached tokens
        runner.drafter.add_requests(so.scheduled_new_reqs, rs.slot_of)
    if runner.device_drafts is not None and so.scheduled_new_reqs:
        runner.device_drafts.add_requests(so.scheduled_new_reqs, rs.slot_of)
    cached, slot_of = so.scheduled_cached_reqs, rs.slot_of
    for req_id, block_ids in cached.new_block_ids.items():  # only those that got blocks
        runner.block_tables.append(slot_of[req_id], block_ids)
    if not runner.config.staged_writes:  # dense: the CPU copy is re-sent every step
        for req_id, n in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            rs.set_num_computed(slot_of[req_id], n)
