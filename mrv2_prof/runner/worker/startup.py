"""Start-up of a model runner, before its first step (MRV2 ``model_runner.py``:
``profile_run``, ``_dummy_run``, ``capture_model``): the KV cache, sized by a profiling run or
given; the Triton warm-up; the CUDA graph capture, then a draft model's fused draft graphs.
``start_up`` runs them in that order (the warm-up and the graphs run through the real cache).

The profiling run and the warm-up are dummy runs: forward passes and sampling over a
``dummy_batch``, through ``ModelRunner.run_dummy``. They read the request slots and write none
(the draft model's cache rows and the device drafter's rows of slots no request holds yet are
written, and a request's are reset when it takes its slot); they report nothing to the probe;
the time each part takes goes into ``RuntimeInfo``.
"""

from __future__ import annotations

import itertools
import time

import torch

from mrv2_prof.runner.config import ConfigError
from mrv2_prof.runner.model import kv_cache_bytes_per_block, kv_cache_shape
from mrv2_prof.runner.model.attention_split_kv_triton import smallest_unsplit_batch
from mrv2_prof.runner.model.attention_triton import smallest_wide_batch
from mrv2_prof.runner.model.projections_triton import warm_rows
from mrv2_prof.runner.model.step_cost import step_cost
from mrv2_prof.runner.worker import triton_key_prefetch, triton_launch
from mrv2_prof.runner.worker.cudagraph_runner import GraphRunner
from mrv2_prof.runner.worker.full_step import FullStep
from mrv2_prof.runner.worker.input_batch import dummy_batch
from mrv2_prof.runner.worker.memory_breakdown import memory_breakdown
from mrv2_prof.runner.worker.model_runner import ModelRunner
from mrv2_prof.runner.worker.request_states import PARAM_TABLES
from mrv2_prof.runner.worker.sampler import SamplingMetadata
from mrv2_prof.runner.worker.spec_decode.draft_graph import capture_draft_graphs
from mrv2_prof.runner.worker.staged_write import StagedWriteTensor
from mrv2_prof.runner.worker.uva import take


def start_up(runner: ModelRunner) -> int:
    """KV cache, warm-up, CUDA graphs. Returns the number of KV cache blocks."""
    t0 = time.perf_counter()  # triton's cache key, hashed on a thread since torch imported
    runner.info.triton_key_s = triton_key_prefetch.wait()
    runner.info.triton_key_wait_s = time.perf_counter() - t0
    num_blocks = initialize_kv_cache(runner)
    per_token = runner.info.kv_cache_bytes // (num_blocks * runner.config.block_size)
    runner.info.step_cost = step_cost(runner.model, runner.model_args, per_token)
    warm_up(runner)
    capture_graphs(runner)
    capture_draft_graphs(runner)  # speculative decoding's fused draft graphs (draft_model)
    runner.info.memory = memory_breakdown(runner)  # what holds the device memory now
    return num_blocks


def rank_runner(config, model_spec, tp) -> ModelRunner:
    """A worker rank of a tensor-parallel runner (``parallel/tp_workers.py`` spawns it): its
    model runner, started up as rank 0's is, so their collectives pair up. Its own process
    hashes triton's cache key on a thread while the rank's weights load, as rank 0's does."""
    triton_key_prefetch.start(str(config.device))
    runner = ModelRunner(config, model_spec, tp=tp)
    start_up(runner)
    return runner


def initialize_kv_cache(runner: ModelRunner) -> int:
    """Allocate the paged KV cache: an explicit block count, or what fits in GPU memory
    after a profiling run (on a CPU: ``RunnerConfig.cpu_auto_num_kv_blocks``). Returns the
    number of blocks."""
    c = runner.config
    per_block = kv_cache_bytes_per_block(runner.model_args, c.block_size, runner.dtype)
    if c.num_kv_blocks is not None:
        num_blocks = c.num_kv_blocks
    elif not runner.is_cuda:
        num_blocks = c.cpu_auto_num_kv_blocks(per_block)
    else:
        num_blocks = _profile_num_blocks(runner, per_block)
    if num_blocks * c.block_size < c.max_model_len:
        raise ConfigError(
            f"runner.num_kv_blocks: {num_blocks} blocks of {c.block_size} tokens cannot hold "
            f"one request of max_model_len {c.max_model_len}"
        )
    t0 = time.perf_counter()
    shape = kv_cache_shape(runner.model_args, num_blocks, c.block_size)
    runner.kv_caches = [
        torch.zeros(shape, dtype=runner.dtype, device=runner.device)
        for _ in range(runner.model_args.num_hidden_layers)
    ]
    info = runner.info
    info.kv_alloc_s = time.perf_counter() - t0
    info.num_kv_blocks = num_blocks
    info.kv_cache_bytes = num_blocks * per_block
    return num_blocks


def _profile_num_blocks(runner: ModelRunner, per_block: int) -> int:
    c, device = runner.config, runner.device
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)  # the weights and the runner's buffers
    t0 = time.perf_counter()
    profile_run(runner)
    torch.cuda.synchronize(device)
    runner.info.profile_run_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device)  # everything at once: the cache gets the rest
    free, total = torch.cuda.mem_get_info(device)
    non_torch = (total - free) - torch.cuda.memory_reserved(device)
    runner.info.peak_activation_bytes = peak - before  # what the profiling run added at its peak
    available = int(total * c.gpu_memory_utilization) - peak - max(non_torch, 0)
    num_blocks = available // per_block
    if num_blocks < 1:
        raise ConfigError(
            f"runner.gpu_memory_utilization: {c.gpu_memory_utilization} leaves no memory for "
            f"the KV cache (peak use {peak / 2**30:.1f} GiB of {total / 2**30:.1f} GiB)"
        )
    return int(num_blocks)


def profile_run(runner: ModelRunner) -> None:
    """Peak activation memory: the longest prefill chunk, and the widest sampling batch. Its
    batches say they profile: without a KV cache yet, the Triton path's attention (which
    serves every step through the cache, flash-style) allocates its output and computes
    nothing, as vLLM's backends do in a profiling run, instead of the torch reference's
    [heads, tokens, tokens] scores and softmax (16 GiB at 8,192 tokens and 32 heads, which no
    step of the run allocates); the torch path's attention is that reference in its steps too,
    and runs."""
    c = runner.config
    dummy_run(runner, min(c.max_num_batched_tokens, c.max_model_len - 1), 1, profiling=True)
    num_reqs = min(c.max_num_seqs, c.max_num_batched_tokens)
    dummy_run(runner, num_reqs, num_reqs, profiling=True)


def dummy_run(
    runner: ModelRunner,
    num_tokens: int,
    num_reqs: int,
    with_kv_cache: bool = False,
    profiling: bool = False,
) -> None:
    """An empty forward pass and sampling; ``with_kv_cache`` attends through the real cache
    (every slot is -1, so nothing is written) to compile the kernels on the way; ``profiling``:
    a profiling run's (``profile_run``)."""
    batch = dummy_batch(
        num_tokens, num_reqs, runner.config.max_num_reqs, runner.device, runner.block_tables,
        profiling,
    )  # fmt: skip
    runner.run_dummy(batch, runner.kv_caches if with_kv_cache else None)


def warm_up(runner: ModelRunner) -> None:
    """Compile the Triton kernels for decode- and prefill-shaped batches before the first
    step, so no step of the run pays a compile. Changes no request state."""
    if runner.kernels.name != "triton" or runner.kv_caches is None:
        return
    c, device = runner.config, runner.device
    t0 = time.perf_counter()
    warm_forward(runner)
    warm_sampling(runner)
    # Input prep, the staged-write apply and the state advance are not part of a dummy run:
    # call them in the variants the steps launch, writing only the step's input buffers (which
    # every step rewrites), nothing (an empty write) or scratch.
    rs = runner.req_states
    for n, tokens in ((1, 1), (3, 37)):  # one request, and several with an odd token count
        last = tokens - (n - 1)  # the last request's tokens (the others take one each)
        if n > 1 and (n > c.max_num_seqs or tokens > c.max_num_batched_tokens
                      or last >= c.max_model_len):  # fmt: skip
            continue
        ones = torch.ones(n, dtype=torch.int32, device=device)
        ones[-1] = last
        runner.kernels.prepare_inputs(
            torch.arange(n, dtype=torch.int32, device=device),
            ones,
            tokens,
            rs.num_computed_tokens.gpu,
            rs.num_prefill_tokens.gpu,
            rs.prefill_token_ids.gpu,
            rs.last_sampled_tokens,
            runner.block_tables.table.gpu,
            c.block_size,
            out=runner.inputs.views(tokens, n, block_table=True),
        )
    # the staged-write apply on each staged tensor itself (its dtype and row stride: one
    # variant each), with an empty write; the state advance on scratch rows
    for tensor in (*vars(rs).values(), runner.block_tables.table):
        if isinstance(tensor, StagedWriteTensor):
            tensor.warm_up()
    for n in (1, 3):
        last = torch.zeros(n, dtype=torch.int64, device=device)
        done = torch.zeros(n, dtype=torch.int32, device=device)
        rows = torch.arange(n, dtype=torch.int32, device=device)
        runner.kernels.advance_state(last, done, rows, last.clone(), done.clone())
        runner.kernels.advance_state(last, None, rows, last.clone(), None)
    if runner.is_cuda:
        torch.cuda.synchronize(device)
    runner.info.warmup_s = time.perf_counter() - t0
    for note in triton_launch.notes():  # kernels that launch through the JIT, and why
        if note not in runner.info.notes:
            runner.info.notes.append(note)


def warm_forward(runner: ModelRunner) -> None:
    """Forward passes through the real cache (every slot -1: nothing written) in the batch
    shapes whose kernels differ. Triton specialises an integer argument on == 1 and on
    % 16 == 0, and the launch code picks constexprs and kernels from the token and request
    counts, so the classes are covered rather than the sizes: five dummy runs, so each model
    kernel gets at most five variants (most get fewer: a token count is mostly a grid size).

    - 1 token: the decode GEMV (a projection's M == 1, its only path) and a count == 1;
    - a decode batch of up to 8 requests: the decode attention kernel;
    - two tokens per request (a speculative verify, or decodes beside a short chunk): the
      prefill attention kernel with the decode tiles (16-bit dtypes);
    - the longest prefill chunk up to 256 tokens, cut to a multiple of 16 (a count % 16 == 0);
    - an odd count over two requests (a run's first step, typically: the draft model's
      catch-up too) with the prefill tiles;
    - with the Triton decode GEMM on, one token count per class of its variants and, where no
      shape above has one, the fewest rows it does not serve (one prefill request each:
      ``projections_triton.warm_rows``);
    - with split-KV attention on (``runner.split_kv``), which splits the small decode batches,
      the smallest decode batch it leaves unsplit, so both decode kernels are compiled;
    - the smallest decode batch with more requests x kv heads than SMs, whose decode attention
      takes the wide grid's key tile (``attention_triton.decode_keys``).
    """
    c = runner.config
    budget = min(c.max_num_batched_tokens, c.max_model_len - 1)
    num_reqs = min(c.max_num_seqs, 8)
    prefill = min(budget, 256)
    prefill -= prefill % 16 if prefill >= 16 else 0
    shapes = [(1, 1), (num_reqs, num_reqs), (prefill, 1)]
    pairs = min(c.max_num_seqs, 2)
    if 2 * pairs <= budget:
        shapes.append((2 * pairs, pairs))
    if c.max_num_seqs > 1 and prefill > 2:
        shapes.append((prefill - 1 if prefill % 2 == 0 else prefill, 2))
    if runner.model.kernels.name == "triton":
        shapes += [(rows, 1) for rows in warm_rows(budget, tuple(n for n, _ in shapes))]
        kv_heads = runner.kv_caches[0].shape[3]  # this rank's (tensor parallelism splits them)
        unsplit = smallest_unsplit_batch(
            kv_heads, c.max_num_blocks_per_req * c.block_size, runner.device,
            min(c.max_num_seqs, budget),
        )  # fmt: skip
        if unsplit is not None:  # split-KV splits the small decode batches: the others too
            shapes.append((unsplit, unsplit))
        wide = smallest_wide_batch(kv_heads, runner.device)  # the other key tile
        if wide <= min(c.max_num_seqs, budget):
            shapes.append((wide, wide))
    for num_tokens, reqs in dict.fromkeys(shapes):  # in order, each shape once
        dummy_run(runner, num_tokens, reqs, with_kv_cache=True)


def warm_sampling(runner: ModelRunner) -> None:
    """The sampler in every variant a step can launch: all greedy or not, a top-k / top-p
    threshold or not, logprobs or not (the host flags pick the kernel's constexprs; the row
    count picks none). One row, its logits from the LM head and the request tables read as a
    step reads them (``param_table``: with UVA the pinned tables, whose gather is a kernel);
    the flags are set here, so no request state is written or needed."""
    batch = dummy_batch(1, 1, runner.config.max_num_reqs, runner.device, runner.block_tables)
    hidden = torch.zeros(1, runner.model_args.hidden_size, dtype=runner.dtype, device=runner.device)
    logits = runner.model.logits(hidden)
    rs = runner.req_states
    for greedy, threshold, logprobs in itertools.product((True, False), repeat=3):
        if greedy and threshold:
            continue  # greedy rows are never masked
        meta = SamplingMetadata(
            idx_mapping=batch.idx_mapping,
            positions=batch.seq_lens,
            temperature=rs.param_table("temperature"),  # pinned with UVA: the gather kernel
            top_k=rs.param_table("top_k"),
            top_p=rs.param_table("top_p"),
            seeds=rs.param_table("seeds"),
            max_num_logprobs=int(logprobs),
            all_greedy=greedy,
            no_top_k=not threshold,
            no_top_p=not threshold,
        )
        runner.kernels.sample(logits, meta)
    if rs.uva:  # the speculative samplers gather the seeds as well (uva.take)
        for name in PARAM_TABLES:
            take(rs.param_table(name), batch.idx_mapping)


def capture_graphs(runner: ModelRunner) -> None:
    """Capture the planned CUDA graphs (after the KV cache and the warm-up); each capture
    is reported to the probe with its seconds and pool memory."""
    graphs = runner.graphs
    plan = graphs.plan
    if not (plan.full_sizes or plan.piecewise_sizes):
        return
    assert runner.kv_caches is not None, "initialize_kv_cache() before capture_graphs()"
    c = runner.config
    full_step = None
    if c.full_step_graph and plan.full_sizes:  # input build and sampling in the graphs too
        full_step = FullStep(
            max(plan.full_sizes),
            runner.kernels,
            runner.req_states,
            runner.block_tables.table.gpu,
            runner.inputs,
            c.block_size,
            c.staged_writes,
            runner.copies,
            pin=runner.is_cuda,
        )
    runner.graph_runner = GraphRunner(
        runner.model,
        runner.kv_caches,
        c.block_size,
        c.max_num_blocks_per_req,
        plan,
        runner.inputs,
        full_step,
    )
    p = runner.probe
    info = runner.info
    info.capture_s = graphs.capture(
        runner.graph_runner,
        lambda r: p.graph_capture(r.key, r.mode, r.num_tokens, r.capture_s, r.mem_bytes),
    )
    info.graph_memory_bytes = sum(r.mem_bytes for r in graphs.captures)
    info.num_graphs = len(graphs.captures)
