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
configuration's output is checked against the default configuration's before timing; with
``--heads-first`` each is also timed with the grid's kv heads first (``HEADS_FIRST``). Prints a
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

from mrv2_prof.runner.model import PRESETS, attention_decode_triton  # noqa: E402
from mrv2_prof.runner.model.attention_decode_triton import paged_decode_triton  # noqa: E402
from mrv2_prof.runner.model.attention_split_kv_triton import paged_decode_split_kv  # noqa: E402

DEFAULT = (64, 4, 3)  # (keys per step, warps, stages): the kernel's defaults
L2_BYTES = 50 * 2**20  # an H100's / H200's L2


@triton.jit
def _empty_kernel(out_ptr):
    tl.store(out_ptr, 1.0)


@triton.jit
def _packed_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, query_start_loc_ptr, seq_lens_ptr, block_table_ptr,
    qk_scale, q_stride_t, q_stride_h, out_stride_t, out_stride_h, cache_stride_block,
    cache_stride_slot, cache_stride_head, block_table_stride,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, PACK: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """An experiment: program (request, pack) attends ``PACK`` adjacent kv heads of a decode at
    once. Their ``PACK * G`` query rows share one ``tl.dot`` over the heads' dims side by side
    (``PACK * HEAD_DIM`` wide: one contiguous read of a cache slot per key); a row's query is zero
    outside its own head's dims, so its scores are its head's alone, and its output is read back
    from its head's dims only."""
    req = tl.program_id(0)
    pack = tl.program_id(1)
    tok = tl.load(query_start_loc_ptr + req).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + req)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, PACK * HEAD_DIM)
    row_ok = rows < PACK * G
    mine = ((rows // G)[:, None] == (cols // HEAD_DIM)[None, :]) & row_ok[:, None]
    head = pack * PACK * G + rows
    dim = cols % HEAD_DIM
    q = tl.load(q_ptr + tok * q_stride_t + head[:, None] * q_stride_h + dim[None, :], mask=mine,
                other=0.0)  # fmt: skip
    col_off = (pack * PACK + cols // HEAD_DIM) * cache_stride_head + dim
    block_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, PACK * HEAD_DIM], tl.float32)
    for n_start in range(0, seq_len, BLOCK_N):
        k_pos = n_start + tl.arange(0, BLOCK_N)
        k_ok = k_pos < seq_len
        block = tl.load(block_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot = block * cache_stride_block + (k_pos % BLOCK_SIZE) * cache_stride_slot
        k = tl.load(k_cache_ptr + slot[None, :] + col_off[:, None], mask=k_ok[None, :], other=0.0)
        qk = tl.dot(q, k.to(q.dtype)) * qk_scale
        qk = tl.where(k_ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + slot[:, None] + col_off[None, :], mask=k_ok[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v.to(q.dtype), acc * alpha[:, None])
        m_i = m_new
    out = acc / l_i[:, None]
    o_off = tok * out_stride_t + head[:, None] * out_stride_h + dim[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=mine)


def packed_decode(b: Batch, cfg: tuple[int, int, int], out: torch.Tensor) -> torch.Tensor:
    """``_packed_decode_kernel`` over a decode batch (one token a request): cfg (pack, keys a
    step, warps)."""
    pack, block_n, warps = cfg
    num_heads, head_dim = b.query.shape[1:]
    kvh = b.kv_cache.shape[3]
    group = num_heads // kvh
    _packed_decode_kernel[(b.meta.num_reqs, kvh // pack)](
        out, b.query, b.kv_cache[0], b.kv_cache[1], b.meta.query_start_loc, b.meta.seq_lens,
        b.meta.block_table, b.scale * 1.4426950408889634, b.query.stride(0), b.query.stride(1),
        out.stride(0), out.stride(1), b.kv_cache.stride(1), b.kv_cache.stride(2),
        b.kv_cache.stride(3), b.meta.block_table.stride(0),
        G=group, HEAD_DIM=head_dim, PACK=pack, BLOCK_SIZE=b.meta.block_size,
        BLOCK_M=max(16, triton.next_power_of_2(pack * group)), BLOCK_N=block_n, num_warps=warps,
    )  # fmt: skip
    return out


def kv_bytes(batch: Batch) -> float:
    """Bytes of K and V a decode batch reads: every cached key of every request, once."""
    _, num_kv_heads, head_dim = batch.kv_cache.shape[2:]
    keys = float(batch.meta.seq_lens_np.sum())
    return 2 * keys * num_kv_heads * head_dim * batch.kv_cache.element_size()


def copies_of(batch: Batch, n: int) -> list[Batch]:
    """``n`` batches of the same shape, each over its own cache (the same values)."""
    return [dataclasses.replace(batch, kv_cache=batch.kv_cache.clone()) for _ in range(n)]


def bench(
    batch: Batch, copies: list[Batch], configs, splits, heads_first=(), packs=()
) -> list[dict]:
    def call(b: Batch, cfg, out, heads: bool = False):
        n, w, s = cfg
        attention_decode_triton.HEADS_FIRST = heads  # the grid's order, read at the launch
        try:
            return paged_decode_triton(b.query, b.kv_cache, b.meta, b.scale, out, block_n=n,
                                       num_warps=w, num_stages=s)  # fmt: skip
        finally:
            attention_decode_triton.HEADS_FIRST = False

    def call_heads(b: Batch, cfg, out):
        return call(b, cfg, out, heads=True)

    def call_split(b: Batch, k, out):
        return paged_decode_split_kv(b.query, b.kv_cache, b.meta, b.scale, out, num_splits=k)

    out = torch.empty_like(batch.query)
    want = call(batch, DEFAULT, torch.empty_like(batch.query)).clone()
    rows = []
    variants = [(f"tiles {c}", c, call) for c in configs]
    variants += [(f"split {k}", k, call_split) for k in splits]
    variants += [(f"tiles {c}, kv heads first", c, call_heads) for c in heads_first]
    variants += [(f"pack {c}", c, packed_decode) for c in packs]
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
    ap.add_argument(
        "--heads-first",
        action="store_true",
        help="also time every tile with the grid's kv heads first (HEADS_FIRST): a request's "
        "heads side by side",
    )
    ap.add_argument(
        "--packs",
        type=int,
        nargs="*",
        default=[],
        help="also time the packed experiment (_packed_decode_kernel) with these kv heads a "
        "program, at 32 and 64 keys a step and 4 and 8 warps",
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
        heads = configs if args.heads_first else ()
        packs = [(p, k, w) for p in args.packs if kvh % p == 0 for k in (32, 64) for w in (4, 8)]
        rows = bench(batch, copies_of(batch, n), configs, args.splits, heads, packs)
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
