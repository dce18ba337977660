"""CUDA graphs: which steps replay a captured graph, which run eagerly, and why (MRV2
``cudagraph_utils.py`` / vLLM's ``CudagraphDispatcher``), all decided in one class.

Modes:

* ``full`` — the whole forward pass (embedding, every layer with its KV write and paged attention,
  the final norm and the LM head) for a batch in which every request has one query token (a
  uniform decode batch), captured once per capture size. The batch is padded up to the smallest
  captured size: padding tokens get slot -1 (the KV write skips them) and a one-token context.
  Static input buffers are allocated once at the largest size; every graph shares one memory
  pool and they are captured largest first. Sampling runs after the replay, eagerly: its
  host-side choices (greedy / top-k-top-p / logprobs) and the rotating pinned parameter buffers
  of ``runner.uva`` would each need their own graph, for one or two launches.
* ``piecewise`` — one graph per segment between attention calls (embedding → layer 0's q/k/v;
  layer i's output projection and MLP → layer i+1's q/k/v; the last layer's → the final norm),
  for any batch shape up to the largest capture size in tokens. The KV write and attention run
  eagerly between the segments with the batch's real metadata, so mixed prefill/decode batches
  can use them.
* ``none`` — eager.

``plan_graphs`` turns the scenario's request into what this runner will capture, with a visible
note for each downgrade (an error under ``strict``). ``CudaGraphManager.dispatch`` is a pure
function of the batch shape and what was captured; every decision carries its reason. The
capture itself goes through a ``GraphBackend`` (``GraphRunner`` on CUDA; tests can pass a fake),
timed and measured per key.
"""

from __future__ import annotations

import abc
import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from mrv2_prof.runner.config import ConfigError, RunnerConfig
from mrv2_prof.runner.model.attention import AttentionMetadata

FULL, PIECEWISE, NONE = "full", "piecewise", "none"
MODES = ("full", "piecewise", "full_and_piecewise", "none")


def default_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM's default: 1, 2, 4, then 8..248 by 8, then 256.. by 16, up to
    min(2 x max_num_seqs, 512, max_num_batched_tokens)."""
    limit = min(2 * max_num_seqs, 512, max_num_batched_tokens)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    return [s for s in sizes if s <= limit]


@dataclass(frozen=True)
class GraphPlan:
    """What will be captured: sizes per mode (ascending), and the notes of any downgrade."""

    requested: str
    full_sizes: tuple[int, ...] = ()
    piecewise_sizes: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    none_reason: str = "mode none requested"  # why nothing is captured, when nothing is


def plan_graphs(config: RunnerConfig, kernels: str, is_cuda: bool) -> GraphPlan:
    """The graphs this runner can capture for ``config``; each downgrade is a note, or with
    ``strict`` a ``ConfigError`` naming it."""
    requested = config.cudagraph_mode
    if requested == NONE:
        return GraphPlan(requested)
    if not is_cuda:
        return _downgrade(
            config, requested, (), (), "CUDA graphs need a CUDA device; running eagerly"
        )
    auto = config.cudagraph_capture_sizes is None
    sizes = (
        default_capture_sizes(config.max_num_seqs, config.max_num_batched_tokens)
        if auto
        else sorted(set(config.cudagraph_capture_sizes))
    )
    notes = []
    full: list[int] = []
    if requested in (FULL, "full_and_piecewise"):
        if kernels != "triton":
            notes.append(
                "runner.cudagraph_mode: full needs the Triton attention (the torch reference "
                "reads host-side lengths and cannot be captured); no FULL graphs"
            )
        else:
            full = [s for s in sizes if s <= config.max_num_seqs]
            too_big = [s for s in sizes if s > config.max_num_seqs]
            if too_big and not auto and requested == FULL:
                notes.append(
                    f"runner.cudagraph_capture_sizes: {too_big} exceed max_num_seqs "
                    f"{config.max_num_seqs}, no decode batch is that large; not captured"
                )
    piecewise = sizes if requested in (PIECEWISE, "full_and_piecewise") else []
    if not full and not piecewise:
        notes.append("runner.cudagraph_mode: nothing left to capture; running eagerly")
    if notes and config.strict:
        raise ConfigError(f"{notes[0]} (strict: true)")
    reason = notes[-1] if not full and not piecewise else "mode none requested"
    return GraphPlan(requested, tuple(full), tuple(piecewise), tuple(notes), reason)


def _downgrade(config, requested, full, piecewise, note) -> GraphPlan:
    if config.strict:
        raise ConfigError(f"runner.cudagraph_mode: {requested}: {note} (strict: true)")
    return GraphPlan(requested, full, piecewise, (f"runner.cudagraph_mode: {note}",), note)


@dataclass(frozen=True)
class BatchDescriptor:
    num_tokens: int
    num_reqs: int
    uniform_query_len: int | None  # every request schedules this many tokens; None if mixed

    @classmethod
    def of(cls, num_scheduled_tokens: np.ndarray) -> BatchDescriptor:
        n = len(num_scheduled_tokens)
        total = int(num_scheduled_tokens.sum())
        uniform = n > 0 and total == n * int(num_scheduled_tokens[0])
        if uniform:
            uniform = bool((num_scheduled_tokens == num_scheduled_tokens[0]).all())
        return cls(total, n, int(num_scheduled_tokens[0]) if uniform else None)


@dataclass(frozen=True)
class Decision:
    requested: str
    mode: str  # full | piecewise | none
    key: int | None  # the capture size replayed
    num_tokens: int
    padded_tokens: int  # key, or num_tokens when eager
    reason: str

    @property
    def hit(self) -> bool:
        return self.mode != NONE


@dataclass
class CaptureRecord:
    key: str
    mode: str
    num_tokens: int
    capture_s: float
    mem_bytes: int  # growth of the graph memory pool's reserved bytes


class GraphBackend(abc.ABC):
    """What the manager needs from the runner: capture one key, measure memory."""

    @abc.abstractmethod
    def capture_full(self, size: int, pool) -> None: ...

    @abc.abstractmethod
    def capture_piecewise(self, size: int, pool) -> None: ...

    def new_pool(self):
        return None

    def memory_reserved(self) -> int:
        return 0

    def synchronize(self) -> None:  # optional: by default there is nothing to wait for
        return None


@dataclass
class CudaGraphManager:
    plan: GraphPlan
    full_keys: list[int] = field(default_factory=list)  # captured, ascending
    piecewise_keys: list[int] = field(default_factory=list)
    captures: list[CaptureRecord] = field(default_factory=list)
    replays: dict[tuple[str, int], int] = field(default_factory=dict)

    def capture(
        self, backend: GraphBackend, on_capture: Callable[[CaptureRecord], None] | None = None
    ) -> float:
        """Capture every planned key, largest first, into one shared pool. Returns seconds."""
        t_start = time.perf_counter()
        pool = backend.new_pool()
        jobs = [(FULL, s, backend.capture_full) for s in self.plan.full_sizes]
        jobs += [(PIECEWISE, s, backend.capture_piecewise) for s in self.plan.piecewise_sizes]
        for mode, size, capture in sorted(jobs, key=lambda j: (j[0] != FULL, -j[1])):
            before = backend.memory_reserved()
            t0 = time.perf_counter()
            capture(size, pool)
            backend.synchronize()
            record = CaptureRecord(
                f"{mode}:{size}",
                mode,
                size,
                time.perf_counter() - t0,
                backend.memory_reserved() - before,
            )
            self.captures.append(record)
            bisect.insort(self.full_keys if mode == FULL else self.piecewise_keys, size)
            if on_capture is not None:
                on_capture(record)
        return time.perf_counter() - t_start

    def dispatch(self, batch: BatchDescriptor, needs_hidden: bool = False) -> Decision:
        """FULL if a captured size holds this uniform decode batch, else PIECEWISE if one holds
        its tokens, else NONE; the reason names what ruled out the better modes.
        ``needs_hidden``: the step needs every token's hidden state (FULL keeps only logits)."""
        n = batch.num_tokens
        requested = self.plan.requested
        why_not_full = self._why_not_full(batch)
        if why_not_full is None and needs_hidden:
            why_not_full = "prompt logprobs need every hidden state"
        if why_not_full is None:
            key = self.full_keys[bisect.bisect_left(self.full_keys, n)]
            return Decision(requested, FULL, key, n, key, f"uniform decode, {n} → {key}")
        if self.piecewise_keys and n <= self.piecewise_keys[-1]:
            key = self.piecewise_keys[bisect.bisect_left(self.piecewise_keys, n)]
            return Decision(requested, PIECEWISE, key, n, key, why_not_full)
        if self.piecewise_keys:
            reason = f"num_tokens {n} > largest capture size {self.piecewise_keys[-1]}"
        elif not self.full_keys:
            reason = self.plan.none_reason
        else:
            reason = f"{why_not_full}; no piecewise graphs"
        return Decision(requested, NONE, None, n, n, reason)

    def _why_not_full(self, batch: BatchDescriptor) -> str | None:
        if not self.full_keys:
            return "no FULL graphs captured"
        if batch.uniform_query_len is None:
            return "mixed prefill/decode batch"
        if batch.uniform_query_len != 1:
            return f"prefill batch (query length {batch.uniform_query_len})"
        if batch.num_tokens > self.full_keys[-1]:
            return f"num_tokens {batch.num_tokens} > largest FULL size {self.full_keys[-1]}"
        return None

    def count_replay(self, decision: Decision) -> None:
        k = (decision.mode, decision.key)
        self.replays[k] = self.replays.get(k, 0) + 1

    def usage(self) -> dict[str, float | int]:
        """Captured keys against replayed ones, and what the never-replayed keys cost."""
        unused = [r for r in self.captures if (r.mode, r.num_tokens) not in self.replays]
        return {
            "graph_keys_captured": len(self.captures),
            "graph_keys_replayed": len(self.captures) - len(unused),
            "graph_replays": sum(self.replays.values()),
            "unused_capture_s": sum(r.capture_s for r in unused),
            "unused_graph_bytes": sum(r.mem_bytes for r in unused),
        }


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
        args = model.args
        dev = kv_caches[0].device
        dtype = model.model.embed_tokens.weight.dtype
        self.device = dev
        n = max((*plan.full_sizes, *plan.piecewise_sizes), default=1)
        nf = max(plan.full_sizes, default=1)

        def zeros(*shape, dt=torch.int64):
            return torch.zeros(shape, dtype=dt, device=dev)

        # Inputs, shared by every graph (views of the first rows).
        self.input_ids = zeros(n)
        self.positions = zeros(n)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        # FULL: one token per request; padding rows attend to one token of block 0.
        self.seq_lens = torch.ones(nf, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(nf + 1, dtype=torch.int32, device=dev)
        self.block_table = zeros(nf, max_blocks_per_req, dt=torch.int32)
        self.logits = torch.zeros(
            (nf if plan.full_sizes else 0, args.vocab_size), dtype=torch.float32, device=dev
        )
        # PIECEWISE: the residual stream and attention in/out between segments.
        h, kvh, d = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        np_ = n if plan.piecewise_sizes else 0
        self.x = zeros(np_, args.hidden_size, dt=dtype)
        self.cos = zeros(np_, d, dt=dtype)
        self.sin = zeros(np_, d, dt=dtype)
        self.q = zeros(np_, h, d, dt=dtype)
        self.k = zeros(np_, kvh, d, dt=dtype)
        self.v = zeros(np_, kvh, d, dt=dtype)
        self.attn = zeros(np_, h, d, dt=dtype)
        self.hidden = zeros(np_, args.hidden_size, dt=dtype)
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

    def _full_body(self, size: int) -> None:
        hidden = self.model(
            self.input_ids[:size], self.positions[:size], self.kv_caches, self._full_meta(size)
        )
        # the LM head straight into the static logits (the copy is the float32 cast)
        self.logits[:size].copy_(torch.nn.functional.linear(hidden, self.model.lm_head_weight))

    def capture_full(self, size: int, pool) -> None:
        self.slot_mapping[:size].fill_(-1)  # capture writes nothing to the KV cache
        self._full_body(size)  # warm-up outside the graph (cuBLAS workspaces, autotuning)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self._full_body(size)
        self.full_graphs[size] = graph

    def _segments(self, size: int) -> list[Callable[[], None]]:
        m = self.model
        layers = m.model.layers

        def first() -> None:
            x, cos, sin = m.embed(self.input_ids[:size], self.positions[:size])
            self.x[:size].copy_(x)
            self.cos[:size].copy_(cos)
            self.sin[:size].copy_(sin)
            self._store_qkv(size, layers[0].pre_attention(x, cos, sin))

        def middle(i: int) -> Callable[[], None]:
            def run() -> None:
                x = layers[i - 1].post_attention(self.x[:size], self.attn[:size])
                self.x[:size].copy_(x)
                self._store_qkv(size, layers[i].pre_attention(x, self.cos[:size], self.sin[:size]))

            return run

        def last() -> None:
            x = layers[-1].post_attention(self.x[:size], self.attn[:size])
            self.hidden[:size].copy_(m.model.norm(x))

        return [first, *(middle(i) for i in range(1, len(layers))), last]

    def _store_qkv(self, size: int, qkv) -> None:
        for buf, t in zip((self.q, self.k, self.v), qkv, strict=True):
            buf[:size].copy_(t)

    def capture_piecewise(self, size: int, pool) -> None:
        graphs = []
        for segment in self._segments(size):
            segment()  # warm-up outside the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                segment()
            graphs.append(graph)
        self.piece_graphs[size] = graphs

    # ---- replay ------------------------------------------------------------------------------
    def replay_full(self, size: int, batch) -> torch.Tensor:
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

    def run_piecewise(self, size: int, batch, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [T, H] of any batch of T <= size tokens; attention runs eagerly."""
        t = batch.num_tokens
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        graphs = self.piece_graphs[size]
        for i, layer in enumerate(self.model.model.layers):
            graphs[i].replay()
            attn = layer.self_attn.attention(
                self.q[:t], self.k[:t], self.v[:t], self.kv_caches[i], meta
            )
            self.attn[:t].copy_(attn)
        graphs[-1].replay()
        return self.hidden[:t]
