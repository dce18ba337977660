"""N-gram drafts on the device: ``ngram_proposer.propose`` for a batch of request slots.

Each request slot's token history (prompt + output) lives in a device table ``history [R, L]``
(positions ``0 .. len - 1`` valid); a step's drafts go into per-slot buffers ``out_tokens [R, K]``
and ``out_num [R]``, so drafting needs no host round trip. Row ``b`` of the batch drafts for slot
``slots[b]`` from its first ``lengths[b]`` tokens, and gets exactly ``propose``'s answer: the
longest ``n`` in ``[min_n, max_n]`` whose suffix n-gram occurred earlier with a token after it
wins, the right-most such occurrence among them, and the up-to-``k`` tokens after it (cut at the
history's end) are the drafts. ``out_tokens[s, :m]`` takes the ``m`` drafts and ``out_num[s]``
takes ``m`` (0: no match, or an inactive row); ``out_tokens[s, m:]`` keeps what it held. The
slots of a batch's active rows are distinct and no inactive row shares one of them; inactive rows
may share a slot among themselves (padding rows pointing at a sink slot): each writes 0 there.

``ngram_propose_ref`` is the torch reference, vectorised over the batch (a loop over ``n`` only)
and free of data-dependent host synchronisation, so it also runs on CUDA (and under a CUDA
graph's capture) as is; ``ngram_propose_triton`` (``ngram_triton.py``) is one launch.
``ngram_propose`` picks one of the two.
"""

from __future__ import annotations

import torch


def check_args(
    history: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    active: torch.Tensor,
    k: int,
    min_n: int,
    max_n: int,
    out_tokens: torch.Tensor,
    out_num: torch.Tensor,
) -> None:
    """Shape and window checks shared by the reference and the kernel (host values only)."""
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"ngram window [{min_n}, {max_n}] needs 1 <= min <= max")
    if k < 0:
        raise ValueError(f"k is {k}, needs k >= 0")
    if history.dim() != 2:
        raise ValueError(f"history has shape {tuple(history.shape)}, expected [R, L]")
    num_rows = slots.shape[0]
    for name, t in (("slots", slots), ("lengths", lengths), ("active", active)):
        if t.shape != (num_rows,):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({num_rows},)")
    num_slots = history.shape[0]
    if out_tokens.dim() != 2 or out_tokens.shape[0] != num_slots or out_tokens.shape[1] < k:
        raise ValueError(
            f"out_tokens has shape {tuple(out_tokens.shape)}, expected ({num_slots}, >= {k})"
        )
    if out_num.shape != (num_slots,):
        raise ValueError(f"out_num has shape {tuple(out_num.shape)}, expected ({num_slots},)")


def ngram_propose_ref(
    history: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    active: torch.Tensor,
    k: int,
    min_n: int,
    max_n: int,
    out_tokens: torch.Tensor,
    out_num: torch.Tensor,
) -> None:
    """The drafts of each active row into its slot's ``out_tokens`` / ``out_num`` (see above).

    ``history`` [R, L] int32; ``slots`` and ``lengths`` [B] int32 or int64 (a length over ``L``
    counts as ``L``); ``active`` [B] bool; ``out_tokens`` [R, K >= k] int64; ``out_num`` [R]
    int32. Per ``n`` from ``max_n`` down: every window start of each row's history is compared
    with the row's last ``n`` tokens, starts with no token after the window are masked, and the
    largest matching start is kept for rows no longer ``n`` matched. Costs O(B * L * n) per n.
    """
    check_args(history, slots, lengths, active, k, min_n, max_n, out_tokens, out_num)
    num_rows = slots.shape[0]
    if num_rows == 0:
        return
    seq_len = history.shape[1]
    slot_idx = slots.long()
    rows = history[slot_idx]  # [B, L]
    length = torch.where(active, lengths.long().clamp(0, seq_len), 0)  # inactive: no match
    start = torch.full((num_rows,), -1, dtype=torch.long, device=history.device)
    found_n = torch.zeros_like(start)
    # n >= L: no row has a token after a window of n (a row with len <= n never matches)
    for n in range(min(max_n, seq_len - 1), min_n - 1, -1):
        num_windows = seq_len - n  # starts 0 .. L - n - 1, each with a position after it
        suffix_pos = (length - n).clamp(min=0)[:, None] + torch.arange(n, device=history.device)
        suffix = rows.gather(1, suffix_pos.clamp(max=seq_len - 1))  # [B, n]
        hit = torch.ones((num_rows, num_windows), dtype=torch.bool, device=history.device)
        for j in range(n):
            hit &= rows[:, j : j + num_windows] == suffix[:, j : j + 1]
        starts = torch.arange(num_windows, device=history.device)
        hit &= starts[None, :] <= (length - 1 - n)[:, None]  # a token after it, in the history
        best = torch.where(hit, starts[None, :], -1).amax(dim=1)
        take = (start < 0) & (best >= 0)  # rows a longer n matched keep theirs
        start = torch.where(take, best, start)
        found_n = torch.where(take, n, found_n)
    first = start + found_n  # the first draft's position
    num = torch.where(start >= 0, (length - first).clamp(0, k), 0)
    out_num[slot_idx] = num.to(out_num.dtype)
    if k == 0:
        return
    offsets = torch.arange(k, device=history.device)
    pos = (first[:, None] + offsets).clamp(0, seq_len - 1)
    drafts = rows.gather(1, pos).to(out_tokens.dtype)
    keep = out_tokens[slot_idx, :k]
    out_tokens[slot_idx, :k] = torch.where(offsets[None, :] < num[:, None], drafts, keep)


def ngram_propose(
    history: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    active: torch.Tensor,
    k: int,
    min_n: int,
    max_n: int,
    out_tokens: torch.Tensor,
    out_num: torch.Tensor,
    triton: bool,
) -> None:
    """``ngram_propose_triton`` when ``triton``, else ``ngram_propose_ref`` (same contract)."""
    if triton:
        from mrv2_prof.runner.spec_decode.ngram_triton import ngram_propose_triton

        ngram_propose_triton(history, slots, lengths, active, k, min_n, max_n, out_tokens, out_num)
    else:
        ngram_propose_ref(history, slots, lengths, active, k, min_n, max_n, out_tokens, out_num)
