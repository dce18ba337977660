"""The batch-1 MLP in one launch (``mlp_decode_triton``) against the two GEMVs it replaces.

For the MLP shapes of SmolLM2-135M, qwen3-0.6b, llama-1b and llama-3-8b, one row: the fused
one-pass path's two launches (gate/up with the one-pass RMSNorm prologue, then down with
SiLU-and-mul and the residual add) against the fused MLP kernel with the tiles
``pick_mlp_tiles`` chooses and with the best of a sweep (intermediate features a program, tile
size, warps), reading the down weight as ``nn.Linear`` keeps it ([H, I]) and as a transposed
copy ([I, H], each program's columns contiguous: ``--transposed``). Each side is a captured
CUDA graph over rotating copies of the layer's weights
(more bytes than the L2 holds, as a step's distinct layers read), launched as the runner
launches (with programmatic dependent launch on compute capability 9.0+, so a launch's weight
reads overlap the one before); µs per layer is the median replay's time over the copies. GB/s
counts the three weights' bytes. Each side's output is checked against ``mlp_decode_ref``.

    python benchmarks/mlp_decode.py --out mlp.json
    python benchmarks/mlp_decode.py --cpu-smoke   # tiny shapes in Triton's interpreter, no timing
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
from gemv import copies_of  # noqa: E402

from mrv2_prof.runner.model import PRESETS, pdl  # noqa: E402
from mrv2_prof.runner.model.gemv_triton import gemv_triton  # noqa: E402
from mrv2_prof.runner.model.mlp_decode_triton import (  # noqa: E402
    MlpTiles,
    mlp_decode_ref,
    mlp_decode_triton,
    pick_mlp_tiles,
)

SHAPES = {  # (hidden, intermediate): SmolLM2-135M's GGUF config, the presets' own
    "smollm2-135m": (576, 1536),
    **{p: (PRESETS[p].hidden_size, PRESETS[p].intermediate_size)
       for p in ("qwen3-0.6b", "llama-1b", "llama-3-8b")},
}  # fmt: skip
EPS = 1e-5


def layer_weights(hidden: int, inter: int, dev, dt, copies: int) -> list[tuple]:
    """``copies`` layers' (norm, gate/up, down) weights."""
    return [
        (
            torch.rand(hidden, device=dev, dtype=dt) + 0.5,
            torch.randn(2 * inter, hidden, device=dev, dtype=dt) / hidden**0.5,
            torch.randn(hidden, inter, device=dev, dtype=dt) / inter**0.5,
        )
        for _ in range(copies)
    ]


def two_gemvs(x, layer) -> torch.Tensor:
    g, gu, d = layer
    gate_up = gemv_triton(x, gu, norm=(g, EPS), one_pass=True)
    return gemv_triton(gate_up, d, residual=x, silu_mul=True)


def sweep() -> list[tuple[int, int, int]]:
    """(intermediate features a program, a tile's elements, warps)."""
    return list(itertools.product((8, 16, 32, 64, 128), (4096, 8192, 16384), (4, 8)))


def tiles_of(hidden: int, block_i: int, elements: int, warps: int) -> MlpTiles:
    whole = 1 << (hidden - 1).bit_length()
    bk = min(whole, elements // block_i)
    return MlpTiles(block_i, bk, bk, warps)


def bench(name: str, hidden: int, inter: int, do_sweep: bool, transposed: bool = False) -> dict:
    from graph_timing import graph_time_us

    dev, dt = torch.device("cuda"), torch.bfloat16
    per_layer = 3 * hidden * inter * 2
    copies = copies_of(per_layer)
    layers = layer_weights(hidden, inter, dev, dt, copies)
    if transposed:  # the down weight read from a transposed copy (the same values)
        layers = [(g, gu, d.t().contiguous().t()) for g, gu, d in layers]
    x0 = torch.randn(1, hidden, device=dev, dtype=dt)
    want = mlp_decode_ref(x0, *layers[0][:1], EPS, *layers[0][1:])
    sides = [mlp_decode_triton(x0.clone(), layers[0][0], EPS, *layers[0][1:])]
    sides += [] if transposed else [two_gemvs(x0.clone(), layers[0])]
    for got in sides:
        torch.testing.assert_close(got, want, atol=6e-2, rtol=2e-2)
    x = x0.clone()  # the residual stream the chain updates (its values drift; the time does not)
    row = {"model": name, "hidden": hidden, "inter": inter, "copies": copies,
           "weight_bytes": per_layer, "down_transposed": transposed}  # fmt: skip
    plain = [(g, gu, d.contiguous()) for g, gu, d in layers]  # the GEMVs read [H, I] rows
    row["two_gemvs_us"] = graph_time_us([lambda w=w: two_gemvs(x, w) for w in plain])
    picked = pick_mlp_tiles(hidden, inter)

    def fused(t):
        return graph_time_us(
            [lambda w=w: mlp_decode_triton(x, w[0], EPS, w[1], w[2], tiles=t) for w in layers]
        )

    row["fused_us"], row["picked"] = fused(picked), picked.__dict__
    best = (row["fused_us"], picked)
    if do_sweep:
        for bi, elements, warps in sweep():
            t = tiles_of(hidden, bi, elements, warps)
            try:
                best = min(best, (fused(t), t), key=lambda b: b[0])
            except Exception as exc:  # a tile that does not compile
                print(f"  {name} {t}: {type(exc).__name__}", file=sys.stderr)
    row["best_us"], row["best"] = best[0], best[1].__dict__
    for side in ("two_gemvs", "fused", "best"):
        row[f"{side}_gbps"] = per_layer / row[f"{side}_us"] / 1e3
    layout = "down^T" if transposed else "down  "
    print(f"{name:13s} {layout} two GEMVs {row['two_gemvs_us']:6.2f} us "
          f"({row['two_gemvs_gbps']:5.0f} "
          f"GB/s), fused {row['fused_us']:6.2f} us ({row['fused_gbps']:5.0f}), best "
          f"{row['best_us']:6.2f} us {best[1]}", flush=True)  # fmt: skip
    return row


def cpu_smoke() -> None:
    """The kernel against its reference at a tiny shape, in the interpreter (no timing)."""
    dev, dt = torch.device("cpu"), torch.float32
    (layer,) = layer_weights(96, 80, dev, dt, 1)
    x = torch.randn(1, 96, dtype=dt)
    for t in (None, tiles_of(96, 16, 512, 4)):
        for down in (layer[2], layer[2].t().contiguous().t()):
            got = mlp_decode_triton(x.clone(), layer[0], EPS, layer[1], down, tiles=t)
            torch.testing.assert_close(got, mlp_decode_ref(x, layer[0], EPS, *layer[1:]))
    print("cpu smoke: the fused MLP equals its reference")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", choices=sorted(SHAPES))
    ap.add_argument("--no-sweep", action="store_true", help="only the picked tiles")
    ap.add_argument("--no-pdl", action="store_true", help="launch without PDL (both sides)")
    ap.add_argument("--transposed", action="store_true",
                    help="also time the fused kernel on a transposed copy of down")  # fmt: skip
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--cpu-smoke", action="store_true", help=cpu_smoke.__doc__)
    args = ap.parse_args()
    if args.cpu_smoke:
        return cpu_smoke()
    pdl.LAUNCH_PDL = not args.no_pdl
    layouts = (False, True) if args.transposed else (False,)
    rows = [bench(m, *SHAPES[m], not args.no_sweep, t) for m in args.model or SHAPES
            for t in layouts]  # fmt: skip
    write_results(args.out, {"pdl": pdl.use_pdl(torch.device("cuda"))}, rows)


if __name__ == "__main__":
    main()
