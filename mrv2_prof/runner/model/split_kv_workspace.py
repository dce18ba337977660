"""The split-KV decode kernels' workspace (``attention_split_kv_triton.py`` and its RoPE-fold
form ``attention_split_kv_rope_triton.py``): per device, each split's float32 partials (acc,
max, sum) and the rows' int32 counters of the fused reduction (zero between launches). It grows,
never shrinks, and never during a CUDA graph capture (a capture runs its body once eagerly first,
``cudagraph_runner._capture``); a grown-out buffer is kept, as a captured graph may still read
it. The sampler's workspace (``runner/worker/gumbel_argmax_triton.py``) works the same way.
"""

from __future__ import annotations

import torch


class SplitKVWorkspace:
    """Per device: the split partials (acc, max, sum; float32) and the rows' counters (int32,
    zero between launches). It grows, never shrinks, and never during a CUDA graph capture; a
    grown-out buffer is kept (a captured graph may still read it)."""

    def __init__(self) -> None:
        self.buffers: tuple[torch.Tensor, ...] = ()
        self._kept: list[torch.Tensor] = []

    def get(self, device: torch.device, cells: int, head_dim: int, rows: int):
        """``(acc [>= cells * head_dim], max [>= cells], sum [>= cells], counter [>= rows])``."""
        have = self.buffers
        acc, cells_had, _, rows_had = (t.numel() for t in have) if have else (0, 0, 0, 0)
        if acc >= cells * head_dim and cells_had >= cells and rows_had >= rows:
            return have
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "the split-KV attention workspace grows during a CUDA graph capture: run a "
                "decode batch of this size eagerly before capturing"
            )
        self._kept += list(have)
        cells = max(cells, 2 * cells_had)
        acc = max(cells * head_dim, 2 * acc)
        rows = max(rows, 2 * rows_had)
        self.buffers = (
            torch.empty(acc, dtype=torch.float32, device=device),
            torch.empty(cells, dtype=torch.float32, device=device),
            torch.empty(cells, dtype=torch.float32, device=device),
            torch.zeros(rows, dtype=torch.int32, device=device),
        )
        return self.buffers


workspaces: dict[torch.device, SplitKVWorkspace] = {}


def split_workspace(device: torch.device, cells: int, head_dim: int, rows: int):
    """``(acc [>= cells * head_dim], max [>= cells], sum [>= cells], counter [>= rows])`` of
    ``device``'s workspace, grown to fit."""
    ws = workspaces.get(device)
    if ws is None:
        ws = workspaces[device] = SplitKVWorkspace()
    return ws.get(device, cells, head_dim, rows)
