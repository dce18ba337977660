"""Where a short-context decode attention's time goes: the decode kernel's tiles swept, with the
KV in L2 and not, against an empty launch, on one GPU.

At batch 1 and a short context the decode attention kernel (``paged_decode_triton``: a program
per request and kv head, 8 programs for llama-1b) takes 6-10 µs a layer in a model's step, at
1-3 % of its bandwidth roof (``decode_roofline.py``' per-op table). This times the kernel alone
in a CUDA graph (``graph_timing.py``) for each (keys per loop step, warps, pipeline stages), at
the attention shapes of the given presets, batches and contexts, two ways:

* ``hot``: the same batch each launch (its KV stays in L2, a lower bound);
* ``cold``: a different copy of the batch each launch, the copies' KV together over twice the
  L2 (as a model's step reads each layer's KV once, after the weights have gone through L2).

``empty`` is a one-program kernel that stores one value: the floor of a launch in a graph. Each
configuration's output is checked against the default configuration's before timing. Prints a
markdown table per case (µs per launch, the KV bandwidth) and the best configuration.

    python benchmarks/decode_attention_tiles.py --out tiles.json
    python benchmarks/decode_attention_tiles.py --presets llama-1b --batches 1 --contexts 160
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from bench_io import write_results
from graph_timing import graph_time_us, in_graph_us

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runner"))
from attention_batches import Batch, make_batch  # noqa: E402

from mrv2_prof.runner.model import PRESETS  # noqa: E402
from mrv2_prof.runner.model.attention_decode_triton import paged_decode_triton  # noqa: E402
from mrv2_prof.runner.model.attention_split_kv_triton import paged_decode_split_kv  # noqa: E402

DEFAULT = (64, 4, 3)  # (keys per step, warps, stages): the kernel's defaults
L2_BYTES = 50 * 2**20  # an H100's / H200's L2


@triton.jit
def _empty_kernel(out_ptr):
    tl.store(out_ptr, 1.0)


def kv_bytes(batch: Batch) -> float:
    """Bytes of K and V a decode batch reads: every cached key of every request, once."""
    _, num_kv_heads, head_dim = batch.kv_cache.shape[2:]
    keys = float(batch.meta.seq_lens_np.sum())
    return 2 * keys * num_kv_heads * head_dim * batch.kv_cache.element_size()


def copies_of(batch: Batch, n: int) -> list[Batch]:
    """``n`` batches of the same shape, each over its own cache (the same values)."""
    return [dataclasses.replace(batch, kv_cache=batch.kv_cache.clone()) for _ in range(n)]


def bench(batch: Batch, copies: list[Batch], configs, splits) -> list[dict]:
    def call(b: Batch, cfg, out):
        n, w, s = cfg
        return paged_decode_triton(b.query, b.kv_cache, b.meta, b.scale, out, block_n=n,
                                   num_warps=w, num_stages=s)  # fmt: skip

    def call_split(b: Batch, k, out):
        return paged_decode_split_kv(b.query, b.kv_cache, b.meta, b.scale, out, num_splits=k)

    out = torch.empty_like(batch.query)
    want = call(batch, DEFAULT, torch.empty_like(batch.query)).clone()
    rows = []
    variants = [(f"tiles {c}", c, call) for c in configs]
    variants += [(f"split {k}", k, call_split) for k in splits]
    for name, cfg, fn in variants:
        try:
            got = fn(batch, cfg, out)
        except Exception as e:  # a configuration this triton cannot build: shown, not timed
            rows.append({"variant": name, "error": f"{type(e).__name__}: {str(e)[:120]}"})
            continue
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        hot = in_graph_us(lambda fn=fn, cfg=cfg: fn(batch, cfg, out))
        cold = graph_time_us([lambda b=b, fn=fn, cfg=cfg: fn(b, cfg, out) for b in copies])
        rows.append({"variant": name, "hot_us": hot, "cold_us": cold,
                     "cold_gb_per_s": kv_bytes(batch) / cold * 1e-3})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["llama-1b", "qwen3-0.6b"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--contexts", type=int, nargs="+", default=[160, 1000])
    ap.add_argument("--keys", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument(
        "--splits",
        type=int,
        nargs="*",
        default=[2, 4, 8],
        help="split counts (none: no split rows)",
    )
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_attention_tiles benchmark: needs a CUDA device")
    cuda = torch.device("cuda")
    configs = sorted({DEFAULT, *itertools.product(args.keys, args.warps, args.stages)})
    flag = torch.zeros(1, device=cuda)
    empty = in_graph_us(lambda: _empty_kernel[(1,)](flag))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}; empty launch in a graph: {empty:.2f} µs")  # fmt: skip
    results = []
    for preset, ctx, b in itertools.product(args.presets, args.contexts, args.batches):
        model = PRESETS[preset]
        kvh, d = model.num_key_value_heads, model.head_dim
        group = model.num_attention_heads // kvh
        batch = make_batch([(ctx, 1)] * b, kvh, group, d, 16, torch.bfloat16, cuda)
        n = max(2, int(2 * L2_BYTES // batch.kv_cache.nbytes) + 1)
        rows = bench(batch, copies_of(batch, n), configs, args.splits)
        ok = [r for r in rows if "cold_us" in r]
        best = min(ok, key=lambda r: r["cold_us"])
        base = next(r for r in ok if r["variant"] == f"tiles {DEFAULT}")
        print(f"\n{preset} batch {b} context {ctx} ({n} copies cold): default "
              f"{base['hot_us']:.2f} hot / {base['cold_us']:.2f} cold µs; best cold "
              f"{best['variant']} {best['cold_us']:.2f} µs")  # fmt: skip
        print("| variant | hot µs | cold µs | cold KV GB/s |\n| --- | ---: | ---: | ---: |")
        for r in rows:
            if "error" in r:
                print(f"| {r['variant']} | {r['error']} | | |")
            else:
                print(f"| {r['variant']} | {r['hot_us']:.2f} | {r['cold_us']:.2f} "
                      f"| {r['cold_gb_per_s']:.0f} |")  # fmt: skip
        results += [{"preset": preset, "batch": b, "context": ctx, **r} for r in rows]
        del batch
        torch.cuda.empty_cache()
    if args.out:
        write_results(args.out, {"empty_launch_us": empty}, results)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
