"""The split-KV decode kernels' workspace (``attention_split_kv_triton.py`` and its RoPE-fold
form ``attention_split_kv_rope_triton.py``): per device, each split's float32 partials (acc,
max, sum) and the rows' int32 counters of the fused reduction (zero between launches), a
``kernel_workspace.KernelWorkspace`` (grows, never shrinks, never during a CUDA graph capture).
"""

from __future__ import annotations

import torch

from mrv2_prof.runner.model.kernel_workspace import KernelWorkspace


def make(device: torch.device, acc: int, cells: int, rows: int) -> tuple[torch.Tensor, ...]:
    """``(acc [acc], max [cells], sum [cells]`` float32, ``counter [rows]`` int32 zeros)."""
    return (
        torch.empty(acc, dtype=torch.float32, device=device),
        torch.empty(cells, dtype=torch.float32, device=device),
        torch.empty(cells, dtype=torch.float32, device=device),
        torch.zeros(rows, dtype=torch.int32, device=device),
    )


WORKSPACE = KernelWorkspace(
    "the split-KV attention workspace", "run a decode batch of this size eagerly", make
)


def split_workspace(device: torch.device, cells: int, head_dim: int, rows: int):
    """``(acc [>= cells * head_dim], max [>= cells], sum [>= cells], counter [>= rows])`` of
    ``device``'s workspace, grown to fit."""
    return WORKSPACE.get(device, cells * head_dim, cells, rows)
