"""The decoder tests' forwards: seeded prompts, attention metadata over a paged cache, a model's
logits for one fresh prefill, transformers' logits for the same tokens, a checkpoint loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.loader import load_model

CPU = torch.device("cpu")
ATOL_HF = 1e-4  # float32, ours vs transformers (different op order in attention)
ATOL_SELF = 1e-5  # float32, ours vs ours with a different chunking/batching
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,  # with head_dim 16 this hits all three bands
}


def prompt(n: int, vocab_size: int = 256, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    slot_mapping: list[int],
    block_size: int,
) -> AttentionMetadata:
    query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    width = max(len(row) for row in block_tables)
    table = [row + [0] * (width - len(row)) for row in block_tables]
    return AttentionMetadata(
        num_reqs=len(query_lens),
        num_tokens=int(query_start_loc[-1]),
        query_start_loc=torch.from_numpy(query_start_loc),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=torch.tensor(table, dtype=torch.int32),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64),
        query_start_loc_np=query_start_loc,
        seq_lens_np=np.array(seq_lens, dtype=np.int32),
        block_size=block_size,
    )


def slots(blocks: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions [start, end) of a request whose block-table row is ``blocks``."""
    return [blocks[p // block_size] * block_size + p % block_size for p in range(start, end)]


def one_shot_logits(model, ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
    """All-token logits of ``ids`` as one fresh prefill without a KV cache."""
    n = len(ids)
    meta = metadata([n], [n], [[0]], [0] * n, block_size=16)
    positions = torch.arange(start_pos, start_pos + n, device=ids.device)
    with torch.no_grad():
        return model.compute_logits(model(ids, positions, None, meta))


def hf_logits(path: Path, ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    positions = torch.arange(start_pos, start_pos + len(ids))[None]
    with torch.no_grad():
        return hf(input_ids=ids[None], position_ids=positions).logits[0].float()


def load(path: Path, dtype: torch.dtype = torch.float32, device: torch.device = CPU):
    return load_model(ModelSpec(preset=None, path=str(path)), device, dtype)
