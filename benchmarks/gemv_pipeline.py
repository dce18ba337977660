"""The batch-1 GEMV's walk of K software-pipelined (``GemvTiles.loop_stages``) against its
unpipelined walk and cuBLAS, on one GPU.

Triton pipelines a loop's loads only where they feed a ``tl.dot``, unless the loop asks for
stages itself: the GEMV's weight tiles were loaded and consumed one at a time, so a program kept
one tile in flight and the SM only as many as it held programs (on llama-1b's down projection,
512 programs of 8 KiB: some 31 KiB an SM). ``loop_stages`` copies the next steps' tiles into
shared memory while this one multiplies.

For each projection at M = 1, as each decode path launches it (``plain``: QKV and gate/up
without a prologue, o and down adding into the residual; ``fused_onepass``: QKV and gate/up with
the one-pass RMSNorm, down with SiLU-and-mul and the residual), times:

* cuBLAS where the plain path would take it (``F.linear``, ``addmm_`` with a residual);
* ``pick_tiles``' tile as launched now (unpipelined) and with 2 / 3 / 4 loop stages;
* with ``--sweep``, the best of the pipelined tiles (4-16 features x 256-1,024 keys a program,
  the picked warps, 2-4 stages).

Each is a captured CUDA graph over rotating copies of the weight (``gemv.py``'s timing: every
call reads HBM); GB/s counts the weight bytes over the time.

    python benchmarks/gemv_pipeline.py --preset llama-1b --sweep --out pipe.json
    python benchmarks/gemv_pipeline.py --cpu-smoke   # the interpreter, tiny shapes, no timing
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys

if "--cpu-smoke" in sys.argv:  # before triton is imported: it reads this at decoration time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from bench_io import write_results  # noqa: E402
from gemv import best_tiles, projections, rotated_weights  # noqa: E402
from graph_timing import graph_time_us  # noqa: E402

from mrv2_prof.runner.model.gemv_triton import (  # noqa: E402
    NO_PROLOGUE,
    RMSNORM,
    SILU_MUL,
    GemvTiles,
    gemv_ref,
    gemv_triton,
    pick_tiles,
)

# projection -> the launches of the two decode paths: (label, prologue, residual)
LAUNCHES = {
    "qkv": [("plain", NO_PROLOGUE, False), ("norm", RMSNORM, False)],
    "o": [("residual", NO_PROLOGUE, True)],
    "gate_up": [("plain", NO_PROLOGUE, False), ("norm", RMSNORM, False)],
    "down": [("residual", NO_PROLOGUE, True), ("silu_mul", SILU_MUL, True)],
}
STAGES = (2, 3, 4)


def sweep_tiles(warps: int) -> list[GemvTiles]:
    return [
        GemvTiles(bn, bk, warps, 2, ls)
        for bn, bk, ls in itertools.product((4, 8, 16), (256, 512, 1024), STAGES)
        if bn * bk <= 8192
    ]


def make_call(prologue: int, residual: bool, n: int, k: int, dev, dt):
    """``call(w, tiles)``: the GEMV as the decode path launches it, and its cuBLAS peer (None
    where no path takes cuBLAS for it)."""
    x = torch.randn(1, 2 * k if prologue == SILU_MUL else k, device=dev, dtype=dt)
    res = torch.randn(1, n, device=dev, dtype=dt)
    g = torch.rand(k, device=dev, dtype=dt) + 0.5
    out = torch.empty(1, n, device=dev, dtype=dt)
    norm = (g, 1e-5) if prologue == RMSNORM else None

    silu = prologue == SILU_MUL

    def launch(w, t, r):
        return gemv_triton(x, w, residual=r, norm=norm, silu_mul=silu, tiles=t, one_pass=True)

    def call(w, t):
        return launch(w, t, res if residual else None)

    def check(w, t):
        want = gemv_ref(x, w, residual=res.clone() if residual else None, norm=norm, silu_mul=silu)
        got = launch(w, t, res.clone() if residual else None)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)

    if prologue != NO_PROLOGUE:
        return call, check, None
    if residual:
        return call, check, lambda w: res.addmm_(x, w.t())
    return call, check, lambda w: torch.mm(x, w.t(), out=out)


def bench(proj: str, n: int, k: int, sweep: bool) -> list[dict]:
    dev, dt = torch.device("cuda"), torch.bfloat16
    ws = rotated_weights(n, k, dev, dt)
    rows = []
    for label, prologue, residual in LAUNCHES[proj]:
        call, check, cublas = make_call(prologue, residual, n, k, dev, dt)
        picked = pick_tiles(1, n, k, prologue)
        row = {"proj": proj, "launch": label, "n": n, "k": k, "picked": picked.__dict__}
        if cublas is not None:
            row["cublas_us"] = graph_time_us([lambda w=w, f=cublas: f(w) for w in ws])
        for ls in (0, *STAGES):
            t = dataclasses.replace(picked, loop_stages=ls)
            check(ws[0], t)
            row[f"ls{ls}_us"] = graph_time_us([lambda w=w, t=t, f=call: f(w, t) for w in ws])
        if sweep:
            ls = min(STAGES, key=lambda ls: row[f"ls{ls}_us"])
            start = (row[f"ls{ls}_us"], dataclasses.replace(picked, loop_stages=ls))
            us, t = best_tiles(call, ws, 1, start, f"{proj} {label}", sweep_tiles(picked.num_warps))
            check(ws[0], t)
            row["best_us"], row["best"] = us, t.__dict__
        for key in [key for key in row if key.endswith("_us")]:
            row[key.replace("_us", "_gbps")] = n * k * 2 / row[key] / 1e3
        print(f"  {proj:8s} {label:9s} [{n}x{k}] " + "  ".join(
            f"{key[:-3]} {row[key]:.1f}" for key in row if key.endswith("_us")
        ), file=sys.stderr, flush=True)  # fmt: skip
        rows.append(row)
    del ws
    torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| preset | proj | launch | N x K | cuBLAS µs | unpipelined µs | 2 stages | 3 stages | "
        "4 stages | best swept µs (n, k, warps, stages) |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        b = r.get("best")
        best = f"{r['best_us']:.1f} ({b['block_n']}, {b['block_k']}, {b['num_warps']}, " \
            f"{b['loop_stages']})" if b else ""  # fmt: skip
        cublas = f"{r['cublas_us']:.1f}" if "cublas_us" in r else ""
        out.append(
            f"| {r['preset']} | {r['proj']} | {r['launch']} | {r['n']} x {r['k']} | {cublas} | "
            + " | ".join(f"{r[f'ls{ls}_us']:.1f}" for ls in (0, *STAGES))
            + f" | {best} |"
        )
    return "\n".join(out)


def cpu_smoke() -> None:
    for prologue, residual in ((NO_PROLOGUE, True), (RMSNORM, False), (SILU_MUL, True)):
        _, check, _ = make_call(prologue, residual, 40, 96, torch.device("cpu"), torch.float32)
        check(torch.randn(40, 96) / 96**0.5, GemvTiles(8, 32, loop_stages=3))
    print("cpu smoke: the pipelined gemv_triton matches gemv_ref with each decode launch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help="default: llama-1b, qwen3-0.6b")
    ap.add_argument("--proj", action="append", help="only these projections (default: all four)")
    ap.add_argument("--sweep", action="store_true", help="also the best of the pipelined tiles")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cpu_smoke:
        return cpu_smoke()
    presets = args.preset or ["llama-1b", "qwen3-0.6b"]
    rows = []
    for preset in presets:
        for proj, (n, k) in projections(preset).items():
            if proj in LAUNCHES and (not args.proj or proj in args.proj):
                rows += [{"preset": preset, **r} for r in bench(proj, n, k, args.sweep)]
    print(markdown(rows))
    write_results(args.out, {"presets": presets, "stages": STAGES}, rows)


if __name__ == "__main__":
    main()
