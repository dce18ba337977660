"""The step's persistent device input buffers (MRV2 ``InputBuffers``): allocated once, written in
place every step, read by the model and by every captured CUDA graph.

``prepare_inputs`` writes ``input_ids``, ``positions``, ``slot_mapping``, ``seq_lens``,
``query_start_loc`` and ``logits_indices`` of a step into the first rows of these buffers, and
the block-table gather writes ``block_table``; the CUDA graphs are captured over views of the
same buffers (``cudagraph_runner.GraphRunner``), so a replay reads the step's inputs where they
were built, with no copy into static buffers and no allocation on the step path. Reuse is safe
because every writer and reader of a buffer is on the runner's one stream: step N+1's inputs are
written only after step N's kernels have read theirs. A FULL graph keeps its own
``query_start_loc`` (one token per row, padding included), which no step writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_MAX_CACHED_VIEWS = 64  # step sizes whose views are kept (a decode run reuses one or two)


@dataclass
class InputBuffers:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64 (-1: write nothing)
    query_start_loc: torch.Tensor  # [R + 1] int32
    seq_lens: torch.Tensor  # [R] int32
    logits_indices: torch.Tensor  # [R] int64
    block_table: torch.Tensor  # [R, max_blocks] int32
    # (num_tokens, num_reqs, block_table) -> the views of a step of those sizes
    _views: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def allocate(
        cls, max_tokens: int, max_reqs: int, max_blocks: int, device: torch.device
    ) -> InputBuffers:
        def tokens(fill: int) -> torch.Tensor:
            return torch.full((max_tokens,), fill, dtype=torch.int64, device=device)

        return cls(
            input_ids=tokens(0),
            positions=tokens(0),
            slot_mapping=tokens(-1),
            query_start_loc=torch.zeros(max_reqs + 1, dtype=torch.int32, device=device),
            seq_lens=torch.ones(max_reqs, dtype=torch.int32, device=device),
            logits_indices=torch.zeros(max_reqs, dtype=torch.int64, device=device),
            block_table=torch.zeros((max_reqs, max_blocks), dtype=torch.int32, device=device),
        )

    @property
    def max_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def max_reqs(self) -> int:
        return self.seq_lens.shape[0]

    def views(
        self, num_tokens: int, num_reqs: int, block_table: bool = False
    ) -> dict[str, torch.Tensor]:
        """The first rows a step of ``num_tokens`` tokens over ``num_reqs`` requests writes;
        with ``block_table``, also the batch's block-table rows (input prep gathers them)."""
        key = (num_tokens, num_reqs, block_table)
        cached = self._views.get(key)
        if cached is not None:  # the same sizes as an earlier step: the same view objects
            return dict(cached)
        if num_tokens > self.max_tokens or num_reqs > self.max_reqs:
            raise ValueError(
                f"a step of {num_tokens} tokens / {num_reqs} requests exceeds the input buffers "
                f"({self.max_tokens} / {self.max_reqs})"
            )
        views = {
            "input_ids": self.input_ids[:num_tokens],
            "positions": self.positions[:num_tokens],
            "slot_mapping": self.slot_mapping[:num_tokens],
            "query_start_loc": self.query_start_loc[: num_reqs + 1],
            "seq_lens": self.seq_lens[:num_reqs],
            "logits_indices": self.logits_indices[:num_reqs],
        }
        if block_table:
            views["block_table"] = self.block_table[:num_reqs]
        if len(self._views) >= _MAX_CACHED_VIEWS:
            self._views.clear()
        self._views[key] = views
        return dict(views)
