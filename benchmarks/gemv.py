"""The Triton decode GEMV against cuBLAS at the presets' projection shapes, on one GPU.

For each projection of llama-1b, qwen3-0.6b and llama-3-8b (merged QKV, o, merged gate/up, down,
LM head) and M = 1 / 2 / 4 rows, times ``F.linear`` (cuBLAS) and ``gemv_triton`` with the tiles
``pick_tiles`` chooses and with the best of a sweep of tiles. Each side is timed as a captured
CUDA graph of many calls over rotating copies of the weight (more bytes than the L2 holds, so
every call reads HBM, as a decode step's distinct layers do); the time per call is the graph's
replay time (median of 7) over the calls. GB/s counts the weight, input and output bytes. The
down projection is also timed with the residual epilogue against ``addmm_``; the QKV and gate/up
projections at M = 1 with the RMSNorm prologue, its two passes (the row's squares first) against
``one_pass`` (the squares summed in the weight walk), beside the GEMV without a prologue. With
``--prologue-sweep`` the tiles are also swept at M = 1 with the prologues the fused one-pass path
launches (QKV and gate/up with the one-pass RMSNorm, down with SiLU-and-mul and the residual),
against ``pick_tiles``' tile with the same prologue.

    python benchmarks/gemv.py --out gemv.json
    python benchmarks/gemv.py --cpu-smoke   # tiny shapes in Triton's interpreter, no timing
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

if "--cpu-smoke" in sys.argv:  # before triton is imported: it reads this at decoration time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from bench_io import write_results  # noqa: E402
from graph_timing import graph_time_us  # noqa: E402

from mrv2_prof.runner.model import PRESETS  # noqa: E402
from mrv2_prof.runner.model.gemv_triton import (  # noqa: E402
    RMSNORM,
    SILU_MUL,
    GemvTiles,
    gemv_ref,
    gemv_triton,
    pick_tiles,
)

ROTATE_BYTES = 1 << 30  # weight copies per graph: at least this many bytes (L2 is 50 MB)


def projections(preset: str) -> dict[str, tuple[int, int]]:
    a = PRESETS[preset]
    hd = a.head_dim
    return {
        "qkv": ((a.num_attention_heads + 2 * a.num_key_value_heads) * hd, a.hidden_size),
        "o": (a.hidden_size, a.num_attention_heads * hd),
        "gate_up": (2 * a.intermediate_size, a.hidden_size),
        "down": (a.hidden_size, a.intermediate_size),
        "lm_head": (a.vocab_size, a.hidden_size),
    }


def rotated_weights(n: int, k: int, dev, dt) -> list[torch.Tensor]:
    """Copies of an [n, k] weight, ``ROTATE_BYTES`` of them at least: a graph of calls over
    them reads HBM every call, as a step's distinct layers do."""
    return [torch.randn(n, k, device=dev, dtype=dt) / k**0.5 for _ in range(copies_of(n * k * 2))]


def copies_of(nbytes: int) -> int:
    """Copies of ``nbytes`` of weights that make ``ROTATE_BYTES`` (2 to 64)."""
    return max(2, min(64, ROTATE_BYTES // nbytes))


def sweep_tiles(m: int) -> list[GemvTiles]:
    block_m = 1 << (m - 1).bit_length()
    out = []
    for bn, bk, warps, stages in itertools.product(
        (4, 8, 16, 32), (64, 128, 256, 512, 1024), (4, 8), (2, 4)
    ):
        if 1024 <= block_m * bn * bk <= 8192:
            out.append(GemvTiles(bn, bk, warps, stages))
    return out


def best_tiles(call, ws, m: int, start: tuple[float, GemvTiles], label: str, tiles=None):
    """(µs, tiles): the fastest of ``start`` and every tile of ``tiles`` (default
    ``sweep_tiles(m)``), each timed as ``call(w, tiles)`` over the weights ``ws`` (a tile that
    does not compile is skipped)."""
    best = start
    for t in sweep_tiles(m) if tiles is None else tiles:
        try:
            us = graph_time_us([lambda w=w, t=t: call(w, t) for w in ws])
        except Exception as exc:  # a tile that does not compile (registers, shared memory)
            print(f"  {label} {t}: {type(exc).__name__}", file=sys.stderr)
            continue
        best = min(best, (us, t), key=lambda b: b[0])
    return best


PROLOGUES = {"qkv": "norm_one_pass", "gate_up": "norm_one_pass", "down": "silu_mul_residual"}


def sweep_prologue(name: str, x, ws, n: int, k: int) -> dict:
    """The M = 1 tiles swept with the prologue the fused one-pass path launches for ``name``:
    ``{"prologue", "prologue_picked_us", "prologue_best_us", "prologue_best"}``."""
    dev, dt = x.device, x.dtype
    if PROLOGUES[name] == "norm_one_pass":
        g = torch.rand(k, device=dev, dtype=dt) + 0.5

        def call(w, t):
            return gemv_triton(x, w, norm=(g, 1e-5), tiles=t, one_pass=True)
    else:
        gate_up, res = (
            torch.randn(1, 2 * k, device=dev, dtype=dt),
            torch.randn(1, n, device=dev, dtype=dt),
        )

        def call(w, t):
            return gemv_triton(gate_up, w, residual=res, silu_mul=True, tiles=t)

    kind = SILU_MUL if PROLOGUES[name] == "silu_mul_residual" else RMSNORM
    picked = pick_tiles(1, n, k, kind)  # the tiles the runner launches with this prologue
    picked_us = graph_time_us([lambda w=w: call(w, picked) for w in ws])
    best = best_tiles(call, ws, 1, (picked_us, picked), f"{name} prologue")
    print(f"  {name:8s} m=1 with {PROLOGUES[name]}: picked {picked_us:.1f} us, best "
          f"{best[0]:.1f} us {best[1]}", file=sys.stderr, flush=True)  # fmt: skip
    return {"prologue": PROLOGUES[name], "prologue_picked_us": picked_us,
            "prologue_best_us": best[0], "prologue_best": best[1].__dict__}  # fmt: skip


def bench_shape(
    name: str, m: int, n: int, k: int, sweep: bool, prologue_sweep: bool = False
) -> dict:
    dev, dt = torch.device("cuda"), torch.bfloat16
    ws = rotated_weights(n, k, dev, dt)
    x = torch.randn(m, k, device=dev, dtype=dt)
    out = torch.empty(m, n, device=dev, dtype=dt)
    nbytes = n * k * 2 + m * (k + n) * 2
    row = {"proj": name, "m": m, "n": n, "k": k}
    row["cublas_us"] = graph_time_us([lambda w=w: torch.mm(x, w.t(), out=out) for w in ws])
    picked = pick_tiles(m, n, k)
    row["triton_us"] = graph_time_us([lambda w=w: gemv_triton(x, w, tiles=picked) for w in ws])
    row["picked"] = picked.__dict__
    torch.testing.assert_close(gemv_triton(x, ws[0]), gemv_ref(x, ws[0]), atol=2e-2, rtol=2e-2)
    if sweep:
        best = best_tiles(lambda w, t: gemv_triton(x, w, tiles=t), ws, m,
                          (row["triton_us"], picked), f"{name} m={m}")  # fmt: skip
        row["best_us"], row["best"] = best[0], best[1].__dict__
    if name == "down":
        res = torch.randn(m, n, device=dev, dtype=dt)
        row["addmm_us"] = graph_time_us([lambda w=w: res.addmm_(x, w.t()) for w in ws])
        row["triton_residual_us"] = graph_time_us(
            [lambda w=w: gemv_triton(x, w, residual=res, tiles=picked) for w in ws]
        )
    if name in ("qkv", "gate_up") and m == 1:
        g = torch.rand(k, device=dev, dtype=dt) + 0.5
        for key, one in (("norm_two_pass_us", False), ("norm_one_pass_us", True)):
            row[key] = graph_time_us(
                [lambda w=w, one=one: gemv_triton(x, w, norm=(g, 1e-5), tiles=picked, one_pass=one)
                 for w in ws]
            )  # fmt: skip
    if prologue_sweep and m == 1 and name in PROLOGUES:
        row.update(sweep_prologue(name, x, ws, n, k))
    for key in ("cublas", "triton", "best"):
        if f"{key}_us" in row:
            row[f"{key}_gbps"] = nbytes / row[f"{key}_us"] / 1e3
    print(
        f"  {name:8s} m={m} [{n}x{k}] cublas {row['cublas_us']:.1f} us  triton "
        f"{row['triton_us']:.1f} us  best {row.get('best_us', float('nan')):.1f} us",
        file=sys.stderr,
        flush=True,
    )
    del ws
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[dict]) -> str:
    out = [
        "| preset | proj | M | N x K | cuBLAS us | GB/s | Triton us (picked) | GB/s | best us | "
        "best tiles (n, k, warps, stages) |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        b = r.get("best")
        tiles = f"{b['block_n']}, {b['block_k']}, {b['num_warps']}, {b['num_stages']}" if b else ""
        out.append(
            f"| {r['preset']} | {r['proj']} | {r['m']} | {r['n']} x {r['k']} | "
            f"{r['cublas_us']:.1f} | {r['cublas_gbps']:,.0f} | {r['triton_us']:.1f} | "
            f"{r['triton_gbps']:,.0f} | {r.get('best_us', float('nan')):.1f} | {tiles} |"
        )
    for preset in dict.fromkeys(r["preset"] for r in rows):
        sel = [r for r in rows if r["preset"] == preset and r["m"] == 1]
        layers = PRESETS[preset].num_hidden_layers
        total = {
            side: sum(r[f"{side}_us"] * (1 if r["proj"] == "lm_head" else layers) for r in sel)
            for side in ("cublas", "triton")
        }
        out.append(
            f"\n{preset}, M = 1, one step's projections ({layers} layers + LM head): cuBLAS "
            f"{total['cublas']:.0f} us, Triton {total['triton']:.0f} us"
        )
    for r in (r for r in rows if "norm_one_pass_us" in r):
        out.append(
            f"\n{r['proj']} + RMSNorm prologue, {r['preset']} M=1: two passes "
            f"{r['norm_two_pass_us']:.1f} us, one pass {r['norm_one_pass_us']:.1f} us "
            f"(no prologue {r['triton_us']:.1f} us)"
        )
    for r in (r for r in rows if "prologue_best_us" in r):
        b = r["prologue_best"]
        out.append(
            f"\n{r['proj']} with {r['prologue']}, {r['preset']} M=1: picked tiles "
            f"{r['prologue_picked_us']:.1f} us, best {r['prologue_best_us']:.1f} us "
            f"({b['block_n']}, {b['block_k']}, {b['num_warps']}, {b['num_stages']})"
        )
    downs = [r for r in rows if "addmm_us" in r]
    for r in downs:
        out.append(
            f"\ndown + residual, {r['preset']} M={r['m']}: addmm_ {r['addmm_us']:.1f} us, "
            f"Triton {r['triton_residual_us']:.1f} us"
        )
    return "\n".join(out)


def cpu_smoke() -> None:
    for m, n, k in [(1, 40, 96), (3, 24, 64)]:
        x, w = torch.randn(m, k), torch.randn(n, k)
        got = gemv_triton(x, w, tiles=GemvTiles(8, 32))
        torch.testing.assert_close(got, gemv_ref(x, w), atol=1e-4, rtol=1e-5)
        g = torch.rand(k) + 0.5
        got = gemv_triton(x, w, norm=(g, 1e-5), tiles=GemvTiles(8, 32), one_pass=True)
        torch.testing.assert_close(got, gemv_ref(x, w, norm=(g, 1e-5)), atol=1e-4, rtol=1e-5)
    print("cpu smoke: gemv_triton matches gemv_ref (and with the one-pass norm prologue)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help="default: llama-1b, qwen3-0.6b, llama-3-8b")
    ap.add_argument("--rows", type=int, action="append", help="M values (default 1, 2, 4)")
    ap.add_argument("--no-sweep", action="store_true", help="time only the picked tiles")
    ap.add_argument(
        "--prologue-sweep",
        action="store_true",
        help="at M = 1, also sweep the tiles with the fused one-pass path's prologues (with "
        "--no-sweep: only those)",
    )
    ap.add_argument("--proj", action="append", help="only these projections (default: all)")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cpu_smoke:
        return cpu_smoke()
    presets = args.preset or ["llama-1b", "qwen3-0.6b", "llama-3-8b"]
    rows = []
    for preset in presets:
        for m in args.rows or [1, 2, 4]:
            for name, (n, k) in projections(preset).items():
                if args.proj and name not in args.proj:
                    continue
                sweep = not args.no_sweep and m in (1, 4)
                row = bench_shape(name, m, n, k, sweep, args.prologue_sweep)
                rows.append({"preset": preset, **row})
    print(markdown(rows))
    write_results(args.out, {"presets": presets}, rows)


if __name__ == "__main__":
    main()
