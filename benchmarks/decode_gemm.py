"""The Triton decode GEMM (split-K) against cuBLAS at the presets' projection shapes, batch 8-256.

For each projection of llama-1b, qwen3-0.6b and llama-3-8b (merged QKV, o, merged gate/up, down)
and M = 8 ... 256 rows, times ``F.linear`` (cuBLAS), ``gemm_decode_triton`` with the tiles
``pick_gemm_tiles`` chooses, and the best of a pruned sweep of tiles: first block_n x block_k x
split_k at 4 warps and 3 stages (only splits that leave no split empty and that a smaller split
did not already bring to two programs per SM), then warps and stages around the winner. Each
side is timed as a captured CUDA graph of many calls over rotating copies of the weight (more
bytes than the L2 holds: every call reads HBM), as ``benchmarks/gemv.py`` does. Per row: time,
GB/s (weight, input and output bytes) and its share of ``--peak-gbps``, TFLOP/s and its share of
``--peak-tflops`` (dense bf16 tensor cores), and the share of the binding roof, max(bytes / BW,
FLOPs / peak). Last, the best tiles per (N, K, M) as a Python dict literal, to paste as a table
into ``pick_gemm_tiles``.

    python benchmarks/decode_gemm.py --out decode_gemm.json
    python benchmarks/decode_gemm.py --cpu-smoke   # tiny shapes in Triton's interpreter, no timing
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

if "--cpu-smoke" in sys.argv:  # before triton is imported: it reads this at decoration time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from bench_io import write_results  # noqa: E402
from gemv import graph_time_us, projections, rotated_weights  # noqa: E402

from mrv2_prof.runner.model.gemm_decode_triton import (  # noqa: E402
    DecodeGemmTiles,
    effective_split,
    gemm_decode_ref,
    gemm_decode_triton,
    pick_gemm_tiles,
)

PROJS = ("qkv", "o", "gate_up", "down")
ROWS = (8, 16, 32, 64, 128, 256)
SMS = 132
SMEM_BYTES = 200 * 1024  # an H200 SM's shared memory less headroom: larger pipelines are skipped


def _fits(bm: int, bn: int, bk: int, stages: int) -> bool:
    return (bm + bn) * bk * 2 * stages <= SMEM_BYTES and bm * bn <= 8192


def first_sweep(m: int, n: int, k: int) -> list[DecodeGemmTiles]:
    """block_n x block_k x split_k at 4 warps, 3 stages, ``block_m`` as picked."""
    bm = pick_gemm_tiles(m, n, k).block_m
    out = []
    for bn, bk in itertools.product((32, 64, 128), (64, 128, 256)):
        if not _fits(bm, bn, bk, 3):
            continue
        tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
        for split in (1, 2, 4, 8):
            if split > 1 and tiles * split // 2 >= 2 * SMS:  # the smaller split fills the SMs
                break
            if effective_split(k, bk, split)[0] != split:  # K too short: a split left empty
                break
            out.append(DecodeGemmTiles(bm, bn, bk, split, num_warps=4, num_stages=3))
    return out


def second_sweep(best: DecodeGemmTiles) -> list[DecodeGemmTiles]:
    """The winner's tiles at other warps and stages."""
    out = []
    for warps, stages in ((4, 4), (8, 3), (8, 4)):
        if _fits(best.block_m, best.block_n, best.block_k, stages):
            out.append(DecodeGemmTiles(**{**best.__dict__, "num_warps": warps,
                                          "num_stages": stages}))  # fmt: skip
    return out


def _time(x, ws, t: DecodeGemmTiles, label: str) -> float | None:
    try:
        return graph_time_us([lambda w=w: gemm_decode_triton(x, w, tiles=t) for w in ws])
    except Exception as exc:  # a tile that does not compile (registers, shared memory)
        print(f"  {label} {t}: {type(exc).__name__}", file=sys.stderr)
        return None


def bench_shape(name: str, n: int, k: int, rows: list[int], sweep: bool) -> list[dict]:
    dev, dt = torch.device("cuda"), torch.bfloat16
    ws = rotated_weights(n, k, dev, dt)
    out = []
    for m in rows:
        x = torch.randn(m, k, device=dev, dtype=dt)
        picked = pick_gemm_tiles(m, n, k)
        torch.testing.assert_close(
            gemm_decode_triton(x, ws[0]), gemm_decode_ref(x, ws[0]), atol=2e-2, rtol=2e-2
        )
        row = {"proj": name, "m": m, "n": n, "k": k, "picked": picked.__dict__}
        row["cublas_us"] = graph_time_us([lambda w=w, x=x: F.linear(x, w) for w in ws])
        row["picked_us"] = _time(x, ws, picked, name)
        if sweep:
            best = (row["picked_us"] or float("inf"), picked)
            for t in first_sweep(m, n, k):
                us = _time(x, ws, t, name)
                best = min(best, (us or float("inf"), t), key=lambda b: b[0])
            for t in second_sweep(best[1]):
                us = _time(x, ws, t, name)
                best = min(best, (us or float("inf"), t), key=lambda b: b[0])
            row["best_us"], row["best"] = best[0], best[1].__dict__
        out.append(row)
    del ws
    torch.cuda.empty_cache()
    return out


def add_roofline(row: dict, peak_gbps: float, peak_tflops: float) -> dict:
    m, n, k = row["m"], row["n"], row["k"]
    nbytes, flops = 2 * (n * k + m * k + m * n), 2 * m * n * k
    row["roof_us"] = max(nbytes / peak_gbps / 1e3, flops / peak_tflops / 1e6)
    row["bound"] = "bytes" if nbytes / peak_gbps / 1e3 >= flops / peak_tflops / 1e6 else "flops"
    for side in ("cublas", "picked", "best"):
        us = row.get(f"{side}_us")
        if us:
            row[f"{side}_gbps"] = nbytes / us / 1e3
            row[f"{side}_tflops"] = flops / us / 1e6
            row[f"{side}_roof_pct"] = 100 * row["roof_us"] / us
    return row


def line(r: dict, peak_gbps: float, peak_tflops: float) -> str:
    parts = [f"{r['preset']:10s} {r['proj']:7s} M={r['m']:<3d} [{r['n']}x{r['k']}]"]
    for side in ("cublas", "picked", "best"):
        if r.get(f"{side}_gbps"):
            parts.append(
                f"{side} {r[f'{side}_us']:7.1f} us {r[f'{side}_gbps']:6.0f} GB/s "
                f"({100 * r[f'{side}_gbps'] / peak_gbps:3.0f}% BW, "
                f"{100 * r[f'{side}_tflops'] / peak_tflops:3.0f}% FLOP/s, "
                f"{r[f'{side}_roof_pct']:3.0f}% roof)"
            )
    return " | ".join(parts) + f" | roof {r['roof_us']:.1f} us ({r['bound']})"


def best_table(rows: list[dict]) -> str:
    """The best tiles per (N, K, M) as a dict literal: (block_m, block_n, block_k, split_k,
    num_warps, num_stages)."""
    out = ["DECODE_GEMM_TILES = {  # (n, k, m): (bm, bn, bk, split_k, warps, stages)"]
    for r in rows:
        if "best" in r:
            b = r["best"]
            tiles = tuple(b[f] for f in ("block_m", "block_n", "block_k", "split_k",
                                         "num_warps", "num_stages"))  # fmt: skip
            out.append(f"    ({r['n']}, {r['k']}, {r['m']}): {tiles},  # {r['preset']} {r['proj']}")
    return "\n".join(out + ["}"])


def cpu_smoke() -> None:
    for m, n, k, dtype in [(3, 40, 72, torch.float32), (17, 24, 200, torch.float32),
                           (5, 40, 72, torch.bfloat16)]:  # fmt: skip
        x, w = torch.randn(m, k).to(dtype), (torch.randn(n, k) / k**0.5).to(dtype)
        b, r = torch.randn(n).to(dtype), torch.randn(m, n).to(dtype)
        tol = (1e-4, 1e-5) if dtype == torch.float32 else (2e-2, 1.6e-2)
        for t in (None, DecodeGemmTiles(16, 16, 32, 1), DecodeGemmTiles(16, 16, 32, 3)):
            got = gemm_decode_triton(x, w, b, r.clone(), tiles=t)
            want = gemm_decode_ref(x, w, b, r.clone())
            torch.testing.assert_close(got, want, atol=tol[0], rtol=tol[1])
    print("cpu smoke: gemm_decode_triton matches gemm_decode_ref (split_k 1 and 3, picked tiles)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help="default: llama-1b, qwen3-0.6b, llama-3-8b")
    ap.add_argument("--rows", type=int, action="append", help=f"M values (default {ROWS})")
    ap.add_argument("--no-sweep", action="store_true", help="time only the picked tiles")
    ap.add_argument("--peak-gbps", type=float, default=4096.0, help="measured HBM bandwidth")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 tensor cores")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cpu_smoke:
        return cpu_smoke()
    presets = args.preset or ["llama-1b", "qwen3-0.6b", "llama-3-8b"]
    rows = []
    for preset in presets:
        for name, (n, k) in projections(preset).items():
            if name not in PROJS:
                continue
            for row in bench_shape(name, n, k, args.rows or list(ROWS), not args.no_sweep):
                row = add_roofline({"preset": preset, **row}, args.peak_gbps, args.peak_tflops)
                print(line(row, args.peak_gbps, args.peak_tflops), flush=True)
                rows.append(row)
    print(best_table(rows))
    meta = {"presets": presets, "peak_gbps": args.peak_gbps, "peak_tflops": args.peak_tflops}
    write_results(args.out, meta, rows)


if __name__ == "__main__":
    main()
