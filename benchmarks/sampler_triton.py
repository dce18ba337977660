"""Sampler: the torch reference ``sample`` against the Triton ``sample_triton``, on one GPU.

For each batch size and sampling mode (V = 128256, the llama-1b vocabulary) it times both sides
with CUDA events after a warm-up (median over repeats of the mean over ``--iters`` calls; the
logits stay in L2 when they fit, as they would right after the lm_head), checks that the tokens
are equal, and reports the Triton kernels alone (``gumbel_argmax`` with the top-k/top-p thresholds
precomputed) and the logits read bandwidth of the whole Triton sampler. ``--tune`` also times the
kernels for several vocabulary split sizes.

    python benchmarks/sampler_triton.py --out sampler_triton.json
    python benchmarks/sampler_triton.py --dtype bfloat16 --logprobs 20 --tune
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import triton
from bench_io import write_results

from mrv2_prof.runner.worker.gumbel_argmax_triton import gumbel_argmax
from mrv2_prof.runner.worker.sampler import GREEDY_TEMPERATURE, SamplingMetadata, sample
from mrv2_prof.runner.worker.sampler_triton import sample_triton, top_k_top_p_threshold

MODES = ("greedy", "temperature", "top_k_top_p")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_meta(mode: str, num_rows: int, num_logprobs: int, device: str) -> SamplingMetadata:
    """One slot per row, every row of the same kind: T=0.8, top_k=50, top_p=0.9 when on."""
    temperature = 0.0 if mode == "greedy" else 0.8
    gen = torch.Generator().manual_seed(num_rows)
    return SamplingMetadata(
        idx_mapping=torch.randperm(num_rows, generator=gen).to(device, torch.int32),
        positions=torch.randint(0, 4096, (num_rows,), generator=gen).to(device),
        temperature=torch.full((num_rows,), temperature, device=device),
        top_k=torch.full((num_rows,), 50 if mode == "top_k_top_p" else 0, device=device).int(),
        top_p=torch.full((num_rows,), 0.9 if mode == "top_k_top_p" else 1.0, device=device),
        seeds=torch.randint(-(2**62), 2**62, (num_rows,), generator=gen).to(device),
        max_num_logprobs=num_logprobs,
        all_greedy=mode == "greedy",
        no_top_k=mode != "top_k_top_p",
        no_top_p=mode != "top_k_top_p",
    )


def thresholds(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor | None:
    """The [B] thresholds ``sample_triton`` computes before its kernels (None when skipped)."""
    if meta.all_greedy or (meta.no_top_k and meta.no_top_p):
        return None
    idx = meta.idx_mapping.long()
    temperature = meta.temperature[idx]
    divisor = torch.where(temperature < GREEDY_TEMPERATURE, 1.0, temperature)
    return top_k_top_p_threshold(logits, divisor, meta.top_k[idx], meta.top_p[idx])


def time_ms(fn: Callable[[], object], warmup: int, iters: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean milliseconds per call over ``iters`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / iters)
    return statistics.median(per_call)


def bench_one(args, num_rows: int, mode: str) -> dict:
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(num_rows, args.vocab_size, generator=gen, device="cuda") * 3.0
    logits = logits.to(dtype)
    meta = make_meta(mode, num_rows, args.logprobs, "cuda")
    threshold = thresholds(logits, meta)
    with_lse = args.logprobs > 0
    timing = dict(warmup=args.warmup, iters=args.iters, repeats=args.repeats)
    same = torch.equal(
        sample(logits, meta).sampled_token_ids, sample_triton(logits, meta).sampled_token_ids
    )
    ref_ms = time_ms(lambda: sample(logits, meta), **timing)
    triton_ms = time_ms(lambda: sample_triton(logits, meta), **timing)
    kernel_ms = time_ms(lambda: gumbel_argmax(logits, meta, threshold, with_lse), **timing)
    row = {
        "batch_size": num_rows,
        "mode": mode,
        "reference_ms": ref_ms,
        "triton_ms": triton_ms,
        "kernels_ms": kernel_ms,
        "speedup": ref_ms / triton_ms,
        "logits_GBps": logits.numel() * logits.element_size() / triton_ms / 1e6,
        "same_tokens": same,
    }
    if args.tune:
        num_blocks = triton.cdiv(args.vocab_size, 1024)
        row["kernels_ms_by_split_blocks"] = {
            blocks: time_ms(
                lambda b=blocks: gumbel_argmax(
                    logits, meta, threshold, with_lse, split_size=b * 1024
                ),
                **timing,
            )
            for blocks in (1, 2, 4, 8, 16, 32, 64, num_blocks)
            if blocks <= num_blocks
        }
    return row


def markdown(rows: list[dict], tune: bool) -> str:
    lines = [
        "| B | mode | reference (ms) | triton (ms) | kernels (ms) | speedup | logits GB/s "
        "| equal |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch_size']} | {r['mode']} | {r['reference_ms']:.3f} | {r['triton_ms']:.3f} "
            f"| {r['kernels_ms']:.3f} | {r['speedup']:.1f}x | {r['logits_GBps']:.0f} "
            f"| {'yes' if r['same_tokens'] else 'NO'} |"
        )
    if tune:
        lines += ["", "kernels (ms) by split size (blocks of 1024 logits):", ""]
        for r in rows:
            splits = ", ".join(
                f"{b}: {ms:.3f}" for b, ms in r["kernels_ms_by_split_blocks"].items()
            )
            lines.append(f"* B={r['batch_size']} {r['mode']}: {splits}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-size", type=int, default=128256)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--logprobs", type=int, default=0, help="top-k logprobs per row (0 = none)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tune", action="store_true", help="also time the kernels per split size")
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA device")

    rows = [bench_one(args, b, mode) for b in args.batch_sizes for mode in args.modes]
    device = torch.cuda.get_device_name()
    print(
        f"{device}, V={args.vocab_size}, {args.dtype} logits, logprobs={args.logprobs}, "
        f"torch {torch.__version__}, triton {triton.__version__}\n"
    )
    print(markdown(rows, args.tune))
    write_results(args.out, {k: v for k, v in vars(args).items() if k != "out"}, rows)


if __name__ == "__main__":
    main()
