"""The CUDA graph backend (CUDA only): static input buffers, capture and replay.

``GraphRunner`` is the ``GraphBackend`` that ``CudaGraphManager.capture`` drives. Static input
buffers are allocated once at the largest capture size and shared by every graph (each graph
reads views of their first rows); all graphs share one memory pool and are captured largest
first. Each body runs once outside the graph before its capture (cuBLAS workspaces,
autotuning). What the graphs run, the model calls, comes from ``cudagraph_bodies.py``.

A FULL replay pads the batch up to the capture size: padding rows get KV slot -1 (the KV write
skips them) and a one-token context in block 0. A PIECEWISE replay whose segments write the KV
cache pads the slots with -1 the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.worker.cudagraph_bodies import PiecewiseBody, full_body
from mrv2_prof.runner.worker.cudagraph_manager import GraphBackend, GraphPlan
from mrv2_prof.runner.worker.input_batch import InputBatch


def _capture(body: Callable[[], None], pool) -> torch.cuda.CUDAGraph:
    body()  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        body()
    return graph


class GraphRunner(GraphBackend):
    """Static buffers, captured graphs and their replay for one model and KV cache (CUDA)."""

    def __init__(
        self,
        model,
        kv_caches: list[torch.Tensor],
        block_size: int,
        max_blocks_per_req: int,
        plan: GraphPlan,
    ) -> None:
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        dev = kv_caches[0].device
        self.device = dev
        n = max((*plan.full_sizes, *plan.piecewise_sizes), default=1)
        nf = max(plan.full_sizes, default=1)

        # Inputs, shared by every graph (views of the first rows).
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        # FULL: one token per request; padding rows attend to one token of block 0.
        self.seq_lens = torch.ones(nf, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(nf + 1, dtype=torch.int32, device=dev)
        self.block_table = torch.zeros((nf, max_blocks_per_req), dtype=torch.int32, device=dev)
        self.logits = torch.zeros(
            (nf if plan.full_sizes else 0, model.args.vocab_size),
            dtype=model.lm_head_weight.dtype,
            device=dev,
        )
        self.piecewise = PiecewiseBody(
            model, kv_caches, n if plan.piecewise_sizes else 0, self.slot_mapping
        )
        self.full_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.piece_graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}

    # ---- GraphBackend ----------------------------------------------------------------------
    def new_pool(self):
        return torch.cuda.graph_pool_handle()

    def memory_reserved(self) -> int:
        """Reserved bytes net of the allocator's cache: live tensors plus the graph pools.
        (Each capture empties the cache on entry, so raw reserved bytes can even fall.)"""
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved(self.device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def _full_meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_reqs=size,
            num_tokens=size,
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_table=self.block_table[:size],
            slot_mapping=self.slot_mapping[:size],
            query_start_loc_np=np.arange(size + 1, dtype=np.int32),
            seq_lens_np=np.ones(size, dtype=np.int32),
            block_size=self.block_size,
        )

    def capture_full(self, size: int, pool) -> None:
        self.slot_mapping[:size].fill_(-1)  # capture writes nothing to the KV cache
        meta = self._full_meta(size)

        def body() -> None:
            full_body(
                self.model,
                self.kv_caches,
                self.input_ids[:size],
                self.positions[:size],
                meta,
                self.logits[:size],
            )

        self.full_graphs[size] = _capture(body, pool)

    def capture_piecewise(self, size: int, pool) -> None:
        self.slot_mapping[:size].fill_(-1)  # capture writes nothing to the KV cache
        segments = self.piecewise.segments(self.input_ids, self.positions, size)
        self.piece_graphs[size] = [_capture(segment, pool) for segment in segments]

    # ---- replay ------------------------------------------------------------------------------
    def replay_full(self, size: int, batch: InputBatch) -> torch.Tensor:
        """Logits [B, V] of a uniform decode batch of B <= size requests."""
        n = batch.num_reqs
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.block_table[:n].copy_(batch.block_table)
        if size > n:  # padding: write nothing, attend to one token
            self.slot_mapping[n:size].fill_(-1)
            self.seq_lens[n:size].fill_(1)
        self.full_graphs[size].replay()
        return self.logits[:n]

    def run_piecewise(self, size: int, batch: InputBatch, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [T, H] of any batch of T <= size tokens; attention runs eagerly."""
        t = batch.num_tokens
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        if self.piecewise.kv_in_segments:  # the segments write the KV cache: padding writes none
            self.slot_mapping[:t].copy_(batch.slot_mapping)
            if size > t:
                self.slot_mapping[t:size].fill_(-1)
        replays = [graph.replay for graph in self.piece_graphs[size]]
        return self.piecewise.run(replays, t, meta)
