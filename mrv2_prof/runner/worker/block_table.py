"""Block tables: a row of KV block ids per request slot, on the device (MRV2 ``block_table.py``).

New blocks are appended with staged writes; a step gathers its rows through ``idx_mapping``.
"""

from __future__ import annotations

import numpy as np
import torch

from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.staged_write import (
    ApplyFn,
    StagedWriteTensor,
    WriteStats,
    make_write_tensor,
)


class BlockTables:
    def __init__(
        self,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        device: torch.device,
        staged: bool,
        apply_fn: ApplyFn | None = None,
        copies: CopyAudit | None = None,
    ) -> None:
        self.table = make_write_tensor(
            (max_num_reqs, max_num_blocks_per_req), torch.int32, device, staged, apply_fn, copies
        )
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)  # blocks held per slot (CPU)

    def set_row(self, slot: int, block_ids: list[int]) -> None:
        self.num_blocks[slot] = 0
        self.append(slot, block_ids)

    def append(self, slot: int, block_ids: list[int]) -> None:
        if block_ids:
            self.table.stage_write(slot, int(self.num_blocks[slot]), block_ids)
            self.num_blocks[slot] += len(block_ids)

    def apply_write(self) -> WriteStats | None:
        return self.table.apply_write()

    def take_appends(self, limit: int) -> tuple[list[int], WriteStats | None] | None:
        """This step's writes as ``row, column, block`` triples for the full step's graph to
        apply (``StagedWriteTensor.take_singles``); None: not that form (dense tables, a new
        row, more than ``limit``), apply them with ``apply_write``."""
        if not isinstance(self.table, StagedWriteTensor):
            return None
        return self.table.take_singles(limit)

    def gather(
        self, idx_mapping: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:  # [B, max_blocks]
        """The batch's rows (``idx_mapping`` int32 or int64), into ``out`` when given."""
        if out is None:
            return torch.index_select(self.table.gpu, 0, idx_mapping)
        return torch.index_select(self.table.gpu, 0, idx_mapping, out=out)
