"""Rejection sampling in Triton: ``rejection_sample``'s contract (``rejection_sampler.py``, the
torch reference and the oracle) in two launches, with nothing read back by the host.

* ``_row_kernel``, one program per target row: a first scan of the row's logits gives the
  softmax's running max and sum (over the tokens top-k / top-p keep: the threshold comes from
  the sampler's own torch ops, as in ``sampler_triton``) and the argmax; then, for a row of a
  random request, a second scan draws from the residual ``max(p - q, 0)`` by Gumbel-max with the
  row's noise (q: the draft's probabilities, or a one-hot at the draft token). The row's verdict
  (draft accepted?) and the token emitted if the walk stops at it are written per row. Greedy
  rows skip the second scan. A row finds its request, slot, temperature, seed, position, draft
  and draft probabilities itself from its request index and its index within the request
  (``DraftBatch.row_req`` / ``row_j``, which the runner builds on the host with the drafts and
  sends in the verify's one copy; derived from ``cu_rows`` when absent): no per-row gathers
  before the launch, and no [R, V] copy of the draft probabilities.
* ``_walk_kernel``, one program per request: the accepted prefix (drafts while their rows
  accept), then the stop row's token, -1 after; and the accepted count.

The random numbers are the sampler's (``sampler_rng_triton``: ``(seed, position, token)``); with
``PRECISE`` the logs are libdevice's, as torch's on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.worker.sampler import GREEDY_TEMPERATURE, SamplingMetadata
from mrv2_prof.runner.worker.sampler_rng_triton import gumbel, is_interpreted, log, row_key, uniform
from mrv2_prof.runner.worker.sampler_triton import top_k_top_p_threshold
from mrv2_prof.runner.worker.spec_decode.rejection_sampler import (
    DraftBatch,
    RejectionOutput,
    row_params,
)
from mrv2_prof.runner.worker.triton_launch import Launcher
from mrv2_prof.runner.worker.uva import take  # the parameters may be UVA (pinned host)

_BLOCK = 1024  # logits per loop step
_GREEDY = tl.constexpr(GREEDY_TEMPERATURE)
_NO_TOKEN = tl.constexpr(2**31 - 1)


@triton.jit
def _row_kernel(
    logits_ptr,  # [R, V]
    logits_stride,
    row_req_ptr,  # [R] int: the row's request b
    row_j_ptr,  # [R] int: its index j within the request's rows
    idx_mapping_ptr,  # [B]: request -> slot
    positions_ptr,  # [B] int: the request's first row's position
    temperature_ptr,  # [slots] float32 (device, or pinned host read through UVA)
    seeds_ptr,  # [slots] int64 (the same)
    num_draft_ptr,  # [B] int: k_b real drafts
    draft_ids_ptr,  # [B, K] int64
    draft_ids_stride,
    q_ptr,  # [B, K, V] float32 draft probabilities (HAS_Q)
    q_stride_b,
    q_stride_j,
    threshold_ptr,  # [R] float32 (HAS_THRESHOLD)
    accept_ptr,  # [R] int8: written
    stop_ptr,  # [R] int64: written
    vocab_size,
    max_k,
    BLOCK: tl.constexpr,
    HAS_Q: tl.constexpr,
    HAS_THRESHOLD: tl.constexpr,
    PRECISE: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    row = logits_ptr + r * logits_stride
    b = tl.load(row_req_ptr + r).to(tl.int64)
    j = tl.load(row_j_ptr + r).to(tl.int64)
    slot = tl.load(idx_mapping_ptr + b).to(tl.int64)
    temperature = tl.load(temperature_ptr + slot)
    greedy = temperature < _GREEDY
    divisor = tl.where(greedy, 1.0, temperature)
    threshold = float("-inf")
    if HAS_THRESHOLD:
        threshold = tl.load(threshold_ptr + r)
    has_draft = j < tl.load(num_draft_ptr + b).to(tl.int64)
    jj = tl.minimum(j, max_k - 1)  # the draft slot this row verifies (clamped for the bonus row)
    d = tl.where(has_draft, tl.load(draft_ids_ptr + b * draft_ids_stride + jj), 0)
    q_row = q_ptr + b * q_stride_b + jj * q_stride_j
    offs = tl.arange(0, BLOCK)

    # Scan 1: running max / sum of exp over kept tokens, the raw argmax, the kept argmax.
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    best_raw = tl.full([BLOCK], float("-inf"), tl.float32)
    idx_raw = tl.full([BLOCK], _NO_TOKEN, tl.int32)
    for start in range(0, vocab_size, BLOCK):
        cols = start + offs
        ok = cols < vocab_size
        raw = tl.load(row + cols, mask=ok, other=float("-inf")).to(tl.float32)
        better = raw > best_raw  # per lane the first index of its max (cols increase)
        idx_raw = tl.where(better, cols, idx_raw)
        best_raw = tl.where(better, raw, best_raw)
        x = tl.math.div_rn(raw, divisor)
        x = tl.where(ok & (x >= threshold), x, float("-inf"))
        m_new = tl.maximum(m, x)
        s = s * tl.exp(tl.where(m_new == float("-inf"), 0.0, m - m_new)) + tl.where(
            x == float("-inf"), 0.0, tl.exp(x - m_new)
        )
        m = m_new
    top = tl.max(best_raw, axis=0)
    argmax = tl.min(tl.where(best_raw == top, idx_raw, _NO_TOKEN), axis=0)
    row_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - row_max)), axis=0)

    key = row_key(tl.load(seeds_ptr + slot), tl.load(positions_ptr + b).to(tl.int64) + j)
    x_d = tl.math.div_rn(tl.load(row + d).to(tl.float32), divisor)
    p_d = tl.where(x_d >= threshold, tl.exp(x_d - row_max) / total, 0.0)
    q_d = 1.0
    if HAS_Q:
        q_d = tl.load(q_row + d)
    u = tl.sum(uniform(key, d + tl.zeros([1], tl.int64)), axis=0)
    accept = tl.where(greedy, d == argmax, u * q_d < p_d) & has_draft
    tl.store(accept_ptr + r, accept.to(tl.int8))

    stop = argmax
    if not greedy:  # Scan 2: Gumbel-max over log(max(p - q, 0)); p's argmax if it is empty
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        idx = tl.full([BLOCK], _NO_TOKEN, tl.int32)
        best_p = tl.full([BLOCK], -1.0, tl.float32)
        idx_p = tl.full([BLOCK], _NO_TOKEN, tl.int32)
        for start in range(0, vocab_size, BLOCK):
            cols = start + offs
            ok = cols < vocab_size
            raw = tl.load(row + cols, mask=ok, other=float("-inf")).to(tl.float32)
            x = tl.math.div_rn(raw, divisor)
            p = tl.where(ok & (x >= threshold), tl.exp(x - row_max) / total, 0.0)
            if HAS_Q:
                q = tl.load(q_row + cols, mask=ok, other=0.0)
                q = tl.where(has_draft, q, 0.0)
            else:
                q = tl.where((cols == d) & has_draft, 1.0, 0.0)
            res = tl.maximum(p - q, 0.0)
            score = tl.where(res > 0, log(res, PRECISE) + gumbel(key, cols, PRECISE), float("-inf"))
            better = score > best
            idx = tl.where(better, cols, idx)
            best = tl.where(better, score, best)
            better_p = p > best_p
            idx_p = tl.where(better_p, cols, idx_p)
            best_p = tl.where(better_p, p, best_p)
        top_score = tl.max(best, axis=0)
        drawn = tl.min(tl.where(best == top_score, idx, _NO_TOKEN), axis=0)
        top_p = tl.max(best_p, axis=0)
        most_probable = tl.min(tl.where(best_p == top_p, idx_p, _NO_TOKEN), axis=0)
        stop = tl.where(top_score > float("-inf"), drawn, most_probable)
    tl.store(stop_ptr + r, stop.to(tl.int64))


@triton.jit
def _walk_kernel(
    cu_rows_ptr,  # [B + 1] int32
    num_draft_ptr,  # [B] int32
    draft_ptr,  # [B, K] int64
    draft_stride,
    accept_ptr,  # [R] int8
    stop_ptr,  # [R] int64
    out_ptr,  # [B, 1 + K] int64: written
    out_stride,
    num_accepted_ptr,  # [B] int32: written
    max_k,
):
    b = tl.program_id(0).to(tl.int64)
    row0 = tl.load(cu_rows_ptr + b).to(tl.int64)
    k_b = tl.load(num_draft_ptr + b)
    alive = tl.full([], 1, tl.int32)
    a = tl.full([], 0, tl.int32)
    for j in range(0, max_k):
        ok = tl.load(accept_ptr + row0 + j, mask=j < k_b, other=0).to(tl.int32)
        alive = alive * ok
        a += alive
    stop = tl.load(stop_ptr + row0 + a)
    for j in range(0, max_k + 1):
        draft = tl.load(draft_ptr + b * draft_stride + j, mask=j < max_k, other=-1)
        tok = tl.where(j < a, draft, tl.where(j == a, stop, -1))
        tl.store(out_ptr + b * out_stride + j, tok)
    tl.store(num_accepted_ptr + b, a)


def rejection_sample_triton(
    logits: torch.Tensor, drafts: DraftBatch, meta: SamplingMetadata
) -> RejectionOutput:
    """``rejection_sample`` in two launches (plus the top-k / top-p threshold sort, when the
    host flags allow those masks)."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [R, V] with unit stride, got {tuple(logits.shape)}")
    num_rows, vocab_size = logits.shape
    num_reqs, max_k = drafts.draft_token_ids.shape
    device = logits.device
    accept = torch.empty(num_rows, dtype=torch.int8, device=device)
    stop = torch.empty(num_rows, dtype=torch.int64, device=device)
    out = torch.empty((num_reqs, 1 + max_k), dtype=torch.int64, device=device)
    num_accepted = torch.empty(num_reqs, dtype=torch.int32, device=device)
    if num_reqs == 0:
        return RejectionOutput(out, num_accepted)
    # per-row request, index and slot on the device: only for a layout the runner did not
    # build, or for the torch threshold (top-k / top-p); computed once for both
    derived = None
    if drafts.row_req is None or not (meta.no_top_k and meta.no_top_p):
        derived = row_params(drafts, meta, num_rows)
    threshold = None
    if not (meta.no_top_k and meta.no_top_p):
        slot = derived[3]
        temperature = take(meta.temperature, slot)
        divisor = torch.where(temperature < GREEDY_TEMPERATURE, 1.0, temperature)
        threshold = top_k_top_p_threshold(
            logits,
            divisor,
            None if meta.no_top_k else take(meta.top_k, slot),
            None if meta.no_top_p else take(meta.top_p, slot),
        )
    if drafts.row_req is not None:  # the runner's layout, built on the host with the drafts
        row_req, row_j = drafts.row_req, drafts.row_j
    else:
        row_req, row_j = derived[0], derived[1]
    q = drafts.draft_probs if drafts.draft_probs is not None and max_k else None
    if q is not None and (q.dtype != torch.float32 or q.stride(2) != 1):
        q = q.float().contiguous()
    draft_ids = drafts.draft_token_ids.contiguous()
    _row(
        (num_rows,),
        logits,
        logits.stride(0),
        row_req,
        row_j,
        meta.idx_mapping,
        meta.positions,
        meta.temperature,
        meta.seeds,
        drafts.num_draft,
        draft_ids,
        draft_ids.stride(0),
        q if q is not None else logits,
        q.stride(0) if q is not None else 0,
        q.stride(1) if q is not None else 0,
        threshold if threshold is not None else logits,
        accept,
        stop,
        vocab_size,
        max_k,
        BLOCK=min(_BLOCK, max(16, triton.next_power_of_2(vocab_size))),
        HAS_Q=q is not None,
        HAS_THRESHOLD=threshold is not None,
        PRECISE=not is_interpreted(),
    )
    _walk(
        (num_reqs,),
        drafts.cu_rows,
        drafts.num_draft,
        draft_ids,
        draft_ids.stride(0),
        accept,
        stop,
        out,
        out.stride(0),
        num_accepted,
        max_k,
    )
    return RejectionOutput(out, num_accepted)


_row = Launcher(_row_kernel)  # cached compiled kernels: no JIT binding on the step loop
_walk = Launcher(_walk_kernel)
