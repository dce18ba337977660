"""Rejection sampling of speculated tokens: the torch reference (the CPU path and the oracle).

A verify step runs the target model on each speculating request's last token and its ``k``
draft tokens, so request ``b`` has ``1 + k_b`` rows of target logits, row ``j`` predicting the
token after draft ``j - 1`` (row 0: after the last accepted token). The sampler walks the drafts
in order and stops at the first rejection:

* **greedy** rows (temperature below ``GREEDY_TEMPERATURE``): draft ``j`` is accepted while it
  equals the argmax of row ``j``; the token after the last accepted draft is the argmax of its
  row (the correction, or the bonus token when every draft was accepted). The emitted tokens are
  therefore exactly the target's greedy tokens.
* **random** rows: the standard lossless rule. With ``p_j`` the target's distribution at row
  ``j`` (logits / T, top-k / top-p applied as the sampler applies them) and ``q_j`` the
  drafter's (``draft_probs``; a one-hot at the draft token for drafters without probabilities,
  as n-gram lookup), draft ``d`` is accepted when ``u < p_j(d) / q_j(d)``; at the first
  rejection the token is drawn from the residual ``max(p_j - q_j, 0)`` (renormalised), and after
  ``k_b`` accepted drafts the bonus token is drawn from ``p_{k_b}``. Emitted tokens then follow
  the target's distribution exactly, whatever the drafter proposes.

Randomness is the sampler's: a pure function of ``(seed, position, token)``. Row ``j`` of request
``b`` is keyed by position ``positions[b] + j`` (``positions`` is the position of the token row 0
samples, as in ``SamplingMetadata``). The accept test reads the uniform at the draft token's
column; the residual and bonus draws are a Gumbel-max over ``log`` of the residual with the
Gumbel noise of that row's key, so a bonus draw (``q = 0``) is the token the plain sampler would
draw from the same logits at that position. Where the residual is empty (``p <= q`` everywhere,
possible only through rounding) the row's most probable token is taken.

Layout: target logits are flattened, ``[R, V]`` with ``R = sum(1 + s_b)`` and ``cu_rows`` [B + 1]
the first row of each request; ``s_b`` is the request's draft slots, its ``k_b`` real drafts
(``num_draft``) and then, when the step padded it up to one k, placeholder slots (``num_slots``
[B]; None: no placeholders, ``s_b = k_b``). Only the real drafts are compared: a placeholder row
verifies nothing, so the walk stops at the first one at the latest and its logits are unused.
Drafts are padded, ``draft_token_ids`` [B, K] with ``num_draft`` [B] valid entries;
``draft_probs`` [B, K, V] or None. The output is ``[B, 1 + K]`` tokens (-1 after the emitted
ones) and ``num_accepted`` [B] (emitted = accepted + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mrv2_prof.runner.worker.sampler import (
    GREEDY_TEMPERATURE,
    SamplingMetadata,
    apply_top_k_top_p,
    gumbel_noise,
    uniform_noise,
)
from mrv2_prof.runner.worker.uva import take  # the parameters may be UVA (pinned host)


@dataclass
class DraftBatch:
    """The drafts of one verify step."""

    cu_rows: torch.Tensor  # [B + 1] int32: first target-logit row of each request
    num_draft: torch.Tensor  # [B] int32: k_b <= K
    draft_token_ids: torch.Tensor  # [B, K] int64, padded (any value past k_b)
    draft_probs: torch.Tensor | None = None  # [B, K, V] float32; None: one-hot drafts
    # [B] int32: k_b <= s_b <= K draft slots (real drafts, then placeholders); None: s_b = k_b
    num_slots: torch.Tensor | None = None
    # [R] each target row's request and its index in the request's rows (the runner builds them
    # on the host with the drafts; None: derived from cu_rows on the device)
    row_req: torch.Tensor | None = None
    row_j: torch.Tensor | None = None


@dataclass
class RejectionOutput:
    output_token_ids: torch.Tensor  # [B, 1 + K] int64: accepted drafts, then one token; -1 after
    num_accepted: torch.Tensor  # [B] int32


def check_layout(logits: torch.Tensor, drafts: DraftBatch) -> None:
    """``cu_rows`` must give each request 1 + s_b rows (s_b = k_b without ``num_slots``) and
    cover ``logits`` exactly (host read: a check for tests and callers off the step loop; the
    runner builds the layout itself)."""
    cu = drafts.cu_rows.tolist()
    k = drafts.num_draft.tolist()
    slots = k if drafts.num_slots is None else drafts.num_slots.tolist()
    num_reqs, max_k = drafts.draft_token_ids.shape
    if len(cu) != num_reqs + 1 or len(k) != num_reqs or cu[0] != 0 or cu[-1] != logits.shape[0]:
        raise ValueError(
            f"rejection sampler: cu_rows {cu[:4]}... does not cover {logits.shape[0]} rows "
            f"of {num_reqs} requests"
        )
    if len(slots) != num_reqs:
        raise ValueError(f"rejection sampler: num_slots has {len(slots)} of {num_reqs} requests")
    for b in range(num_reqs):
        if not 0 <= k[b] <= slots[b] <= max_k or cu[b + 1] - cu[b] != 1 + slots[b]:
            raise ValueError(
                f"rejection sampler: request {b} has {cu[b + 1] - cu[b]} rows for "
                f"{k[b]} drafts in {slots[b]} slots (need 1 + slots, k <= slots <= {max_k})"
            )
    if drafts.draft_probs is not None and drafts.draft_probs.shape != (
        num_reqs,
        max_k,
        logits.shape[1],
    ):
        raise ValueError(
            f"rejection sampler: draft_probs {tuple(drafts.draft_probs.shape)} is not "
            f"[{num_reqs}, {max_k}, {logits.shape[1]}]"
        )


def row_params(
    drafts: DraftBatch, meta: SamplingMetadata, num_rows: int
) -> tuple[torch.Tensor, ...]:
    """For every target row: its request [R], its index j within the request [R], its RNG
    position [R], its slot [R] (``meta.idx_mapping`` of the request), whether it verifies a
    draft [R] (the last row of a request does not) and that draft token [R] (0 where none)."""
    device = drafts.cu_rows.device
    rows = torch.arange(num_rows, device=device)
    request = torch.searchsorted(drafts.cu_rows[1:].long(), rows, right=True)  # [R]
    j = rows - drafts.cu_rows.long()[request]
    max_k = drafts.draft_token_ids.shape[1]
    has_draft = j < drafts.num_draft.long()[request]
    d = drafts.draft_token_ids[request, j.clamp(max=max(max_k - 1, 0))] if max_k else j * 0
    d = torch.where(has_draft, d, 0)
    position = meta.positions.long()[request] + j
    return request, j, position, meta.idx_mapping.long()[request], has_draft, d


def target_probs(logits: torch.Tensor, slot: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """[R, V] float32: each row's sampling distribution (logits / T, top-k / top-p as the
    sampler applies them); greedy rows are divided by 1 (their probabilities are unused)."""
    temperature = take(meta.temperature, slot)
    scaled = (
        logits.float() / torch.where(temperature < GREEDY_TEMPERATURE, 1.0, temperature)[:, None]
    )
    if not (meta.no_top_k and meta.no_top_p):
        scaled = apply_top_k_top_p(
            scaled,
            None if meta.no_top_k else take(meta.top_k, slot),
            None if meta.no_top_p else take(meta.top_p, slot),
        )
    return scaled.softmax(dim=-1)


def rejection_sample(
    logits: torch.Tensor,  # [R, V] target logits
    drafts: DraftBatch,
    meta: SamplingMetadata,  # per request: idx_mapping [B], positions [B]
) -> RejectionOutput:
    num_rows, vocab_size = logits.shape
    num_reqs, max_k = drafts.draft_token_ids.shape
    check_layout(logits, drafts)
    request, j, position, slot, has_draft, d = row_params(drafts, meta, num_rows)
    greedy = take(meta.temperature, slot) < GREEDY_TEMPERATURE  # [R]
    p = target_probs(logits, slot, meta)  # [R, V]
    q = torch.zeros_like(p)  # the drafter's distribution where a row verifies a draft
    if drafts.draft_probs is not None and max_k:
        q = drafts.draft_probs[request, j.clamp(max=max_k - 1)].float()
    else:
        q.scatter_(1, d[:, None], 1.0)
    q = torch.where(has_draft[:, None], q, 0.0)

    # Per row: accept its draft?  Greedy: the draft is the argmax. Random: u < p(d) / q(d).
    argmax = logits.argmax(dim=-1)
    u = uniform_noise(take(meta.seeds, slot), position, vocab_size).gather(1, d[:, None])[:, 0]
    p_d, q_d = p.gather(1, d[:, None])[:, 0], q.gather(1, d[:, None])[:, 0]
    accept = torch.where(greedy, d == argmax, u * q_d < p_d) & has_draft

    # Per row: the token emitted if the walk stops here (residual draw, or bonus with q = 0).
    residual = (p - q).clamp(min=0)
    noise = gumbel_noise(take(meta.seeds, slot), position, vocab_size)
    drawn = torch.where(residual > 0, residual.log() + noise, float("-inf")).argmax(dim=-1)
    drawn = torch.where(residual.amax(dim=-1) > 0, drawn, p.argmax(dim=-1))
    stop_token = torch.where(greedy, argmax, drawn)  # [R]

    out = torch.full((num_reqs, 1 + max_k), -1, dtype=torch.int64, device=logits.device)
    num_accepted = torch.zeros(num_reqs, dtype=torch.int32, device=logits.device)
    cu = drafts.cu_rows.tolist()
    for b in range(num_reqs):  # the reference: one request at a time, in order
        a = 0
        while a < cu[b + 1] - cu[b] - 1 and bool(accept[cu[b] + a]):
            out[b, a] = drafts.draft_token_ids[b, a]
            a += 1
        out[b, a] = stop_token[cu[b] + a]
        num_accepted[b] = a
    return RejectionOutput(out, num_accepted)
