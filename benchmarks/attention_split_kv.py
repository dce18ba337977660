"""Split-KV decode attention against the unsplit decode kernel on one GPU.

Times ``paged_decode_triton`` (one program per request and kv head) and ``paged_decode_split_kv``
at each split count (the fused reduce, and with ``--two-launch`` the two-launch reduce too) on
uniform decode batches (batch 1, 8, 64 by default) at contexts 512, 2048 and 8192, with the
attention shapes of llama-1b and llama-3-8b, both sides in one invocation (µs per launch in a
CUDA graph of 20 launches, ``graph_timing.py``: the kernels as a FULL step runs them, not the
host's launch cost, which made the small rows of earlier runs noise). Before timing, each split
variant's output is checked against the unsplit kernel's. Prints a markdown table with each
row's time, its speed-up over the unsplit kernel, the achieved KV-read bandwidth, and which
count the proposed policy (``proposed_split_count``, off by default in ``split_count``) would
pick. The batches come from tests/runner/attention_batches.py.

    python benchmarks/attention_split_kv.py --out split_kv.json
    python benchmarks/attention_split_kv.py --presets llama-1b --batches 1 --two-launch
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
from bench_io import write_results
from graph_timing import in_graph_us

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runner"))
from attention_batches import Batch, make_batch  # noqa: E402

from mrv2_prof.runner.model import PRESETS  # noqa: E402
from mrv2_prof.runner.model.attention_decode_triton import paged_decode_triton  # noqa: E402
from mrv2_prof.runner.model.attention_split_kv_triton import (  # noqa: E402
    num_sms,
    paged_decode_split_kv,
    proposed_split_count,
)
from mrv2_prof.runner.model.attention_triton import DECODE_TILES, FLOAT32_TILES  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def time_us(fn) -> float:
    """µs per launch inside a CUDA graph (``graph_timing.py``: not the host's launch cost)."""
    return in_graph_us(fn)


def kv_bytes(batch: Batch) -> float:
    """Bytes of K and V a decode batch reads: every cached key of every request, once."""
    _, num_kv_heads, head_dim = batch.kv_cache.shape[2:]
    tokens = float(batch.meta.seq_lens_np.sum())
    return 2 * tokens * num_kv_heads * head_dim * batch.kv_cache.element_size()


def bench_case(batch: Batch, counts: list[int], two_launch: bool, proposed: int) -> list[dict]:
    meta = batch.meta
    keys = (FLOAT32_TILES if batch.query.dtype == torch.float32 else DECODE_TILES).block_n
    out = torch.empty_like(batch.query)
    args = (batch.query, batch.kv_cache, meta, batch.scale, out)
    variants = [("unsplit", 1, lambda: paged_decode_triton(*args, block_n=keys))]
    for n in counts:
        for fused in (True, False) if two_launch else (True,):
            name = f"split {n}" + ("" if fused else " two-launch")
            variants.append(
                (
                    name,
                    n,
                    lambda n=n, f=fused: paged_decode_split_kv(
                        *args, num_splits=n, block_n=keys, fused=f
                    ),
                )
            )
    tol = 1e-4 if batch.query.dtype == torch.float32 else 2e-2
    expected = variants[0][2]().clone()
    rows, base_us = [], None
    for name, n, fn in variants:
        torch.testing.assert_close(
            fn(), expected, atol=tol, rtol=tol, msg=lambda m, v=name: f"{v}: {m}"
        )
        us = time_us(fn)
        base_us = base_us or us
        rows.append(
            {
                "variant": name,
                "num_splits": n,
                "kernel_us": us,
                "speedup": base_us / us,
                "kv_gb_per_s": kv_bytes(batch) / us * 1e-3,
                "proposed": n == proposed,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["llama-1b", "llama-3-8b"])
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--splits", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    ap.add_argument("--two-launch", action="store_true", help="also time the two-launch reduce")
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attention_split_kv benchmark: needs a CUDA device")

    dtype, cuda = DTYPES[args.dtype], torch.device("cuda")
    sms = num_sms(cuda)
    rows = []
    for preset in args.presets:
        model = PRESETS[preset]
        kvh, d = model.num_key_value_heads, model.head_dim
        group = model.num_attention_heads // kvh
        for ctx in args.contexts:
            for b in args.batches:
                batch = make_batch([(ctx, 1)] * b, kvh, group, d, args.block_size, dtype, cuda)
                # the policy's bound is the block table's width, as paged_attention_triton's
                max_context = batch.meta.block_table.shape[1] * args.block_size
                proposed = proposed_split_count(b, kvh, max_context, sms)
                counts = sorted({*args.splits, proposed} - {1})
                for row in bench_case(batch, counts, args.two_launch, proposed):
                    rows.append({"preset": preset, "batch": b, "context": ctx, **row})
                del batch
                torch.cuda.empty_cache()

    print(
        f"\n{torch.cuda.get_device_name()} ({sms} SMs), {args.dtype}, block_size={args.block_size}"
    )
    print(f"torch {torch.__version__}, triton {triton.__version__}\n")
    print("| preset | batch | context | variant | kernel (µs) | vs unsplit | KV GB/s | policy |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        print(
            f"| {r['preset']} | {r['batch']} | {r['context']} | {r['variant']} "
            f"| {r['kernel_us']:.1f} | {r['speedup']:.2f}x | {r['kv_gb_per_s']:.0f} "
            f"| {'proposed' if r['proposed'] else ''} |"
        )
    if args.out:
        meta = {"dtype": args.dtype, "block_size": args.block_size, "sms": sms}
        write_results(args.out, meta, rows)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
