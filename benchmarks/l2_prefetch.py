"""What reading a projection's weight into L2 ahead of it buys the batch-1 GEMV, on one GPU.

``l2_prefetch.py`` has decode attention's spare programs read the next weights into L2 while
attention's dependent chain runs (HBM idle). Here the pieces alone, per projection of a preset
at M = 1 (cuBLAS and the Triton GEMV, as the ``plain`` path launches them): after L2 is flushed
(a read of 512 MiB), a stand-in for attention (``torch.cuda._sleep`` for ``--idle-us``), then the
GEMV, against the same with the prefetch launch (8 programs, the bulk L2 prefetch) of the first
P bytes of the weight before the stand-in. CUDA events time the GEMV alone (from the end of the
stand-in) and the whole (from before the prefetch), median of ``--repeats``; with no stand-in
(``--idle-us 0``) the GEMV follows the prefetch launch at once, before its bytes have landed.

    python benchmarks/l2_prefetch.py --preset llama-1b --out l2pf.json
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from bench_io import write_results
from gemv import projections

from mrv2_prof.runner.model import l2_prefetch
from mrv2_prof.runner.model.gemv_triton import gemv_triton

MIB = 1 << 20


def cycles_per_us() -> float:
    """``torch.cuda._sleep``'s cycles a microsecond on this GPU (timed once, 1 ms of cycles)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    a.record()
    torch.cuda._sleep(2_000_000)
    b.record()
    torch.cuda.synchronize()
    return 2_000_000 / (a.elapsed_time(b) * 1e3)


def timed(gemv, w, flush, sleep_cycles: int, prefetch_bytes: int, repeats: int) -> tuple:
    """(GEMV µs, whole µs): medians over ``repeats``, each after a flush of L2."""
    spans = l2_prefetch.spans_for([w], 1, budget=prefetch_bytes) if prefetch_bytes else None
    g, whole = [], []
    for _ in range(repeats + 3):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        flush.sum()
        ev[0].record()
        if spans:
            l2_prefetch.prefetch(spans, 8, w.device)
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        ev[1].record()
        gemv(w)
        ev[2].record()
        torch.cuda.synchronize()
        g.append(ev[1].elapsed_time(ev[2]) * 1e3)
        whole.append(ev[0].elapsed_time(ev[2]) * 1e3)
    return statistics.median(g[3:]), statistics.median(whole[3:])


def bench(preset: str, idles: list[float], budgets: list[int], repeats: int) -> list[dict]:
    dev, dt = torch.device("cuda"), torch.bfloat16
    flush = torch.empty(512 * MIB // 2, device=dev, dtype=dt).normal_()
    per_us = cycles_per_us()
    rows = []
    for proj, (n, k) in projections(preset).items():
        if proj not in ("o", "gate_up", "down", "qkv"):
            continue
        w = torch.randn(n, k, device=dev, dtype=dt) / k**0.5
        x = torch.randn(1, k, device=dev, dtype=dt)
        out = torch.empty(1, n, device=dev, dtype=dt)
        for name, gemv in (
            ("cublas", lambda w, x=x, out=out: torch.mm(x, w.t(), out=out)),
            ("triton", lambda w, x=x: gemv_triton(x, w)),
        ):
            size = n * k * 2
            for idle_us, mib in [(i, m) for i in idles for m in budgets]:
                b = min(mib * MIB, size)
                us, whole = timed(gemv, w, flush, int(idle_us * per_us), b, repeats)
                rows.append({"preset": preset, "proj": proj, "n": n, "k": k, "gemv": name,
                             "weight_mib": size / MIB, "prefetch_mib": b / MIB,
                             "idle_us": idle_us, "gemv_us": us, "whole_us": whole})  # fmt: skip
                print(f"  {preset} {proj:7s} {name:6s} idle {idle_us:3.0f} prefetch "
                      f"{b / MIB:5.1f} MiB: GEMV {us:6.1f} µs, whole {whole:6.1f} µs",
                      file=sys.stderr, flush=True)  # fmt: skip
        del w
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| preset | proj (MiB) | GEMV | prefetched MiB | idle µs | GEMV µs | whole µs |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['preset']} | {r['proj']} ({r['weight_mib']:.1f}) | {r['gemv']} | "
            f"{r['prefetch_mib']:.1f} | {r['idle_us']:.0f} | {r['gemv_us']:.1f} | "
            f"{r['whole_us']:.1f} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help="default: llama-1b")
    ap.add_argument("--idle-us", type=float, nargs="+", default=[0.0, 6.0],
                    help="the stand-in for attention (µs; 0: none)")  # fmt: skip
    ap.add_argument("--budget-mib", type=int, nargs="+", default=[0, 4, 8, 16, 24, 32])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not l2_prefetch.capable(torch.device("cuda")):
        raise SystemExit("l2_prefetch: needs a CUDA device of compute capability 9.0 or more")
    rows = []
    for preset in args.preset or ["llama-1b"]:
        rows += bench(preset, args.idle_us, args.budget_mib, args.repeats)
    print(markdown(rows))
    write_results(args.out, {"idle_us": args.idle_us, "repeats": args.repeats}, rows)


if __name__ == "__main__":
    main()
