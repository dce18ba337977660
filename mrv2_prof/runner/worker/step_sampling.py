"""A step's sampling glue (MRV2 ``model_runner.sample``): plain sampling, or a verify step's.

``sample_step`` reads the rows' sampling parameters through ``idx_mapping`` into one
``SamplingMetadata`` (its host-side shortcuts from the CPU copies of the parameters, no device
read) and samples one token per row. A verify step rejection-samples its rows instead
(``spec_decode/verify.py``): the output's token per request is its last emitted one, and the
logprobs, when asked for, come per target row. ``prepare_verify`` lays a verify step's drafts
into the batch's inputs before the forward pass, with the draft model's probabilities for the
requests that sample.
"""

from __future__ import annotations

import torch

from mrv2_prof.runner.core.scheduler import SchedulerOutput
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.kernel_set import KernelSet
from mrv2_prof.runner.worker.request_states import RequestStates
from mrv2_prof.runner.worker.sampler import GREEDY_TEMPERATURE, SamplerOutput, SamplingMetadata
from mrv2_prof.runner.worker.spec_decode.device_drafts import DeviceDrafts
from mrv2_prof.runner.worker.spec_decode.draft_runner import DraftRunner
from mrv2_prof.runner.worker.spec_decode.rejection_sampler import RejectionOutput
from mrv2_prof.runner.worker.spec_decode.verify import Verifier, VerifyInputs


def prepare_verify(
    verifier: Verifier,
    drafter: DraftRunner | None,
    batch: InputBatch,
    so: SchedulerOutput,
    rs: RequestStates,
    device_drafts: DeviceDrafts | None = None,
) -> VerifyInputs:
    """A verify step's layout, its drafts written into the batch's inputs (from the device's
    drafts, with ``device_drafts``)."""
    verify = verifier.prepare(
        batch.req_ids, batch.query_start_loc_np, so.scheduled_spec_decode_tokens
    )
    if device_drafts is not None:
        device_drafts.apply(batch, verify)
    else:
        verifier.apply(batch, verify)
    if drafter is not None:  # the draft's probabilities for a sampled request
        drafter.attach_probs(verify, batch, rs)
    return verify


def sample_step(
    kernels: KernelSet,
    verifier: Verifier | None,
    rs: RequestStates,
    batch: InputBatch,
    logits: torch.Tensor,
    verify: VerifyInputs | None = None,
) -> tuple[SamplerOutput, int, RejectionOutput | None]:
    """One token per row, and the most logprobs any row asked for; with ``verify``, the
    rejection sampler's output too."""
    idx = batch.idx_mapping_np
    num_logprobs = int(rs.num_logprobs_np[idx].max())
    meta = SamplingMetadata(
        idx_mapping=batch.idx_mapping,
        positions=batch.seq_lens if verify is None else batch.seq_lens.long(),  # int32 ok
        temperature=rs.temperature,
        top_k=rs.top_k,
        top_p=rs.top_p,
        seeds=rs.seeds,
        max_num_logprobs=num_logprobs,
        # host-side shortcuts, read from the CPU copies of the parameters (no device read)
        all_greedy=bool((rs.temperature_np[idx] < GREEDY_TEMPERATURE).all()),
        no_top_k=not bool((rs.top_k_np[idx] > 0).any()),
        no_top_p=bool((rs.top_p_np[idx] >= 1.0).all()),
    )
    if verify is None:
        return kernels.sample(logits, meta), num_logprobs, None
    meta.positions = meta.positions - verify.drafts.num_slots  # each request's first row
    rejection = verifier.sample(logits, verify, meta)
    last = Verifier.last_tokens(rejection)
    if num_logprobs <= 0:
        return SamplerOutput(last, None, None), 0, rejection
    ids, lps = Verifier.row_logprobs(logits, verify, rejection, num_logprobs)  # every row
    return SamplerOutput(last, ids, lps), num_logprobs, rejection
