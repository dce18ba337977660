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
graph's capture) as is; ``ngram_triton.py``'s step kernel runs the same search in one launch.

``ngram_step_ref`` is a whole step of ``DeviceDrafts.after_step`` for ``method: ngram``: each
batch row appends the tokens it emitted to its slot's history, then drafts
(``ngram_propose_ref``) from it. Its tables carry a sink: ``history [R + 1, L + 1]`` (column
``L`` takes the writes a row masks off, row ``R`` is never a real slot) and ``out_tokens
[R + 1, K]`` / ``out_num [R + 1]`` (padding rows write to row ``R``). Per row ``b`` (slot
``s``, prompt ``p = prompt_lens[s]``, sequence length ``seq`` after the step):

* a padding row (``counts[b] == 0``) writes ``out_num[R] = 0`` and nothing else;
* the row's tokens start at ``first = seq - num_slots[b]`` (``seq`` for a plain step) and it
  emitted ``ne = num_accepted[b] + 1`` of them (1 for a plain step), ``emitted[b, :ne]``;
* ``first >= p`` (a decode, a verify, a prompt's final chunk): it is *active*: the tokens go to
  ``history[s, first : first + ne]`` and it drafts from ``history[s, : first + ne]``;
* ``seq == p - 1`` (a prompt chunk leaving one prompt token, which the scheduler verifies
  next): it drafts from the whole prompt, ``history[s, :p]``, and writes no history;
* any other row (a prompt chunk before that) writes ``out_num[s] = 0`` and no history.

What the sink column holds afterwards is unspecified (the reference sends its masked writes
there); a row whose tokens reach column ``L`` (a request emitting past ``max_model_len``, which
it finishes with) drafts from a history that includes that column. ``ngram_step_triton`` does
the step in one launch; ``ngram_step`` picks one of the two.
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
    """``ngram_propose_ref``'s shape and window checks (host values only)."""
    check_table(history, k, min_n, max_n, out_tokens, out_num)
    check_rows(slots=slots, lengths=lengths, active=active)


def check_rows(**rows: torch.Tensor) -> None:
    """Each tensor of ``rows`` (by name) has shape ``[B]``, ``B`` from the first."""
    num_rows = next(iter(rows.values())).shape[0]
    for name, t in rows.items():
        if t.shape != (num_rows,):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({num_rows},)")


def check_table(
    history: torch.Tensor,
    k: int,
    min_n: int,
    max_n: int,
    out_tokens: torch.Tensor,
    out_num: torch.Tensor,
) -> None:
    """The window, ``k`` and the per-slot tables' shapes."""
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"ngram window [{min_n}, {max_n}] needs 1 <= min <= max")
    if k < 0:
        raise ValueError(f"k is {k}, needs k >= 0")
    if history.dim() != 2:
        raise ValueError(f"history has shape {tuple(history.shape)}, expected [R, L]")
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


def check_step_args(
    history: torch.Tensor,
    out_tokens: torch.Tensor,
    out_num: torch.Tensor,
    slots: torch.Tensor,
    counts: torch.Tensor,
    seq_lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    emitted: torch.Tensor,
    num_accepted: torch.Tensor | None,
    num_slots: torch.Tensor | None,
    k: int,
    min_n: int,
    max_n: int,
) -> None:
    """``ngram_step``'s shape and window checks (host values only)."""
    if history.dim() != 2 or history.shape[0] < 1 or history.shape[1] < 2:
        raise ValueError(f"history has shape {tuple(history.shape)}, expected [R + 1, L + 1]")
    check_table(history, k, min_n, max_n, out_tokens, out_num)
    check_rows(slots=slots, counts=counts, seq_lens=seq_lens)
    num_rows = slots.shape[0]
    if emitted.dim() != 2 or emitted.shape[0] != num_rows or emitted.shape[1] < 1:
        raise ValueError(f"emitted has shape {tuple(emitted.shape)}, expected ({num_rows}, >= 1)")
    if (num_accepted is None) != (num_slots is None):
        raise ValueError("num_accepted and num_slots go together (a verify step) or not at all")
    if num_slots is None and emitted.shape[1] != 1:
        raise ValueError(f"emitted has shape {tuple(emitted.shape)}, a plain step emits one")
    if num_slots is not None:
        check_rows(slots=slots, num_accepted=num_accepted, num_slots=num_slots)
    sink = history.shape[0] - 1
    if prompt_lens.shape != (sink,):
        raise ValueError(f"prompt_lens has shape {tuple(prompt_lens.shape)}, expected ({sink},)")


def ngram_step_ref(
    history: torch.Tensor,
    out_tokens: torch.Tensor,
    out_num: torch.Tensor,
    slots: torch.Tensor,
    counts: torch.Tensor,
    seq_lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    emitted: torch.Tensor,
    num_accepted: torch.Tensor | None,
    num_slots: torch.Tensor | None,
    k: int,
    min_n: int,
    max_n: int,
) -> None:
    """A step's history appends and drafts (see the module docstring), vectorised.

    ``history`` [R + 1, L + 1] int32; ``out_tokens`` [R + 1, K >= k] int64; ``out_num`` [R + 1]
    int32; ``slots`` [B] int (a real row's slot < R, real rows' slots distinct; a padding row's
    is not read); ``counts`` [B] int (the tokens the row computed, 0: padding); ``seq_lens`` [B]
    int; ``prompt_lens`` [R] int; ``emitted`` [B, E] int64; ``num_accepted`` and ``num_slots``
    [B] int for a verify step (``num_accepted <= min(num_slots, E - 1)``), both None for a plain
    one (``E == 1``). No host synchronisation.
    """
    check_step_args(
        history, out_tokens, out_num, slots, counts, seq_lens, prompt_lens, emitted,
        num_accepted, num_slots, k, min_n, max_n,
    )  # fmt: skip
    num_rows = slots.shape[0]
    if num_rows == 0:
        return
    sink, sink_col = history.shape[0] - 1, history.shape[1] - 1
    slot = slots.long()
    seq = seq_lens.long()
    real = counts > 0
    if num_slots is None:  # one token each, at the position after the row's last
        first, num_emitted = seq, torch.ones_like(seq)
    else:
        first = seq - num_slots.long()
        num_emitted = num_accepted.long() + 1
    prompt = prompt_lens[torch.where(real, slot, 0)].long()  # a padding row's slot is not read
    active = (first >= prompt) & real  # emitted past its prompt
    target = torch.where(real, slot, sink)
    offsets = torch.arange(emitted.shape[1], device=history.device)
    keep = active[:, None] & (offsets[None, :] < num_emitted[:, None])
    cols = torch.where(keep, first[:, None] + offsets, sink_col)  # masked: the sink column
    rows = torch.where(active, slot, 0)[:, None].expand_as(cols)
    history.index_put_((rows, cols), emitted.to(torch.int32))
    last = real & (seq == prompt - 1)  # drafts from the whole prompt
    length = torch.where(last, prompt, first + num_emitted)
    ngram_propose_ref(history, target, length, active | last, k, min_n, max_n, out_tokens, out_num)


def ngram_step(
    history: torch.Tensor,
    out_tokens: torch.Tensor,
    out_num: torch.Tensor,
    slots: torch.Tensor,
    counts: torch.Tensor,
    seq_lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    emitted: torch.Tensor,
    num_accepted: torch.Tensor | None,
    num_slots: torch.Tensor | None,
    k: int,
    min_n: int,
    max_n: int,
    triton: bool,
) -> None:
    """``ngram_step_triton`` when ``triton``, else ``ngram_step_ref`` (same contract)."""
    args = (
        history, out_tokens, out_num, slots, counts, seq_lens, prompt_lens, emitted,
        num_accepted, num_slots, k, min_n, max_n,
    )  # fmt: skip
    if triton:
        from mrv2_prof.runner.worker.spec_decode.ngram_triton import ngram_step_triton

        ngram_step_triton(*args)
    else:
        ngram_step_ref(*args)
