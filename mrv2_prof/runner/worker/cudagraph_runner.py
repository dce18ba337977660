"""The CUDA graph backend (CUDA only): static input buffers, capture and replay.

``GraphRunner`` is the ``GraphBackend`` that ``CudaGraphManager.capture`` drives. The graphs'
static inputs are the runner's persistent ``InputBuffers`` (each graph reads views of their first
rows), the buffers the step's input preparation writes in place: a replay copies nothing in. Only
a FULL graph's ``query_start_loc`` (one token a row) is its own. All graphs share one memory pool
and are captured largest first. Each body runs once outside the graph before its capture
(cuBLAS workspaces, autotuning). What the graphs run, the model calls, comes from
``cudagraph_bodies.py``.

With a ``FullStep`` each FULL decode graph also builds the step's inputs from its static step
buffer, and a second graph of the same size samples and advances the state (``full_step.py``).

A FULL verify graph (speculative decoding) is the FULL body over ``size`` requests of
``query_len`` tokens each, with its own static ``query_start_loc`` (multiples of ``query_len``);
its logits cover every token. A FULL replay pads the batch up to the capture size: padding rows
get KV slot -1 (the KV write skips them) and a one-token context in block 0 (a verify graph's
padding attends to its own tokens). A PIECEWISE replay whose segments write the KV
cache pads the slots with -1 the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.worker.cudagraph_bodies import PiecewiseBody, full_body
from mrv2_prof.runner.worker.cudagraph_manager import GraphBackend
from mrv2_prof.runner.worker.cudagraph_plan import GraphPlan
from mrv2_prof.runner.worker.full_step import FullStep
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.input_buffers import InputBuffers


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
        inputs: InputBuffers,
        full_step: FullStep | None = None,
    ) -> None:
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.full_step = full_step  # FULL decode graphs that build inputs and sample (full_step.py)
        dev = kv_caches[0].device
        self.device = dev
        verify_tokens = [s * q for s, q in plan.verify_shapes]
        n = max((*plan.full_sizes, *plan.piecewise_sizes, *verify_tokens), default=1)
        nf = max(plan.full_sizes, default=1)
        if n > inputs.max_tokens or nf > inputs.max_reqs:
            raise ValueError(
                f"capture sizes up to {n} tokens / {nf} requests exceed the input buffers "
                f"({inputs.max_tokens} / {inputs.max_reqs})"
            )
        nl = max((nf, *verify_tokens)) if plan.full_sizes else 0  # FULL logits rows

        # Inputs, shared by every graph (views of the first rows) and written by each step.
        self.input_ids, self.positions = inputs.input_ids, inputs.positions
        self.slot_mapping, self.seq_lens = inputs.slot_mapping, inputs.seq_lens
        self.block_table = inputs.block_table
        assert self.block_table.shape[1] == max_blocks_per_req
        # FULL: one token per request; padding rows attend to one token of block 0.
        self.query_start_loc = torch.arange(nf + 1, dtype=torch.int32, device=dev)
        # FULL verify graphs: request i's tokens start at i * query_len
        self.verify_qsl = {
            q: self.query_start_loc * q for q in sorted({q for _, q in plan.verify_shapes})
        }
        self.logits = torch.zeros(
            (nl, model.args.vocab_size),
            dtype=model.lm_head_weight.dtype,
            device=dev,
        )
        self.piecewise = PiecewiseBody(
            model, kv_caches, n if plan.piecewise_sizes else 0, self.slot_mapping
        )
        self.full_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.sample_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # with ``full_step``
        self.sample_replays = 0
        self._views: dict[tuple[int, int], torch.Tensor] = {}  # _rows
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
        self.seq_lens[:size].fill_(1)
        self.block_table[:size].zero_()
        meta = self._full_meta(size)
        fs = self.full_step
        if fs is not None:
            fs.clear(size)  # every row padding: the capture writes no KV and advances nothing

        def body() -> None:
            if fs is not None:
                fs.inputs_body(size)
            full_body(
                self.model,
                self.kv_caches,
                self.input_ids[:size],
                self.positions[:size],
                meta,
                self.logits[:size],
            )

        self.full_graphs[size] = _capture(body, pool)
        if fs is not None:
            logits = self.logits[:size]
            self.sample_graphs[size] = _capture(lambda: fs.sample_body(size, logits), pool)

    def capture_verify(self, size: int, query_len: int, pool) -> None:
        t = size * query_len
        self.slot_mapping[:t].fill_(-1)  # capture writes nothing to the KV cache
        self.seq_lens[:size].fill_(query_len)
        self.block_table[:size].zero_()
        meta = AttentionMetadata(
            num_reqs=size,
            num_tokens=t,
            query_start_loc=self.verify_qsl[query_len][: size + 1],
            seq_lens=self.seq_lens[:size],
            block_table=self.block_table[:size],
            slot_mapping=self.slot_mapping[:t],
            query_start_loc_np=np.arange(size + 1, dtype=np.int32) * query_len,
            seq_lens_np=np.full(size, query_len, dtype=np.int32),
            block_size=self.block_size,
        )

        def body() -> None:
            full_body(
                self.model,
                self.kv_caches,
                self.input_ids[:t],
                self.positions[:t],
                meta,
                self.logits[:t],
            )

        self.full_graphs[(size, query_len)] = _capture(body, pool)

    def capture_piecewise(self, size: int, pool) -> None:
        """The segments of ``size`` tokens. Captured on first use, it runs inside a step whose
        inputs are already in the shared buffers: their slots are put back after (the capture
        writes no KV and only reads the token ids and positions)."""
        slots = self.slot_mapping[:size].clone()
        self.slot_mapping[:size].fill_(-1)  # capture writes nothing to the KV cache
        segments = self.piecewise.segments(self.input_ids, self.positions, size)
        self.piece_graphs[size] = [_capture(segment, pool) for segment in segments]
        self.slot_mapping[:size].copy_(slots)

    # ---- replay ------------------------------------------------------------------------------
    def replay_full(self, size: int, batch: InputBatch) -> torch.Tensor:
        """Logits [B, V] of a uniform decode batch of B <= size requests (with ``full_step``,
        whose inputs the graph builds from ``FullStep.upload``)."""
        n = batch.num_reqs
        if self.full_step is not None:
            self.full_graphs[size].replay()
            return self._rows(self.logits, n)
        _put(self.input_ids, batch.input_ids)
        _put(self.positions, batch.positions)
        _put(self.slot_mapping, batch.slot_mapping)
        _put(self.seq_lens, batch.seq_lens)
        _put(self.block_table, batch.block_table)
        if size > n:  # padding: write nothing, attend to one token
            self.slot_mapping[n:size].fill_(-1)
            self.seq_lens[n:size].fill_(1)
        self.full_graphs[size].replay()
        return self.logits[:n]

    def replay_sample(self, size: int, n: int) -> torch.Tensor:
        """The sampled tokens [n] of the last FULL replay of ``size``, the state advanced."""
        self.sample_graphs[size].replay()
        self.sample_replays += 1
        return self._rows(self.full_step.sampled[size], n)

    def _rows(self, t: torch.Tensor, n: int) -> torch.Tensor:
        """``t[:n]``, a view made once per tensor and ``n`` (a slice costs the step µs)."""
        key = (id(t), n)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = t[:n]
        return view

    def replay_verify(self, size: int, query_len: int, batch: InputBatch) -> torch.Tensor:
        """Logits [B * query_len, V] of a verify batch of B <= size requests, each with
        ``query_len`` tokens (every token's row, in batch order)."""
        n, t = batch.num_reqs, batch.num_tokens
        _put(self.input_ids, batch.input_ids)
        _put(self.positions, batch.positions)
        _put(self.slot_mapping, batch.slot_mapping)
        _put(self.seq_lens, batch.seq_lens)
        _put(self.block_table, batch.block_table)
        if size > n:  # padding: write nothing, attend to its own tokens
            self.slot_mapping[t : size * query_len].fill_(-1)
            self.seq_lens[n:size].fill_(query_len)
        self.full_graphs[(size, query_len)].replay()
        return self.logits[:t]

    def run_piecewise(self, size: int, batch: InputBatch, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [T, H] of any batch of T <= size tokens; attention runs eagerly."""
        t = batch.num_tokens
        _put(self.input_ids, batch.input_ids)
        _put(self.positions, batch.positions)
        if self.piecewise.kv_in_segments:  # the segments write the KV cache: padding writes none
            _put(self.slot_mapping, batch.slot_mapping)
            if size > t:
                self.slot_mapping[t:size].fill_(-1)
        replays = [graph.replay for graph in self.piece_graphs[size]]
        return self.piecewise.run(replays, t, meta)


def _put(static: torch.Tensor, step: torch.Tensor) -> None:
    """The step's tensor into the static buffer's first rows, unless it was built there."""
    if step.data_ptr() != static.data_ptr():
        static[: step.shape[0]].copy_(step)
