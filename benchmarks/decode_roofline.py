"""Decode against the memory roofline: TPOT at batch 1 / 8 / 64 / 256 per preset through our
engine with FULL CUDA graphs, the bytes one decode step must read, the HBM read bandwidth
measured in the same run, the utilisation, and the kernels per step from a profiler window.

For each preset one engine (Triton kernels, async scheduling, staged writes, UVA, FULL graphs
captured at exactly the batch sizes) runs, for each batch size B, B requests of ``--prompt-len``
prompt tokens and ``--output-len`` output tokens, all at once, EOS ignored. TPOT is the median
wall time of the steady decode steps (all B requests decoding) after the first two (they still
drain the prefill) and the profiler window; the graph mode each of them replayed is listed.

Bytes read per step: every weight once, except that an untied embedding table gives only its B
rows (the lm_head reads the whole of its own matrix; a tied table is read whole by it), plus the
KV cache of every request at the median context length of the timed steps. Activations and the
logits written are not counted. Bandwidth: ``torch.sum`` over a 4 GiB bf16 tensor, bytes read
over the best of 10 timed sums (CUDA events), so the utilisation is bytes / TPOT / bandwidth.

FLOPs per step (the engine's own constants, ``runner/model/step_cost.py``): B x (the matmul FLOPs
per token + the lm_head's per row) + the attention's per (query, key) pair x B x the context.
Against the GPU's dense 16-bit tensor-core peak (``probes/machine_peaks.py``' datasheet table):
the compute utilisation is FLOPs / TPOT / peak. The binding roof is the one whose lower bound on
the step time (bytes / bandwidth or FLOPs / peak) is the larger, and ``roofline`` is that bound /
TPOT: memory at small batches, compute where a batch's FLOPs outgrow its bytes (batch 256 of an
8B model). A GPU not in the table, or a float32 run, has no compute roof: memory is then used.

Kernels (``decode_trace.py``): ``torch.profiler`` (CUDA activity) around ``--trace-steps``
steady decode steps before the timed ones; each kernel is put with the launch that made it (its
correlation id): a ``cudaGraphLaunch`` (inside the FULL graph) or an eager launch (input
preparation, sampling). Graph kernels per step / layers is the kernels-per-decoder-layer
figure; the kernels that take the most time per step are listed. In-graph gaps: per step, the
device time inside the FULL graph's replay when no kernel runs (the gaps between one kernel's
end and the next one's start), the share of the step that kernel boundaries cost (``--pdl on``
and the fused paths shrink it). Per op of the model (the forward's kernels put with their ops
as the tool's kernel table does): its device time per step against its roof's bound (bytes /
bandwidth or FLOPs / peak at the step's batch and context), and the µs reaching it would save:
where a target is missed, the ops listed first are the kernels to work on.

    python benchmarks/decode_roofline.py --preset llama-1b --preset qwen3-0.6b \\
        --preset llama-3-8b --out roofline.json
    python benchmarks/decode_roofline.py --batches 1 --variant plain \\
        --variant plain+pdl --variant fused_onepass+pdl+fold   # one engine per variant
    python benchmarks/decode_roofline.py --cpu-smoke     # llama-tiny on the CPU, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import tempfile
import time

import numpy as np
import torch
from bench_io import write_results
from decode_trace import count_kernels, op_roofs

from mrv2_prof.probes.machine_peaks import tensor_peak
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.model import (
    attention_split_kv_triton,
    attention_triton,
    gemm_decode_triton,
    gemv_triton,
    projections_triton,
)
from mrv2_prof.runner.model.presets import PRESETS
from mrv2_prof.runner.model.projections_triton import DECODE_GEMV_MODES
from mrv2_prof.runner.model.shipped import SHIPPED

SKIP_STEPS = 2  # steady steps that still overlap the last prefill
# an op's line in "most time to gain": whether its launches bind (kernel_roofline.launch_bound)
BOUND = {True: "launch-bound", False: "kernel-bound", None: "no roof"}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def read_bandwidth(nbytes: int) -> float:
    """Bytes per second read by ``torch.sum`` over a bf16 tensor of ``nbytes`` (best of 10)."""
    x = torch.ones(
        nbytes // 2, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu"
    )
    best = float("inf")
    for i in range(12):
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            x.sum()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            x.sum()
            seconds = time.perf_counter() - t0
        if i >= 2:  # two warm-ups
            best = min(best, seconds)
    del x
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return nbytes / best


class Window:
    """torch.profiler over a run of consecutive steps, its trace counted when it stops."""

    def __init__(self, layers: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.layers = layers
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.prof = profile(activities=activities)
        self.steps = 0
        self.prof.__enter__()

    def stop(self) -> dict:
        sync()
        self.prof.__exit__(None, None, None)
        fd, path = tempfile.mkstemp(prefix="roofline-", suffix=".json")
        os.close(fd)
        try:
            self.prof.export_chrome_trace(path)
            return count_kernels(path, max(self.steps, 1), self.layers)
        finally:
            os.unlink(path)


def decode_run(engine: Engine, batch: int, prompt: int, output: int, trace_steps: int) -> dict:
    """B requests at once. The steady decode steps (all B requests decoding one token): two
    skipped, then the profiler window, one skipped, then the timed ones up to the first step
    without all B (requests prefilled in an earlier chunk finish a few steps sooner)."""
    rng = np.random.default_rng(batch)
    params = SamplingParams(max_tokens=output, ignore_eos=True)
    for i in range(batch):
        engine.add_request(
            f"b{batch}-{i}", rng.integers(0, engine.vocab_size, prompt).tolist(), params
        )
    first_timed = SKIP_STEPS + trace_steps + (1 if trace_steps else 0)
    walls, contexts, modes = [], [], set()
    window, kernels, steady = None, None, 0
    requests = engine.scheduler.requests
    while engine.has_unfinished_requests():
        res = engine.step()
        so = res.scheduler_output
        if not (so.num_reqs == batch and so.total_num_scheduled_tokens == batch):
            if window is not None:  # the run left the steady state inside the window
                kernels, window = window.stop(), None
            continue
        if window is not None:
            window.steps += 1
            if window.steps == trace_steps:
                kernels, window = window.stop(), None
        elif steady == SKIP_STEPS - 1 and trace_steps:
            window = Window(engine.runner.model_args.num_hidden_layers)  # opens after this step
        elif steady >= first_timed:
            walls.append(res.host_ns / 1e6)
            # KV read per request: its computed tokens, the one written this step included
            lens = [
                requests[r].num_computed_tokens for r in so.num_scheduled_tokens if r in requests
            ]
            contexts.append(float(np.mean(lens)) if lens else prompt + steady + 1)
            modes.add(engine.runner.graph_mode_of_last_step)
        steady += 1
    if window is not None:
        kernels = window.stop()
    if not walls:
        raise SystemExit(f"batch {batch}: no steady decode step to time (raise --output-len)")
    tpot = float(np.median(walls))
    return {
        "batch": batch,
        "tpot_ms": tpot,
        "tok_s": batch / tpot * 1e3,
        "timed_steps": len(walls),
        "context_len": float(np.median(contexts)),
        "modes": sorted(modes),
        **(kernels or {}),
    }


def step_bytes(engine: Engine, batch: int, context_len: float) -> tuple[int, int]:
    """Weight bytes and KV bytes one decode step of ``batch`` requests reads."""
    model, a = engine.runner.model, engine.runner.model_args
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if not a.tie_word_embeddings:  # only the B looked-up rows of the embedding table
        table = model.model.embed_tokens.weight
        weights += (batch - table.shape[0]) * table.shape[1] * table.element_size()
    itemsize = next(model.parameters()).element_size()
    kv_per_token = 2 * a.num_hidden_layers * a.num_key_value_heads * a.head_dim * itemsize
    return weights, round(batch * context_len * kv_per_token)


def step_flops(cost: dict, batch: int, context_len: float) -> float:
    """FLOPs of one decode step of ``batch`` requests at ``context_len`` (``step_cost``'s
    constants): every token's matmuls and lm_head row, and each (query, key) pair's attention."""
    per_token = cost["matmul_flops_per_token"] + cost["lm_head_flops_per_row"]
    return batch * per_token + cost["attn_flops_per_pair"] * batch * context_len


def rooflines(r: dict, bandwidth: float, peak: float | None) -> dict:
    """Memory and compute utilisation of a row, and the binding roof's bound over TPOT."""
    seconds = r["tpot_ms"] / 1e3
    t_mem = r["step_bytes"] / bandwidth
    t_comp = r["step_flops"] / peak if peak else 0.0
    return {
        "compute_utilisation": (r["step_flops"] / seconds / peak) if peak else None,
        "binding": "compute" if t_comp > t_mem else "memory",
        "roofline": max(t_mem, t_comp) / seconds,
    }


def engine_config(cuda: bool, batches: list[int], max_model_len: int, paths: dict | None):
    """The benchmark's engine: Triton kernels, async scheduling, staged writes, UVA and FULL
    graphs at exactly ``batches`` on a GPU (torch ops, no graphs on the CPU); ``paths``: its
    ``runner.decode_gemv`` etc."""
    seqs = max(batches)
    return RunnerConfig(
        device="cuda" if cuda else "cpu",
        kernels="triton" if cuda else "torch",
        async_scheduling=cuda,
        staged_writes=True,
        uva=cuda,
        cudagraph_mode="full" if cuda else "none",
        cudagraph_capture_sizes=tuple(sorted(set(batches))) if cuda else None,
        max_num_seqs=seqs,
        max_num_reqs=2 * seqs,
        max_num_batched_tokens=8192,
        max_model_len=max_model_len,
        num_kv_blocks=seqs * -(-max_model_len // 16) + 16,
        enable_prefix_caching=False,
        **(paths or {}),
    )


def variant_paths(mode: str, extras: tuple[str, ...]) -> dict:
    """The runner settings of a parsed variant (its module switches are set by ``main``)."""
    gemm = "triton" if "gemm" in extras else "cublas"
    return {
        "decode_gemv": mode,
        "decode_gemm": "narrow" if any(_extra(e) == "narrow" for e in extras) else gemm,
        "pdl": "pdl" in extras,
        "rope_in_attention": "fold" in extras,
        "split_kv": split_switches(extras)[0],
        "fused_mlp": "mlp" in extras,
    }


def run_preset(preset: str, args, bandwidth: float, paths: dict | None = None) -> list[dict]:
    """One engine of ``preset`` (``paths``: its ``runner.decode_gemv`` etc.), every batch size."""
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    max_model_len = args.max_model_len or args.prompt_len + args.output_len + 1
    config = engine_config(cuda, args.batches, max_model_len, paths)
    t0 = time.perf_counter()
    engine = Engine(config, ModelSpec(preset=preset))
    startup_s = time.perf_counter() - t0
    layers = engine.runner.model_args.num_hidden_layers
    gpu = torch.cuda.get_device_name() if cuda else None
    peak, peak_how = tensor_peak(gpu, str(engine.info.dtype).removeprefix("torch."))
    print(f"{preset}: tensor-core peak {peak_how}", flush=True)
    rows = []
    for b in args.batches:
        r = decode_run(engine, b, args.prompt_len, args.output_len, args.trace_steps)
        weights, kv = step_bytes(engine, b, r["context_len"])
        r.update(
            preset=preset,
            startup_s=startup_s,
            weight_bytes=weights,
            kv_bytes=kv,
            step_bytes=weights + kv,
            achieved_bytes_per_s=(weights + kv) / (r["tpot_ms"] / 1e3),
        )
        r["utilisation"] = r["achieved_bytes_per_s"] / bandwidth
        r["step_flops"] = step_flops(engine.info.step_cost, b, r["context_len"])
        r["tensor_peak_flops"] = peak
        r.update(rooflines(r, bandwidth, peak))
        if "graph_kernels_per_step" in r:
            r["graph_kernels_per_layer"] = r["graph_kernels_per_step"] / layers
        if r.get("ops_per_step"):  # decode_trace.py: each op against its roof
            pairs = b * r["context_len"]
            r["op_roofs"] = op_roofs(r["ops_per_step"], engine.info.step_cost["ops"],
                                     (b, b, pairs, pairs), bandwidth, peak)  # fmt: skip
        rows.append(r)
        print(
            f"{preset:11} batch {b:4d}: TPOT {r['tpot_ms']:7.3f} ms {r['tok_s']:9,.0f} tok/s  "
            f"reads {r['step_bytes'] / 1e9:6.3f} GB ({kv / 1e9:.3f} KV) -> "
            f"{r['achieved_bytes_per_s'] / 1e9:6,.0f} GB/s = {100 * r['utilisation']:4.1f}%  "
            f"{r['step_flops'] / 1e9:,.1f} GFLOP = {_pct(r['compute_utilisation'])} of the "
            f"tensor peak; {r['binding']}-bound roofline {100 * r['roofline']:4.1f}%  "
            f"kernels/step graph {r.get('graph_kernels_per_step', 0):.0f} "
            f"({r.get('graph_kernels_per_layer', 0):.1f}/layer) eager "
            f"{r.get('eager_kernels_per_step', 0):.0f}  dispatch {','.join(r['modes'])}",
            flush=True,
        )
    notes = list(engine.info.notes)
    for r in rows:
        r["notes"] = notes
    del engine
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(rows: list[dict], bandwidth: float, gib: float) -> str:
    lines = [
        f"HBM read bandwidth (torch.sum over {gib:g} GiB bf16, best of 10): "
        f"{bandwidth / 1e9:,.0f} GB/s",
        "",
        "| preset | batch 1 path | batch | TPOT ms | tok/s | GB read / step | of it KV | GB/s "
        "| utilisation | GFLOP / step | of tensor peak | binding roof | roofline "
        "| graph kernels / step | / layer | in-graph gaps µs / step | eager kernels / step |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r.get('decode_gemv', '')} | {r['batch']} | "
            f"{r['tpot_ms']:.3f} | {r['tok_s']:,.0f} | "
            f"{r['step_bytes'] / 1e9:.3f} | {r['kv_bytes'] / 1e9:.3f} | "
            f"{r['achieved_bytes_per_s'] / 1e9:,.0f} | {100 * r['utilisation']:.1f}% | "
            f"{r['step_flops'] / 1e9:,.1f} | {_pct(r['compute_utilisation'])} | "
            f"{r['binding']} | {100 * r['roofline']:.1f}% | "
            f"{r.get('graph_kernels_per_step', 0):.0f} | "
            f"{r.get('graph_kernels_per_layer', 0):.1f} | "
            f"{r.get('graph_gap_us_per_step', 0):.0f} | "
            f"{r.get('eager_kernels_per_step', 0):.0f} |"
        )
    lines += ["", "Most device time per step (batch 1):"]
    for r in rows:
        if r["batch"] == min(x["batch"] for x in rows) and r.get("top_kernels"):
            top = "; ".join(
                f"{k['kernel'][:60]} {k['us_per_step']:.0f} µs x{k['calls_per_step']:.0f}"
                for k in r["top_kernels"][:5]
            )
            lines.append(f"- {r['preset']} ({r.get('decode_gemv', '')}): {top}")
    lines += ["", "Most time to gain per step (an op's device time over its roof's bound):"]
    for r in rows:
        if r.get("op_roofs"):
            far = "; ".join(
                f"{o['op']} {o['us']:.0f} µs at {100 * o['of_roof']:.0f}% of its roof "
                f"({o['to_gain_us']:.0f} µs, {BOUND[o.get('launch_bound')]})"
                for o in r["op_roofs"][:3]
            )
            gaps = r.get("graph_gap_us_per_step", 0)
            head = f"- {r['preset']} ({r.get('decode_gemv', '')}) batch {r['batch']}"
            lines.append(f"{head}: {far}; in-graph gaps {gaps:.0f} µs")
    return "\n".join(lines)


VARIANT_EXTRAS = (
    "pdl", "fold", "gemm", "narrow", "lastred", "ms", "gsilu", "oan", "xoan", "dan", "split",
    "mink", "keys", "siluw", "gv", "ww", "ws", "wr", "ds", "ls", "bk", "lt", "mlp",
)  # fmt: skip


def _extra(e: str) -> str | None:
    """An extra's name (``splitN``: ``split`` with N forced splits; ``minkN``: split-KV's
    ``MIN_CHUNK_KEYS`` set to N >= 1; ``keysN``: the decode attention kernels' key tile set to
    N for every grid, ``DECODE_KEYS`` and ``WIDE_DECODE_KEYS``, a power of two >= 16), None if
    unknown."""
    if e.startswith("narrow") and (e[6:] == "" or e[6:] in ("16", "32", "64", "128", "256")):
        return "narrow"
    if e.startswith("ms"):  # the decode GEMM's fewest K steps a split (MIN_STEPS_PER_SPLIT)
        return "ms" if e[2:].isdigit() and 1 <= int(e[2:]) <= 64 else None
    if e.startswith("split") and e[5:].isdigit() and int(e[5:]) >= 1:
        return "split"
    if e.startswith("mink") and e[4:].isdigit() and int(e[4:]) >= 1:
        return "mink"
    if e.startswith("siluw"):
        return "siluw" if e[5:] in ("1", "2", "4", "8", "16") else None
    if e.startswith("ww"):  # the wide decode grid's warps (WIDE_DECODE_WARPS)
        return "ww" if e[2:] in ("1", "2", "4", "8") else None
    if e[:2] in ("ws", "ds"):  # the wide / narrow decode grid's stages (WIDE_DECODE_STAGES, ...)
        return e[:2] if e[2:] in ("1", "2", "3", "4", "5", "6") else None
    if e.startswith("wr"):  # the wide decode grid's register cap (WIDE_DECODE_MAXNREG)
        return "wr" if e[2:] in ("64", "80", "96", "128", "168") else None
    if e.startswith("gv"):  # the most rows the decode path gives the GEMV (gemv_triton.GEMV_ROWS)
        return "gv" if e[2:] in ("1", "2", "3", "4") else None
    if e.startswith("ls"):  # the batch-1 GEMV's pipelined walk of K (gemv_triton.LOOP_STAGES)
        return "ls" if e[2:] in ("2", "3", "4", "5", "6") else None
    if e.startswith("bk"):  # the batch-1 GEMV's step of K (gemv_triton.M1_BLOCK_K)
        return "bk" if e[2:] in ("256", "512", "1024", "2048", "4096") else None
    if e.startswith("keys") and e[4:].isdigit() and int(e[4:]) >= 16:
        return "keys" if int(e[4:]) & (int(e[4:]) - 1) == 0 else None
    return e if e in VARIANT_EXTRAS else None


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """``MODE[+pdl][+fold][+gemm|+narrow|+narrowN][+lastred][+msN][+gsilu][+oan|+xoan][+dan]``
    ``[+split|+splitN][+minkN][+keysN][+siluwN][+gvN][+wwN][+wsN][+wrN][+dsN][+lsN][+bkN][+lt]``
    ``[+mlp]``
    -> (GEMV mode, the extras switched on, in order).
    ``split``: split-KV decode attention's policy on (``runner.split_kv``); ``splitN``: every decode
    batch split N ways (``FORCED_SPLITS``). Without either, split-KV is off (the variants name every
    path they take). ``gemm``: the Triton decode GEMM for the projections of 2-256 rows
    (``runner.decode_gemm``); ``narrow`` / ``narrowN``: only for those of at most 1,024 outputs and
    2-64 (2-N) rows (``runner.decode_gemm: narrow``, ``NARROW_GEMM``), cuBLAS the others;
    ``lastred``: its split tiles summed by their last split, in one launch
    (``LAST_SPLIT_REDUCES``); ``msN``: each of its splits walks at least N steps of K
    (``MIN_STEPS_PER_SPLIT``, default 2; a large N: no split, no reduction launch); ``gsilu``:
    the down projection on it makes ``silu(gate) * up`` as it reads it, no SiLU-and-mul launch
    (``projections_triton.DOWN_SILU_MUL``); ``oan``: the o projection on it summed, added into the
    residual stream and normalised by one kernel after it (``O_ADD_NORM``, on by default),
    ``xoan`` the same off (the split reduction, then the add + norm kernel); ``dan``: the down
    projection on it the same, normalised for the next layer (``DOWN_ADD_NORM``; its input from
    ``gsilu``'s prologue, or without it from the SiLU-and-mul launch). ``minkN``: a
    split takes at least N keys of a request's context (``MIN_CHUNK_KEYS``). ``siluwN``: the batch-1
    GEMV with the SiLU-and-mul prologue launched with N warps (``SILU_MUL_WARPS``). ``gvN``: the
    decode path's GEMV (and its prologues) for projections of up to N rows, 1-4 (``GEMV_ROWS``,
    default 1: cuBLAS or the decode GEMM above one row). ``wwN`` /
    ``wsN``: the folded decode attention on a wide grid (more programs than SMs) launched with N
    warps / N pipeline stages, ``wrN`` at most N registers a thread (``WIDE_DECODE_MAXNREG``,
    ptxas's ``maxnreg``); ``dsN``: on a narrow grid with N stages (``DECODE_STAGES``). ``lsN``: the
    batch-1 GEMV's walk of K software-pipelined over N stages (``LOOP_STAGES``); ``bkN``: its step N
    elements of K (``M1_BLOCK_K``). ``lt``: torch's cuBLAS matmuls through cuBLASLt
    (``torch.backends.cuda.preferred_blas_library``), the wide batches' projections. ``mlp``: the
    batch-1 MLP in one launch (``runner.fused_mlp``, ``mlp_decode_triton.py``)."""
    mode, *extras = text.split("+")
    if mode not in DECODE_GEMV_MODES or None in map(_extra, extras) or {"oan", "xoan"} <= {*extras}:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected MODE[+pdl][+fold][+gemm|+narrow|+narrowN][+lastred][+msN][+gsilu]"
            "[+oan|+xoan][+dan]"
            "[+split|+splitN][+minkN][+keysN][+siluwN][+gvN][+wwN][+wsN][+wrN][+dsN][+lsN][+bkN]"
            "[+lt]"
            "[+mlp], MODE one of "
            f"{', '.join(DECODE_GEMV_MODES)}"
        )
    order = {name: i for i, name in enumerate(VARIANT_EXTRAS)}
    return mode, tuple(sorted(extras, key=lambda e: order[_extra(e)]))


def extra_int(extras: tuple[str, ...], name: str, default: int) -> int:
    """N of a variant's ``nameN`` extra (``keys``, ``mink``), else ``default``."""
    return next((int(e[len(name) :]) for e in extras if _extra(e) == name), default)


def narrow_gemm(extras: tuple[str, ...]) -> tuple[int, tuple[tuple[int, int], ...]]:
    """``NARROW_GEMM`` of a variant: its rows 2-N where it names ``narrowN``."""
    features, rows = projections_triton.NARROW_GEMM
    n = next((int(e[6:]) for e in extras if e.startswith("narrow") and e[6:]), None)
    return features, rows if n is None else ((2, n),)


def split_switches(extras: tuple[str, ...]) -> tuple[bool, int | None]:
    """(``runner.split_kv``, ``FORCED_SPLITS``) of a variant's extras."""
    for e in extras:
        if e == "split":
            return True, None
        if e.startswith("split"):
            return True, int(e[5:])
    return False, None


@contextlib.contextmanager
def variant_switches(extras: tuple[str, ...]):
    """A variant's module switches, which are not runner settings, set for the ``with`` block
    and restored after it: forced splits, the decode kernels' key tiles (narrow and wide grids),
    split-KV's fewest keys a split, the batch-1 GEMV's SiLU-and-mul warps, loop stages and step
    of K, the wide grid's warps and stages, the decode GEMM's rows, its one-launch splits,
    fewest steps of K a split, SiLU-and-mul prologue and add + norm epilogue kernel, and torch's
    BLAS library."""
    split, attn, gemv = attention_split_kv_triton, attention_triton, gemv_triton
    proj, gemm = projections_triton, gemm_decode_triton
    switches = [  # (module, name, the variant's value)
        (split, "FORCED_SPLITS", split_switches(extras)[1]),
        (attn, "DECODE_KEYS", extra_int(extras, "keys", attn.DECODE_KEYS)),
        (attn, "WIDE_DECODE_KEYS", extra_int(extras, "keys", attn.WIDE_DECODE_KEYS)),
        (split, "MIN_CHUNK_KEYS", extra_int(extras, "mink", split.MIN_CHUNK_KEYS)),
        (gemv, "SILU_MUL_WARPS", extra_int(extras, "siluw", gemv.SILU_MUL_WARPS)),
        (gemv, "GEMV_ROWS", extra_int(extras, "gv", gemv.GEMV_ROWS)),
        (gemv, "LOOP_STAGES", extra_int(extras, "ls", gemv.LOOP_STAGES)),
        (gemv, "M1_BLOCK_K", extra_int(extras, "bk", gemv.M1_BLOCK_K)),
        (attn, "WIDE_DECODE_WARPS", extra_int(extras, "ww", attn.WIDE_DECODE_WARPS)),
        (attn, "WIDE_DECODE_STAGES", extra_int(extras, "ws", attn.WIDE_DECODE_STAGES)),
        (attn, "WIDE_DECODE_MAXNREG", extra_int(extras, "wr", attn.WIDE_DECODE_MAXNREG)),
        (attn, "DECODE_STAGES", extra_int(extras, "ds", attn.DECODE_STAGES)),
        (proj, "NARROW_GEMM", narrow_gemm(extras)),
        (gemm, "LAST_SPLIT_REDUCES", "lastred" in extras),
        (gemm, "MIN_STEPS_PER_SPLIT", extra_int(extras, "ms", gemm.MIN_STEPS_PER_SPLIT)),
        (proj, "DOWN_SILU_MUL", "gsilu" in extras),
        (proj, "O_ADD_NORM", "oan" in extras or (proj.O_ADD_NORM and "xoan" not in extras)),
        (proj, "DOWN_ADD_NORM", "dan" in extras),
    ]
    before = [(module, name, getattr(module, name)) for module, name, _ in switches]
    blas = torch.backends.cuda.preferred_blas_library()
    try:
        for module, name, value in switches:
            setattr(module, name, value)
        if "lt" in extras:
            torch.backends.cuda.preferred_blas_library("cublaslt")
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(blas)
        for module, name, value in before:
            setattr(module, name, value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--preset",
        action="append",
        choices=sorted(PRESETS) + sorted(SHIPPED),
        help="repeatable; a shipped real model (smollm2-135m) is dequantized to bf16 at load, so "
        "its step reads bf16 weights like a preset's",
    )
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the engine's max_model_len (default: prompt + output + 1); the split-KV policy "
        "reads its split count from this bound, not from the batch's own contexts",
    )
    ap.add_argument("--trace-steps", type=int, default=5, help="steps in the profiler window")
    ap.add_argument("--bandwidth-gib", type=float, default=4.0, help="size of the summed tensor")
    ap.add_argument("--cpu-smoke", action="store_true", help="llama-tiny on the CPU, tiny sizes")
    ap.add_argument(
        "--decode-gemv",
        action="append",
        choices=DECODE_GEMV_MODES,
        help="batch-1 projection path(s) to compare, one engine each (default: plain)",
    )
    ap.add_argument(
        "--pdl",
        action="append",
        choices=("off", "on"),
        help="the model's Triton kernels launched with programmatic dependent launch "
        "(runner.pdl), one engine each; repeat to compare (default: off)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        help="MODE[+pdl][+fold][+gemm|+narrow|+narrowN][+lastred][+msN][+gsilu][+oan|+xoan][+dan]"
        "[+split|+splitN]"
        "[+minkN]"
        "[+keysN][+siluwN][+gvN][+wwN][+wsN][+wrN][+dsN][+lsN][+bkN][+lt][+mlp]:"
        " runner.decode_gemv MODE, with runner.pdl, runner.rope_in_attention, runner.decode_gemm:"
        " triton (narrow: narrow, for projections of at most 1,024 outputs and 2-64"
        " (2-N) rows;"
        " lastred: its split tiles summed by their last split, one launch; msN: each split at"
        " least N steps of K, default 2; gsilu: the down projection's SiLU-and-mul as its"
        " prologue; oan: the o projection's reduction, residual add and norm one kernel (the"
        " default; xoan: two launches); dan:"
        " the down projection's, with the next layer's input norm),"
        " runner.split_kv (or N forced splits), at least N keys of a context a split "
        "(default: one key tile), N keys a step in the decode attention kernels (default: 128 "
        "where requests x kv heads fit the SMs, else 64) and/or N warps in the batch-1 GEMV with "
        "SiLU-and-mul (default 8), the decode GEMV for up to N rows (gv, 1-4, default 1), "
        "N warps / N stages in the folded decode attention on a wide "
        "grid (default 2 / 3) and at most N registers a thread there (wr, default uncapped), N "
        "stages on a narrow one (ds, default 3), N loop stages / N "
        "elements of K a step in the batch-1 GEMV (default unpipelined / 1,024), torch's "
        "matmuls through cuBLASLt (lt); the paths not named "
        "are off; "
        "one engine each; repeatable; replaces the --decode-gemv x --pdl product",
    )
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    if args.cpu_smoke:
        torch.set_num_threads(1)
        args.preset = args.preset or ["llama-tiny"]
        args.batches, args.prompt_len, args.output_len, args.trace_steps = [1, 4], 8, 12, 2
        args.bandwidth_gib = 1 / 16
    elif not torch.cuda.is_available():
        raise SystemExit("decode_roofline: needs a CUDA device (or --cpu-smoke)")
    presets = args.preset or ["llama-1b", "qwen3-0.6b", "llama-3-8b"]
    bandwidth = read_bandwidth(int(args.bandwidth_gib * 2**30))
    print(f"HBM read bandwidth (torch.sum, best of 10): {bandwidth / 1e9:,.0f} GB/s", flush=True)
    rows = []
    modes = args.decode_gemv or [projections_triton.DECODE_GEMV]
    variants = args.variant or [
        parse_variant(mode if pdl == "off" else f"{mode}+pdl")
        for mode in modes
        for pdl in args.pdl or ["off"]
    ]
    for preset in presets:
        for mode, extras in variants:  # one engine each: the runner's decode-path settings
            paths = variant_paths(mode, extras)
            path = "+".join((mode, *extras))
            with variant_switches(extras):
                found = run_preset(preset, args, bandwidth, paths)
            rows += [{**r, "decode_gemv": path} for r in found]
    print(markdown(rows, bandwidth, args.bandwidth_gib))
    meta = {
        "read_bytes_per_s": bandwidth,
        "prompt_len": args.prompt_len,
        "max_model_len": args.max_model_len,  # None: prompt + output + 1
        "output_len": args.output_len,
        "trace_steps": args.trace_steps,
    }
    write_results(args.out, meta, rows)


if __name__ == "__main__":
    main()
