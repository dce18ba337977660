"""What one decode step dispatches and launches from the host, and what a Triton launch costs there.

(a) inventory: an engine at steady decode (``--batches`` requests, 16-token prompts, EOS
    ignored; on CUDA llama-1b, Triton kernels, FULL graphs at the batch size, async). Over
    ``--steps`` decode steps it counts, per phase of the model runner's step (prepare: the
    request-state diff, staged writes and input prep; forward; sample; advance: the state
    advance after sampling; output: the copy of the tokens to the host; other: the rest of
    ``queue_step``; engine: scheduling, update, the output wait), the torch ops dispatched
    from Python (a ``TorchDispatchMode``; views counted apart: they launch nothing but cost
    host time) and the Triton launches per kernel (the cached launcher's calls). On CUDA it
    also counts the CUDA runtime / driver calls the torch profiler records on the CPU side
    (kernel launches, graph launches, copies, events) per step. Steps that cross a KV block
    boundary (a block-table staged write) are included: the counts are means per step.
(b) binding: per step-path kernel with its arguments at batch 64, the host µs of what the JIT
    path does before its launcher call (triton's binder and cache key) against the cached
    launcher's key; on CUDA also the whole enqueue, ``kernel[grid](...)`` against the cached
    launcher. On the CPU the kernels are built as JIT functions and the binder is the CUDA
    backend's, without a device.

    python benchmarks/step_launches.py --batches 1,64 --out step_launches.json   # H200
    python benchmarks/step_launches.py --quick --out /tmp/step_launches.json     # CPU, tiny
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
import time
from typing import Any

import torch

if not torch.cuda.is_available():  # before triton is imported: the step-path kernels interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")

from bench_io import write_results  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from mrv2_prof.runner.config import ModelSpec, RunnerConfig  # noqa: E402
from mrv2_prof.runner.core.request import SamplingParams  # noqa: E402
from mrv2_prof.runner.engine import Engine  # noqa: E402
from mrv2_prof.runner.worker import triton_launch  # noqa: E402
from mrv2_prof.runner.worker.triton_launch import Launcher  # noqa: E402

VIEW_OPS = {"view", "slice", "select", "as_strided", "alias", "unsqueeze", "squeeze", "t"}
CU_PREFIXES = ("cuda", "cu")


class _Phase:
    name = "engine"
    counting = False


PHASE = _Phase()
COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


class _CountOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if PHASE.counting:
            op = func.overloadpacket.__name__
            COUNTS[PHASE.name][("view " if op in VIEW_OPS else "op ") + op] += 1
        return func(*args, **(kwargs or {}))


def _tagged(fn, phase: str):
    def run(*a, **k):
        prev, PHASE.name = PHASE.name, phase
        try:
            return fn(*a, **k)
        finally:
            PHASE.name = prev

    return run


def _tag(runner) -> None:
    """Label the runner's calls with the phase they belong to (innermost wins)."""
    runner._queue_step = _tagged(runner._queue_step, "other")
    for name in ("_update_states", "_prepare_inputs"):
        setattr(runner, name, _tagged(getattr(runner, name), "prepare"))
    runner.step_inputs.host = _tagged(runner.step_inputs.host, "prepare")
    runner.step_inputs.device = _tagged(runner.step_inputs.device, "prepare")
    gr = runner.graph_runner
    if gr is not None and gr.full_step is not None:  # runner.full_step_graph
        gr.full_step.upload = _tagged(gr.full_step.upload, "prepare")
        gr.replay_sample = _tagged(gr.replay_sample, "sample")
    runner.req_states.apply_writes = _tagged(runner.req_states.apply_writes, "prepare")
    runner.block_tables.apply_write = _tagged(runner.block_tables.apply_write, "prepare")
    runner._forward = _tagged(runner._forward, "forward")
    runner._sample = _tagged(runner._sample, "sample")
    advance = _tagged(runner.kernels.advance_state, "advance")
    runner.kernels = dataclasses.replace(runner.kernels, advance_state=advance)
    runner.output.queue = _tagged(runner.output.queue, "output")


def _count_launches():
    """Count each Triton launch in the current phase; returns the undo."""
    call = Launcher.__call__

    def counted(self, grid, *a, **k):
        if not PHASE.counting:
            return call(self, grid, *a, **k)
        COUNTS[PHASE.name]["triton " + self.name] += 1
        PHASE.counting = False  # the interpreter's own torch ops are not the step's
        try:
            return call(self, grid, *a, **k)
        finally:
            PHASE.counting = True

    Launcher.__call__ = counted

    def undo() -> None:
        Launcher.__call__ = call

    return undo


def _engine(args, batch: int, cuda: bool) -> Engine:
    config = RunnerConfig(
        device="cuda" if cuda else "cpu",
        max_num_reqs=2 * batch,
        max_num_seqs=batch,
        max_num_batched_tokens=max(16 * batch, 64),
        max_model_len=512,
        kernels="triton" if cuda else "torch",
        async_scheduling=True,
        cudagraph_mode="full" if cuda else "none",
        cudagraph_capture_sizes=(batch,) if cuda else None,
        num_kv_blocks=40 + 8 * batch,  # fixed (one 512-token request and more): no profiling run
    )
    if not cuda:  # the step path's Triton kernels, interpreted, with the model's torch kernels
        import mrv2_prof.runner.worker.model_runner as model_runner
        from mrv2_prof.runner.worker.kernel_set import TORCH, triton_kernels

        # named "torch": the Triton warm-up's dummy runs need the model's Triton KV write
        step_path = dataclasses.replace(triton_kernels(), model=TORCH.model, name="torch")
        resolve = model_runner.resolve_kernels
        model_runner.resolve_kernels = lambda r, c: (step_path, None)
    try:
        spec = ModelSpec(preset=args.preset or ("llama-1b" if cuda else "llama-tiny"))
        return Engine(config, spec)
    finally:
        if not cuda:
            model_runner.resolve_kernels = resolve


def inventory(args, batch: int, cuda: bool) -> dict[str, Any]:
    engine = _engine(args, batch, cuda)
    _tag(engine.runner)
    params = SamplingParams(max_tokens=args.warm + args.steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", [(7 * i + j) % 1000 + 1 for j in range(16)], params)
    for _ in range(args.warm):
        engine.step()
    COUNTS.clear()
    cu: collections.Counter = collections.Counter()
    prof = None
    if cuda and args.profile:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        prof.__enter__()
    PHASE.counting = True
    with _CountOps():
        for _ in range(args.steps):
            engine.step()
    PHASE.counting = False
    if prof is not None:
        torch.cuda.synchronize()
        prof.__exit__(None, None, None)
        for evt in prof.events():
            if evt.device_type.name == "CPU" and evt.name.startswith(CU_PREFIXES):
                cu[evt.name] += 1
    per_step = {
        phase: {k: round(v / args.steps, 2) for k, v in sorted(c.items())}
        for phase, c in COUNTS.items()
    }
    totals = {
        phase: {
            "ops": round(sum(v for k, v in c.items() if k.startswith("op ")) / args.steps, 2),
            "views": round(sum(v for k, v in c.items() if k.startswith("view ")) / args.steps, 2),
            "triton": round(
                sum(v for k, v in c.items() if k.startswith("triton ")) / args.steps, 2
            ),
        }
        for phase, c in COUNTS.items()
    }
    hits = {
        lnch.name: {"calls": lnch.calls, "hits": lnch.hits, "slow": lnch.slow}
        for lnch in triton_launch.launchers()
        if lnch.calls
    }
    return {
        "part": "inventory",
        "batch": batch,
        "steps": args.steps,
        "graph_replays": dict(engine.runner.graphs.replays),
        "per_step": per_step,
        "totals": totals,
        "cuda_calls_per_step": {k: round(v / args.steps, 2) for k, v in sorted(cu.items())},
        "launchers": hits,
        "notes": triton_launch.notes(),
    }


def _kernel_args(cuda: bool) -> dict[str, tuple]:
    """(kernel, grid, runtime args, keyword args) of the step path's kernels at batch 64."""
    from mrv2_prof.runner.worker import gumbel_argmax_triton as g
    from mrv2_prof.runner.worker import input_batch_triton as ib
    from mrv2_prof.runner.worker import step_advance_triton as sa

    dev = "cuda" if cuda else "cpu"
    b, r, v = 64, 256, 128256

    def i32(*shape):
        return torch.zeros(shape, dtype=torch.int32, device=dev)

    def i64(*shape):
        return torch.zeros(shape, dtype=torch.int64, device=dev)

    f32 = torch.zeros(3, b * 8, dtype=torch.float32, device=dev)
    table, prefill = i32(r, 32), i32(r, 512)
    logits = torch.zeros(b, v, dtype=torch.bfloat16, device=dev)
    return {
        "prepare_inputs": (
            ib._prepare_inputs_kernel,
            (b,),
            (i32(b), i32(b), i32(r), i32(r), prefill, 512, i64(r), table, 32, i64(b), i64(b))
            + (i32(b + 1), i32(b), i64(b), i64(b), i32(b, 32), 32, 32),
            dict(KV_BLOCK_SIZE=16, BLOCK_T=256, BLOCK_R=256, COPY_TABLE=True, BLOCK_C=256)
            | dict(PAD_EMPTY=False),
        ),
        "gumbel_argmax": (
            g._gumbel_argmax_kernel,
            (b, 8),
            (logits, v, i32(b), i32(b), f32[0, :r], i64(r), f32[0], f32[0], i32(b * 8))
            + (f32[1], f32[2], i32(b), i64(b), f32[0], v, 16384, 8),
            dict(BLOCK_SIZE=1024, BLOCK_SPLITS=16, ALL_GREEDY=False, HAS_THRESHOLD=False)
            | dict(LOGPROBS=False, PRECISE=True, FUSED=True, num_warps=4),
        ),
        "advance_state": (
            sa._advance_kernel,
            (1,),
            (i64(r), i32(r), i32(b), i64(b), i32(b), i32(b), b),
            dict(ADVANCE=True, SKIP_EMPTY=False, BLOCK=128),
        ),
    }


def _us(fn, n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def _bind_row(name, kernel, grid, rt, kw, cuda: bool, iters: int) -> dict[str, Any]:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    fn = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    cache: dict = {}
    kw_bind = {k: v for k, v in kw.items() if k != "num_warps"}

    def jit_key():
        _, spec, options = binder(*rt, **kw_bind)
        return compute_cache_key(cache, spec, options)

    launcher = Launcher(fn, name)
    row = {
        "part": "binding",
        "kernel": name,
        "jit_bind_key_us": round(_us(jit_key, iters), 2),
        "launcher_key_us": round(_us(lambda: launcher.key(rt, kw), iters), 2),
    }
    if cuda:
        jit = _us(lambda: kernel[grid](*rt, **kw), iters)
        fast = _us(lambda: launcher(grid, *rt, **kw), iters)
        torch.cuda.synchronize()
        row |= {"jit_launch_us": round(jit, 2), "cached_launch_us": round(fast, 2)}
        row |= {"cached_hits": launcher.hits, "cached_calls": launcher.calls}
    return row


def binding(args, cuda: bool) -> list[dict[str, Any]]:
    return [
        _bind_row(name, *spec, cuda=cuda, iters=args.iters)
        for name, spec in _kernel_args(cuda).items()
    ]


def markdown(results: list[dict]) -> str:
    lines = []
    for r in results:
        if r["part"] == "inventory":
            lines.append(f"batch {r['batch']} (replays {r['graph_replays']}), per step:")
            for phase, t in r["totals"].items():
                detail = ", ".join(f"{k} {v}" for k, v in r["per_step"][phase].items())
                lines.append(f"  {phase}: {t} | {detail}")
            if r["cuda_calls_per_step"]:
                lines.append(f"  CUDA calls: {r['cuda_calls_per_step']}")
        else:
            lines.append(f"{r['kernel']}: " + ", ".join(f"{k} {v}" for k, v in r.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("all", "inventory", "binding"), default="all")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warm", type=int, default=6)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: batch 4, few steps")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        batches = []
    if not batches or any(b < 1 for b in batches) or min(args.steps, args.iters, args.warm) < 1:
        print("--batches, --steps, --warm, --iters: positive integers expected", file=sys.stderr)
        sys.exit(2)
    if args.quick:
        batches, args.steps, args.warm, args.iters = [4], 4, 3, 200
    cuda = torch.cuda.is_available()
    undo = _count_launches()
    results: list[dict] = []
    try:
        if args.part in ("all", "inventory"):
            results += [inventory(args, b, cuda) for b in batches]
        if args.part in ("all", "binding"):
            results += binding(args, cuda)
    finally:
        undo()
    print(markdown(results))
    write_results(args.out, {"args": vars(args)}, results)


if __name__ == "__main__":
    main()
