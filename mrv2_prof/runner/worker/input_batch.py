"""Per-step model inputs gathered from persistent state (MRV2 ``input_batch.py``).

The CPU sends only the small per-step arrays (``idx_mapping`` and the number of tokens scheduled
per request, packed into one fresh pinned buffer); ``input_ids``, ``positions``,
``query_start_loc``, ``seq_lens``, ``slot_mapping`` and ``logits_indices`` are built on the
device from the request slots and block tables. ``prepare_inputs_ref`` is the torch reference
(the CPU path, and the oracle for the Triton kernel).

``dummy_batch`` is the batch of the start-up runs (profiling, warm-up): fresh prefills over
slots 0..B-1 that read, but never write, any request state; a profiling run's says so, for the
attention (``AttentionMetadata.profiling``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.worker.block_table import BlockTables


@dataclass
class InputBatch:
    req_ids: list[str]
    num_reqs: int
    num_tokens: int
    idx_mapping_np: np.ndarray  # [B] batch position -> request slot
    num_scheduled_tokens_np: np.ndarray  # [B]
    query_start_loc_np: np.ndarray  # [B+1]
    seq_lens_np: np.ndarray  # [B]
    idx_mapping: torch.Tensor  # [B] int32
    num_scheduled_tokens: torch.Tensor  # [B] int32
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32
    slot_mapping: torch.Tensor  # [T] int64
    logits_indices: torch.Tensor  # [B] int64
    block_table: torch.Tensor  # [B, max_blocks] int32
    profiling: bool = False  # a start-up profiling run's (AttentionMetadata.profiling)

    def attn_metadata(self, block_size: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_reqs=self.num_reqs,
            num_tokens=self.num_tokens,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            block_table=self.block_table,
            slot_mapping=self.slot_mapping,
            query_start_loc_np=self.query_start_loc_np,
            seq_lens_np=self.seq_lens_np,
            block_size=block_size,
            profiling=self.profiling,
        )


def prepare_inputs_ref(
    idx_mapping: torch.Tensor,  # [B] int32
    num_scheduled_tokens: torch.Tensor,  # [B] int32
    num_tokens: int,  # sum of num_scheduled_tokens, known on the host
    num_computed_tokens: torch.Tensor,  # [R] int32
    num_prefill_tokens: torch.Tensor,  # [R] int32
    prefill_token_ids: torch.Tensor,  # [R, max_model_len] int32
    last_sampled_tokens: torch.Tensor,  # [R] int64
    block_table: torch.Tensor,  # [R, max_blocks] int32
    block_size: int,
    out: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Build the step's inputs; a token at position p < num_prefill_tokens comes from the
    request's known tokens, later positions from the last sampled token (decode). ``out``
    (``InputBuffers.views``): tensors to write them into, returned in their place; when it has a
    ``block_table`` [B, max_blocks], the batch's rows of ``block_table`` are gathered into it."""
    device = idx_mapping.device
    num_reqs = idx_mapping.shape[0]
    slots = idx_mapping.long()
    counts = num_scheduled_tokens.long()
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=query_start_loc[1:])
    token_req = torch.repeat_interleave(
        torch.arange(num_reqs, device=device), counts, output_size=num_tokens
    )  # [T] batch position of each token
    token_slot = slots[token_req]  # [T]
    computed = num_computed_tokens.long()
    positions = computed[token_slot] + (
        torch.arange(num_tokens, device=device) - query_start_loc[token_req]
    )
    from_prompt = positions < num_prefill_tokens.long()[token_slot]
    max_len = prefill_token_ids.shape[1]
    prompt_ids = prefill_token_ids[token_slot, positions.clamp(max=max_len - 1)].long()
    input_ids = torch.where(from_prompt, prompt_ids, last_sampled_tokens[token_slot])
    block_ids = block_table[token_slot, positions // block_size].long()
    slot_mapping = block_ids * block_size + positions % block_size
    seq_lens = computed[slots] + counts
    built = {
        "input_ids": input_ids,
        "positions": positions,
        "query_start_loc": query_start_loc.to(torch.int32),
        "seq_lens": seq_lens.to(torch.int32),
        "slot_mapping": slot_mapping,
        "logits_indices": query_start_loc[1:] - 1,
    }
    if out is None:
        return built
    for name, t in built.items():
        out[name].copy_(t)
    if "block_table" in out:
        torch.index_select(block_table, 0, idx_mapping, out=out["block_table"])
    return out


def pad_decode_rows_ref(out: dict[str, torch.Tensor], num_scheduled_tokens: torch.Tensor) -> None:
    """A FULL decode graph's padding (``prepare_inputs_triton(pad_empty=True)``): each row with
    no tokens, all after the batch's one-token rows, gets a token at its own row that writes no
    KV (input 0, position 0, slot -1) and attends to one token (seq_len 1)."""
    pad = num_scheduled_tokens == 0
    rows = pad.nonzero().flatten()
    out["input_ids"][rows] = 0
    out["positions"][rows] = 0
    out["slot_mapping"][rows] = -1
    out["seq_lens"][rows] = 1


def dummy_batch(
    num_tokens: int,
    num_reqs: int,
    max_num_reqs: int,
    device: torch.device,
    block_tables: BlockTables,
    profiling: bool = False,
) -> InputBatch:
    """``num_tokens`` spread evenly over ``num_reqs`` fresh prefills in slots 0..B-1; every
    token's KV slot is -1, so a forward pass over it writes nothing to the cache. ``profiling``:
    the batch of a start-up profiling run (``AttentionMetadata.profiling``)."""
    counts_np = np.array(
        [num_tokens // num_reqs + (i < num_tokens % num_reqs) for i in range(num_reqs)],
        dtype=np.int32,
    )
    qsl_np = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(counts_np, out=qsl_np[1:])
    idx_np = (np.arange(num_reqs) % max_num_reqs).astype(np.int32)
    positions = np.concatenate([np.arange(n) for n in counts_np])
    dev = device

    def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=dev, dtype=dtype)

    idx_mapping = t(idx_np, torch.int32)
    return InputBatch(
        req_ids=[f"dummy-{i}" for i in range(num_reqs)],
        num_reqs=num_reqs,
        num_tokens=num_tokens,
        idx_mapping_np=idx_np,
        num_scheduled_tokens_np=counts_np,
        query_start_loc_np=qsl_np,
        seq_lens_np=counts_np.copy(),
        idx_mapping=idx_mapping,
        num_scheduled_tokens=t(counts_np, torch.int32),
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=dev),
        positions=t(positions, torch.int64),
        query_start_loc=t(qsl_np, torch.int32),
        seq_lens=t(counts_np, torch.int32),
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=dev),
        logits_indices=t(qsl_np[1:] - 1, torch.int64),
        block_table=block_tables.gather(idx_mapping),
        profiling=profiling,
    )
