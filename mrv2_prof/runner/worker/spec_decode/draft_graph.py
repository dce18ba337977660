"""The fused draft graph (MRV2's speculator CUDA graphs): the draft's work as ONE FULL graph.

The k autoregressive draft steps of a batch (``draft_steps``: k forwards of one token a
request, each with its argmax or Gumbel-max draw and, for a sampled batch, its probabilities
into the per-slot store) are replayed from one CUDA graph captured per (capture size, k, greedy
or sampled, q): one launch instead of k x (layers x kernels). ``q`` is the catch-up in the
same graph: when every request of the step computed ``q`` tokens (``q = 1``: a decode step;
``q = 1 + k``: a verify padded to the step's k), the draft's pass over the step's tokens is
captured ahead of the k steps, over static copies of the step's token ids and positions; for
any other step (``q = 0``: a prefill chunk in the batch, a verify of another k) the catch-up
runs eagerly first and the graph holds the k steps only. The capture
sizes are the target's FULL decode sizes (a draft batch is a decode batch: at most
``max_num_seqs`` requests), the ks those ``dynamic_k`` (or the fixed k) can choose; a batch is
padded up to the smallest captured size with rows of the cache's scratch row (they write and
read only there, at position 0). The graphs' static inputs (last tokens, start positions, slots,
temperatures, seeds, and for a catch-up the step's token ids and positions) are filled before
each replay; their drafts land in a static [size, k] buffer that the step's output copy reads in
stream order.

``capture_draft_graphs`` runs at start-up after the target's graphs (CUDA, FULL graphs planned)
and reports every capture to the probe (``graph_captures``: key
``draft:<size>xk<k>[:sampled][:q<q>]``, seconds, pool bytes) and its total into
``RuntimeInfo.draft_capture_s``. ``DraftGraphs.replay`` says why it cannot replay (k not
captured, too many requests): the reason becomes a note of the run, and the draft steps run
eagerly; ``replays`` counts the replays per key.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

import torch

from mrv2_prof.runner.worker.spec_decode.draft_proposer import DraftState, draft_steps


class DraftGraphs:
    def __init__(self, state: DraftState, sizes: list[int], ks: list[int], device) -> None:
        self.state = state
        self.sizes = sorted(set(sizes))
        self.ks = sorted({k for k in ks if k > 0})
        n = self.sizes[-1]
        self.last = torch.zeros(n, dtype=torch.int64, device=device)
        self.start = torch.zeros(n, dtype=torch.int64, device=device)
        self.slots = torch.full((n,), state.scratch_row, dtype=torch.int64, device=device)
        self.temperature = torch.ones(n, dtype=torch.float32, device=device)
        self.seeds = torch.zeros(n, dtype=torch.int64, device=device)
        self.qsl = torch.arange(n + 1, dtype=torch.int32, device=device)
        # the drafts, [size, k] per k: a contiguous block for the output copy
        self.out = {k: torch.zeros((n, k), dtype=torch.int64, device=device) for k in self.ks}
        # the catch-up's inputs: q tokens a request, q = 1 (decode) or 1 + k (a padded verify)
        self.qs = {k: (0, 1, 1 + k) for k in self.ks}
        t = n * (1 + self.ks[-1]) if self.ks else n
        self.ids = torch.zeros(t, dtype=torch.int64, device=device)
        self.pos = torch.zeros(t, dtype=torch.int64, device=device)
        self.graphs: dict[tuple[int, int, bool, int], torch.cuda.CUDAGraph] = {}
        self.replays: dict[tuple[int, int, bool, int], int] = {}

    def _body(self, size: int, k: int, sampled: bool, q: int) -> Callable[[], None]:
        def body() -> None:
            if q:
                self.state.catch_up_uniform(
                    self.ids[: size * q], self.pos[: size * q], self.slots[:size], q
                )
            draft_steps(
                self.state, self.last[:size], self.start[:size], self.slots[:size],
                self.temperature[:size], self.seeds[:size], self.qsl[: size + 1], k, sampled,
                self.out[k][:size],
            )  # fmt: skip

        return body

    def capture(self, on_capture: Callable[[str, int, float, int], None]) -> float:
        """Every (size, k, greedy / sampled), largest first, into one pool; returns seconds.
        ``on_capture(key, size, capture_s, mem_bytes)`` for each."""
        device = self.last.device
        t_start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            for k in reversed(self.ks):
                for sampled, q in ((s, q) for s in (True, False) for q in self.qs[k]):
                    torch.cuda.empty_cache()
                    before = torch.cuda.memory_reserved(device)
                    t0 = time.perf_counter()
                    body = self._body(size, k, sampled, q)
                    body()  # warm-up outside the graph
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        body()
                    torch.cuda.synchronize(device)
                    capture_s = time.perf_counter() - t0
                    self.graphs[(size, k, sampled, q)] = graph
                    torch.cuda.empty_cache()
                    mem = torch.cuda.memory_reserved(device) - before
                    key = f"draft:{size}xk{k}" + (":sampled" if sampled else "")
                    key += f":q{q}" if q else ""
                    on_capture(key, size, capture_s, mem)
        return time.perf_counter() - t_start

    def replay(
        self,
        last_tokens: torch.Tensor,  # [B] int64
        start: torch.Tensor,  # [B] int64
        slots: torch.Tensor,  # [B] int64
        temperature: torch.Tensor,  # [B] float32
        seeds: torch.Tensor,  # [B] int64
        k: int,
        sampled: bool,
        catch_up: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    ) -> tuple[torch.Tensor | None, str | None]:
        """The drafts [B, k] (a view of the static output) and None; or None and why the
        batch cannot replay. ``catch_up``: the step's token ids and positions [B * q] and q,
        when every request computed q tokens (the graph then runs the catch-up too; the caller
        runs it eagerly when this returns None, or when it passes None)."""
        n = last_tokens.shape[0]
        if k not in self.ks:
            return None, f"draft graph: k={k} was not captured (captured {self.ks}); eager"
        if n > self.sizes[-1]:
            return None, (
                f"draft graph: {n} requests > largest capture size {self.sizes[-1]}; eager"
            )
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        for static, value in (
            (self.last, last_tokens),
            (self.start, start),
            (self.slots, slots),
            (self.temperature, temperature),
            (self.seeds, seeds),
        ):
            static[:n].copy_(value)
        q = 0
        if catch_up is not None:  # the caller checked that q is in self.qs[k]
            ids, pos, q = catch_up
            self.ids[: n * q].copy_(ids)
            self.pos[: n * q].copy_(pos)
        if size > n:  # padding rows: the scratch row, from position 0
            self.slots[n:size].fill_(self.state.scratch_row)
            self.start[n:size].zero_()
            if q:
                self.pos[n * q : size * q].zero_()
        key = (size, k, sampled, q)
        self.graphs[key].replay()
        self.replays[key] = self.replays.get(key, 0) + 1
        return self.out[k][:n], None


def capture_draft_graphs(runner) -> None:
    """Start-up, after the target's graphs: the draft model's fused graphs, when the runner
    drafts with a model on CUDA and FULL graphs are planned; otherwise why not, as a note."""
    drafter = runner.drafter
    if drafter is None or not runner.is_cuda:
        return
    plan = runner.graphs.plan
    if not plan.full_sizes:
        runner.info.notes.append(
            "draft graph: no FULL graphs planned (cudagraph_mode or kernels); the draft steps "
            "run eagerly"
        )
        return
    c = runner.config
    graphs = DraftGraphs(
        drafter.state,
        list(plan.full_sizes),
        c.spec_decode.possible_ks(c.max_num_seqs),
        runner.device,
    )
    if not graphs.ks:
        return
    p = runner.probe
    runner.info.draft_capture_s = graphs.capture(
        lambda key, size, capture_s, mem: p.graph_capture(key, "full", size, capture_s, mem)
    )
    runner.info.num_graphs += len(graphs.graphs)
    drafter.graphs = graphs
