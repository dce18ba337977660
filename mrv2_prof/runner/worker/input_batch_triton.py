"""GPU-native input prep: one Triton kernel builds the step's inputs (MRV2 ``input_batch.py``).

``prepare_inputs_triton`` has the contract of ``input_batch.prepare_inputs_ref`` (the torch
reference, the CPU path and the oracle in tests): from the persistent request rows, the step's
``idx_mapping`` (batch position -> slot) and ``num_scheduled_tokens`` it writes ``input_ids``,
``positions``, ``query_start_loc``, ``seq_lens``, ``slot_mapping`` and ``logits_indices`` in one
launch, with no host sync and no output shape that depends on device data (``num_tokens`` is the
host's count). Given a ``block_table`` output, the same launch gathers the batch's block-table
rows into it (the gather the attention and the CUDA graphs read), so input prep is one launch.
The launch goes through the cached launcher (``triton_launch``).

One program per batch position. A program finds its query start by summing the counts of the
positions before it (at most ``max_num_reqs`` int32 loads, from L2), so the prefix sum needs no
second launch; then it writes its request's tokens in ``BLOCK_T`` chunks.

The prefill token table is read through a pointer and a row stride only, so the same kernel reads
a pinned host table through a UVA (device-mapped) view of it once the runner passes one, instead
of a device copy.
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.worker.triton_launch import Launcher
from mrv2_prof.runner.worker.uva import is_uva

BLOCK_T = 256  # tokens a program writes per loop iteration
BLOCK_R = 256  # counts summed per loop iteration when finding the query start
BLOCK_C = 256  # block-table columns a program copies per loop iteration


# the counts sit behind idx_mapping in the step's one buffer, at an offset of 4 bytes per
# request: not specialised on alignment, or every batch-size class compiles on the step loop
@triton.jit(do_not_specialize_on_alignment=["num_scheduled_ptr"])
def _prepare_inputs_kernel(
    idx_mapping_ptr,  # [B] batch position -> slot
    num_scheduled_ptr,  # [B]
    num_computed_ptr,  # [R]
    num_prefill_ptr,  # [R]
    prefill_ids_ptr,  # [R, max_model_len], row stride below; may be a UVA view of host memory
    prefill_row_stride,
    last_sampled_ptr,  # [R] int64
    block_table_ptr,  # [R, max_blocks]
    block_table_row_stride,
    input_ids_ptr,  # [T] int64
    positions_ptr,  # [T] int64
    query_start_loc_ptr,  # [B+1] int32
    seq_lens_ptr,  # [B] int32
    slot_mapping_ptr,  # [T] int64
    logits_indices_ptr,  # [B] int64
    table_out_ptr,  # [B, max_blocks]: the batch's block-table rows (COPY_TABLE)
    table_out_row_stride,
    num_table_cols,
    KV_BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    COPY_TABLE: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PAD_EMPTY: tl.constexpr,
):
    b = tl.program_id(0)

    # Query start = sum of the counts of batch positions 0..b-1.
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros([BLOCK_R], dtype=tl.int32)
    for r in range(0, b, BLOCK_R):
        acc += tl.load(num_scheduled_ptr + r + offs_r, mask=r + offs_r < b, other=0).to(tl.int32)
    q_start = tl.sum(acc, axis=0)

    count = tl.load(num_scheduled_ptr + b).to(tl.int32)
    slot = tl.load(idx_mapping_ptr + b).to(tl.int64)
    computed = tl.load(num_computed_ptr + slot).to(tl.int32)
    num_prefill = tl.load(num_prefill_ptr + slot).to(tl.int32)
    last_sampled = tl.load(last_sampled_ptr + slot).to(tl.int64)
    q_end = q_start + count

    if b == 0:
        tl.store(query_start_loc_ptr, q_start)
    tl.store(query_start_loc_ptr + b + 1, q_end)
    tl.store(seq_lens_ptr + b, computed + count)
    tl.store(logits_indices_ptr + b, (q_end - 1).to(tl.int64))

    prefill_row = prefill_ids_ptr + slot * prefill_row_stride
    table_row = block_table_ptr + slot * block_table_row_stride
    if COPY_TABLE:
        out_row = table_out_ptr + b.to(tl.int64) * table_out_row_stride
        offs_c = tl.arange(0, BLOCK_C)
        for c in range(0, num_table_cols, BLOCK_C):
            cols = c + offs_c
            keep = cols < num_table_cols
            tl.store(out_row + cols, tl.load(table_row + cols, mask=keep), mask=keep)
    offs_t = tl.arange(0, BLOCK_T)
    for j in range(0, count, BLOCK_T):
        i = j + offs_t
        mask = i < count
        pos = computed + i
        from_prompt = mask & (pos < num_prefill)
        prompt_ids = tl.load(prefill_row + pos, mask=from_prompt, other=0).to(tl.int64)
        block_ids = tl.load(table_row + pos // KV_BLOCK_SIZE, mask=mask, other=0).to(tl.int64)
        out = q_start + i
        tl.store(input_ids_ptr + out, tl.where(from_prompt, prompt_ids, last_sampled), mask=mask)
        tl.store(positions_ptr + out, pos.to(tl.int64), mask=mask)
        tl.store(
            slot_mapping_ptr + out,
            block_ids * KV_BLOCK_SIZE + (pos % KV_BLOCK_SIZE).to(tl.int64),
            mask=mask,
        )
    if PAD_EMPTY:  # noqa: SIM102 (a constexpr, then a runtime branch)
        # a FULL graph's padding row: one token at row b that writes no KV
        if count == 0:
            tl.store(input_ids_ptr + b, tl.zeros((), tl.int64))
            tl.store(positions_ptr + b, tl.zeros((), tl.int64))
            tl.store(slot_mapping_ptr + b, tl.full((), -1, tl.int64))
            tl.store(seq_lens_ptr + b, tl.full((), 1, tl.int32))


_prepare = Launcher(_prepare_inputs_kernel)


class _Checked:
    """The arguments of the last call whose layout was checked: tensors by identity (held
    weakly), the rest by value. A tensor object keeps its device, dtype and strides unless
    changed in place (``set_``, ``resize_``), which nothing on the step path does."""

    def __init__(self) -> None:
        self._items: tuple = ()

    def same(self, items: tuple) -> bool:
        last = self._items
        if len(last) != len(items):
            return False
        for kept, x in zip(last, items, strict=True):
            if isinstance(kept, weakref.ref):
                if kept() is not x:
                    return False
            elif type(kept) is tuple:  # an out entry: (name, weak tensor)
                if kept[0] != x[0] or kept[1]() is not x[1]:
                    return False
            elif kept != x:
                return False
        return True

    def remember(self, items: tuple) -> None:
        def keep(x):
            if isinstance(x, torch.Tensor):
                return weakref.ref(x)
            if type(x) is tuple:
                return (x[0], weakref.ref(x[1]))
            return x

        self._items = tuple(map(keep, items))


_LAST_CHECKED = _Checked()


def _check_layout(device: torch.device, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.device != device and not (name == "prefill_token_ids" and is_uva(t, device)):
            raise ValueError(f"{name} is on {t.device}, expected {device}")
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have unit stride in its last dimension")


def prepare_inputs_triton(
    idx_mapping: torch.Tensor,  # [B] int32
    num_scheduled_tokens: torch.Tensor,  # [B] int32
    num_tokens: int,  # sum of num_scheduled_tokens, known on the host
    num_computed_tokens: torch.Tensor,  # [R] int32
    num_prefill_tokens: torch.Tensor,  # [R] int32
    prefill_token_ids: torch.Tensor,  # [R, max_model_len] int32, any row stride
    last_sampled_tokens: torch.Tensor,  # [R] int64
    block_table: torch.Tensor,  # [R, max_blocks] int32, any row stride
    block_size: int,
    out: dict[str, torch.Tensor] | None = None,
    pad_empty: bool = False,
) -> dict[str, torch.Tensor]:
    """Build the step's inputs in one launch; same arguments and results as ``prepare_inputs_ref``.

    A token at position p < num_prefill_tokens[slot] comes from ``prefill_token_ids``, later
    positions from ``last_sampled_tokens`` (decode). ``prefill_token_ids`` is only read through
    its data pointer and row stride, so a UVA view of a pinned host table works unchanged.
    ``out`` (``InputBuffers.views``): the kernel writes into these instead of fresh tensors;
    with a ``block_table`` entry [B, max_blocks] it also gathers the batch's table rows into it.
    ``pad_empty`` (a FULL decode graph's padded batch, ``pad_decode_rows_ref``): every row before
    a row with no tokens has one token, and such a row writes a padding token at its own row.
    """
    device = idx_mapping.device
    num_reqs = idx_mapping.shape[0]
    if num_scheduled_tokens.shape != (num_reqs,):
        raise ValueError(
            f"num_scheduled_tokens has shape {tuple(num_scheduled_tokens.shape)}, "
            f"expected ({num_reqs},)"
        )
    _check_layout(device, idx_mapping=idx_mapping, num_scheduled_tokens=num_scheduled_tokens)
    # The persistent tables and the step's buffers are the same objects step after step: they
    # are checked again only when one of them (or the step's sizes) differs from the last call.
    checked = (device, num_tokens, num_reqs, num_computed_tokens, num_prefill_tokens)
    checked += (prefill_token_ids, last_sampled_tokens, block_table, *(out or {}).items())
    if not _LAST_CHECKED.same(checked):
        if prefill_token_ids.dim() != 2 or block_table.dim() != 2:
            raise ValueError("prefill_token_ids and block_table must be 2-D [slots, cols]")
        _check_layout(
            device,
            num_computed_tokens=num_computed_tokens,
            num_prefill_tokens=num_prefill_tokens,
            prefill_token_ids=prefill_token_ids,
            last_sampled_tokens=last_sampled_tokens,
            block_table=block_table,
        )
        if out is not None:
            _check_out(out, num_tokens, num_reqs, device)
            if "block_table" in out:
                _check_table_out(out["block_table"], block_table, num_reqs, device)
        _LAST_CHECKED.remember(checked)
    if out is None:
        out = {
            "input_ids": torch.empty(num_tokens, dtype=torch.int64, device=device),
            "positions": torch.empty(num_tokens, dtype=torch.int64, device=device),
            "query_start_loc": torch.empty(num_reqs + 1, dtype=torch.int32, device=device),
            "seq_lens": torch.empty(num_reqs, dtype=torch.int32, device=device),
            "slot_mapping": torch.empty(num_tokens, dtype=torch.int64, device=device),
            "logits_indices": torch.empty(num_reqs, dtype=torch.int64, device=device),
        }
    input_ids, positions, slot_mapping = out["input_ids"], out["positions"], out["slot_mapping"]
    query_start_loc, seq_lens = out["query_start_loc"], out["seq_lens"]
    logits_indices = out["logits_indices"]
    table_out = out.get("block_table")
    if num_reqs == 0:
        query_start_loc.zero_()
    else:
        _prepare(
            (num_reqs,),
            idx_mapping,
            num_scheduled_tokens,
            num_computed_tokens,
            num_prefill_tokens,
            prefill_token_ids,
            prefill_token_ids.stride(0),
            last_sampled_tokens,
            block_table,
            block_table.stride(0),
            input_ids,
            positions,
            query_start_loc,
            seq_lens,
            slot_mapping,
            logits_indices,
            block_table if table_out is None else table_out,  # unread without COPY_TABLE
            0 if table_out is None else table_out.stride(0),
            block_table.shape[1],
            KV_BLOCK_SIZE=block_size,
            BLOCK_T=BLOCK_T,
            BLOCK_R=BLOCK_R,
            COPY_TABLE=table_out is not None,
            BLOCK_C=BLOCK_C,
            PAD_EMPTY=pad_empty,
        )
    return out


_OUT_LAYOUT = {
    "input_ids": torch.int64,
    "positions": torch.int64,
    "slot_mapping": torch.int64,
    "query_start_loc": torch.int32,
    "seq_lens": torch.int32,
    "logits_indices": torch.int64,
}


def _check_out(out: dict[str, torch.Tensor], num_tokens: int, num_reqs: int, device) -> None:
    for name, dtype in _OUT_LAYOUT.items():
        t = out[name]
        rows = num_reqs + 1 if name == "query_start_loc" else num_reqs
        want = num_tokens if name in ("input_ids", "positions", "slot_mapping") else rows
        if t.shape != (want,) or t.dtype != dtype or t.device != device or not t.is_contiguous():
            raise ValueError(
                f"out[{name!r}] must be a contiguous [{want}] {dtype} tensor on {device}, "
                f"got {tuple(t.shape)} {t.dtype} on {t.device}"
            )


def _check_table_out(t: torch.Tensor, table: torch.Tensor, num_reqs: int, device) -> None:
    want = (num_reqs, table.shape[1])
    if (
        t.shape != want
        or t.dtype != table.dtype
        or t.device != device
        or (t.shape[1] > 1 and t.stride(1) != 1)
    ):
        raise ValueError(
            f"out['block_table'] must be a {list(want)} {table.dtype} tensor on {device} with "
            f"unit column stride, got {tuple(t.shape)} {t.dtype} on {t.device}"
        )
