"""Triton paged attention against the torch reference on one GPU, at a preset's shapes.

Times ``paged_attention_triton`` (µs per launch in a CUDA graph of 20, ``graph_timing.py``: the
kernel as a FULL step runs it, not the host's launch cost) and ``paged_attention_ref`` (median of
``triton.testing.do_bench``: it reads host-side lengths and cannot be captured) for uniform
decode batches at a fixed context and one fresh prefill chunk, and
prints a markdown table with the speed-up and the kernel's achieved KV bandwidth (decode) or
attention TFLOP/s (prefill). The batches and the reference come from
tests/runner/attention_batches.py.

    python benchmarks/attention_triton.py --out attention.json
    python benchmarks/attention_triton.py --sweep   # also every tile shape, to tune pick_tiles

A decode batch (no more tokens than requests) runs the decode kernel by default; the sweep's
rows force the general kernel with each tile shape (``tiles=``), the first of them its decode
tiles (16x64 w4 s3), which decode batches took before the decode kernel, and then the decode
kernel's own launch shapes (keys per step, warps, stages: ``DECODE_SWEEP``). Each decode batch
also has two rows for ``runner.rope_in_attention``: the RoPE kernel (QK-norm with Qwen3's
weights where the preset has them, and the KV write) then the decode kernel, against the decode
kernel doing both (``attention_decode_rope_triton.py``), on the same q, k, v and cache.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.testing
from bench_io import write_results
from graph_timing import in_graph_us

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runner"))
from attention_batches import Batch, make_batch  # noqa: E402

from mrv2_prof.runner.model import PRESETS  # noqa: E402
from mrv2_prof.runner.model.attention import paged_attention_ref  # noqa: E402
from mrv2_prof.runner.model.attention_decode_triton import is_decode_batch  # noqa: E402
from mrv2_prof.runner.model.attention_triton import (  # noqa: E402
    DECODE_TILES,
    PREFILL_TILES,
    AttentionTiles,
    paged_attention_triton,
    pick_tiles,
)

SWEEP_TILES = [
    DECODE_TILES,
    PREFILL_TILES,
    AttentionTiles(16, 128),
    AttentionTiles(32, 64),
    AttentionTiles(64, 32),
    AttentionTiles(128, 64, num_warps=8),
    AttentionTiles(64, 64, num_stages=2),
    # decode at short contexts: fewer stages, more programs per SM
    AttentionTiles(16, 64, num_stages=2),
    AttentionTiles(16, 64, num_warps=2, num_stages=2),
    AttentionTiles(16, 32, num_stages=2),
    AttentionTiles(16, 32, num_warps=2, num_stages=2),
    AttentionTiles(16, 128, num_stages=2),
    AttentionTiles(16, 64, num_stages=1),
]
DECODE_SWEEP = [  # (keys per step, warps, stages) of the decode kernel
    (bn, w, st) for bn in (32, 64, 128) for w in (2, 4, 8) for st in (2, 3, 4)
]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def time_us(fn) -> float:
    """µs per launch inside a CUDA graph (``graph_timing.py``: not the host's launch cost)."""
    return in_graph_us(fn)


def eager_us(fn) -> float:
    """µs per call launched from Python (the reference: host lengths, no graph)."""
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def work(batch: Batch) -> tuple[float, float]:
    """(bytes of K/V read, attention FLOPs) of a batch, counting causally visible keys only."""
    _, num_heads, head_dim = batch.query.shape
    num_kv_heads = batch.kv_cache.shape[3]
    itemsize = batch.kv_cache.element_size()
    qsl, seq = batch.meta.query_start_loc_np, batch.meta.seq_lens_np
    kv_tokens = float(seq.sum())
    visible = 0.0
    for i in range(batch.meta.num_reqs):
        q_len = int(qsl[i + 1] - qsl[i])
        ctx = int(seq[i]) - q_len
        visible += q_len * ctx + q_len * (q_len + 1) / 2
    kv_bytes = 2 * kv_tokens * num_kv_heads * head_dim * itemsize
    return kv_bytes, 4 * visible * num_heads * head_dim


def fold_rows(name: str, batch: Batch, qk_norm: bool) -> list[dict]:
    """The RoPE kernel then the decode kernel, against the decode kernel with RoPE folded in."""
    from mrv2_prof.runner.model.attention_decode_rope_triton import paged_decode_rope_triton
    from mrv2_prof.runner.model.attention_decode_triton import paged_decode_triton
    from mrv2_prof.runner.model.rotary_triton import qk_norm_rope_triton, rope_cos_sin_cache

    q, k, v, cache, meta = batch.query, batch.key, batch.value, batch.kv_cache, batch.meta
    d = q.shape[-1]
    table = rope_cos_sin_cache(1.0 / 10000 ** (torch.arange(0, d, 2, device=q.device) / d), 8192)
    cos, sin, pos = table[:, : d // 2], table[:, d // 2 :], (meta.seq_lens - 1).long()
    w = (torch.ones(d, device=q.device, dtype=q.dtype),) * 2 if qk_norm else (None, None)
    out = torch.empty_like(q)

    def two():
        qk_norm_rope_triton(q, k, cos, sin, pos, *w, v=v, kv_cache=cache,
                            slot_mapping=meta.slot_mapping)  # fmt: skip
        paged_decode_triton(q, cache, meta, batch.scale, out)

    def one():
        paged_decode_rope_triton(q, k, v, cos, sin, pos, *w, 1e-6, cache, meta, batch.scale)

    base = {"case": name, "num_reqs": meta.num_reqs, "num_tokens": meta.num_tokens,
            "default_tiles": True, "reference_us": None, "speedup": None}  # fmt: skip
    kv_bytes, flops = work(batch)
    rows = []
    for label, fn in (("RoPE kernel + decode kernel", two), ("decode kernel, RoPE folded", one)):
        us = time_us(fn)
        rows.append({**base, "tiles": label, "kernel_us": us, "kv_gb_per_s": kv_bytes / us * 1e-3,
                     "tflop_per_s": flops / us * 1e-6})  # fmt: skip
    return rows


def decode_sweep_rows(name: str, batch: Batch) -> list[dict]:
    """The decode kernel at each of ``DECODE_SWEEP``'s launch shapes."""
    from mrv2_prof.runner.model.attention_decode_triton import paged_decode_triton

    meta, out = batch.meta, torch.empty_like(batch.query)
    kv_bytes, flops = work(batch)
    rows = []
    for bn, w, st in DECODE_SWEEP:
        us = time_us(lambda bn=bn, w=w, st=st: paged_decode_triton(
            batch.query, batch.kv_cache, meta, batch.scale, out, block_n=bn, num_warps=w,
            num_stages=st))  # fmt: skip
        rows.append({
            "case": name, "num_reqs": meta.num_reqs, "num_tokens": meta.num_tokens,
            "tiles": f"decode kernel {bn} keys w{w} s{st}", "default_tiles": False,
            "kernel_us": us, "reference_us": None, "speedup": None,
            "kv_gb_per_s": kv_bytes / us * 1e-3, "tflop_per_s": flops / us * 1e-6,
        })  # fmt: skip
    return rows


def bench_case(name: str, batch: Batch, sweep: bool, skip_ref: bool) -> list[dict]:
    meta, n = batch.meta, batch.meta.num_tokens
    args = (batch.query, batch.key, batch.value, batch.kv_cache, meta, batch.scale)
    ref_us = None if skip_ref else eager_us(lambda: paged_attention_ref(*args))
    decode = is_decode_batch(n, meta.num_reqs)  # the default takes the decode kernel
    default = None if decode else pick_tiles(n, meta.num_reqs, batch.query.dtype)
    kv_bytes, flops = work(batch)
    rows = []
    for tiles in [default] + ([t for t in SWEEP_TILES if t != default] if sweep else []):
        us = time_us(lambda t=tiles: paged_attention_triton(*args, tiles=t))
        rows.append(
            {
                "case": name,
                "num_reqs": meta.num_reqs,
                "num_tokens": n,
                "tiles": "decode kernel"
                if tiles is None
                else f"{tiles.block_m}x{tiles.block_n} w{tiles.num_warps} s{tiles.num_stages}",
                "default_tiles": tiles == default,
                "kernel_us": us,
                "reference_us": ref_us,
                "speedup": ref_us / us if ref_us else None,
                "kv_gb_per_s": kv_bytes / us * 1e-3,
                "tflop_per_s": flops / us * 1e-6,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--decode-batches", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--context", type=int, default=1024, help="context length of each decode")
    ap.add_argument("--prefill", type=int, default=2048, help="tokens of the prefill chunk")
    ap.add_argument("--sweep", action="store_true", help="also time every tile shape")
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attention_triton benchmark: needs a CUDA device")

    model = PRESETS[args.preset]
    kvh, d = model.num_key_value_heads, model.head_dim
    group = model.num_attention_heads // kvh
    dtype, cuda = DTYPES[args.dtype], torch.device("cuda")
    cases = [
        (f"decode B={b} ctx={args.context}", [(args.context, 1)] * b) for b in args.decode_batches
    ]
    cases.append((f"prefill {args.prefill} tokens", [(0, args.prefill)]))
    rows = []
    for name, reqs in cases:
        batch = make_batch(reqs, kvh, group, d, args.block_size, dtype, cuda)
        rows += bench_case(name, batch, args.sweep, args.skip_reference)
        if is_decode_batch(batch.meta.num_tokens, batch.meta.num_reqs):
            rows += fold_rows(name, batch, model.qk_norm)
            rows += decode_sweep_rows(name, batch) if args.sweep else []
        del batch
        torch.cuda.empty_cache()

    device = torch.cuda.get_device_name()
    print(
        f"\n{device}, {args.preset} (h={model.num_attention_heads}, kvh={kvh}, d={d}), {args.dtype}"
    )
    print(f"block_size={args.block_size}, torch {torch.__version__}, triton {triton.__version__}\n")
    print("| case | tiles | kernel (µs) | reference (µs) | speed-up | KV GB/s | TFLOP/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        ref = f"{r['reference_us']:.1f}" if r["reference_us"] else "-"
        speedup = f"{r['speedup']:.1f}x" if r["speedup"] else "-"
        mark = "" if r["default_tiles"] else " (sweep)"
        print(
            f"| {r['case']} | {r['tiles']}{mark} | {r['kernel_us']:.1f} | {ref} | {speedup} "
            f"| {r['kv_gb_per_s']:.0f} | {r['tflop_per_s']:.1f} |"
        )
    if args.out:
        meta = {"preset": args.preset, "dtype": args.dtype, "block_size": args.block_size}
        write_results(args.out, meta, rows)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
