"""Input prep and staged-write apply: Triton kernels against the torch references, on one GPU.

Cases at the runner's real sizes (1024 request slots, max_model_len 4096, KV blocks of 16):
a decode batch of 256 requests, a mixed batch of 256 requests and 8192 tokens (200 decodes and
56 prefill chunks), and the apply of 256 small block-table writes (1-3 block ids each).

Two numbers per implementation: device time (``triton.testing.do_bench``: warm-up, L2 flushed,
median and p20/p80 of per-call CUDA-event times; when the host cannot keep up, launch gaps count)
and host enqueue time (median wall time of one call, no sync).

    python benchmarks/input_prep_triton.py --out input_prep.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import triton
import triton.testing
from bench_io import write_results

from mrv2_prof.runner.worker.input_batch import prepare_inputs_ref
from mrv2_prof.runner.worker.input_batch_triton import prepare_inputs_triton
from mrv2_prof.runner.worker.staged_write import apply_packed_writes_ref
from mrv2_prof.runner.worker.staged_write_triton import apply_packed_writes_triton

NUM_SLOTS, MAX_MODEL_LEN, BLOCK_SIZE = 1024, 4096, 16


def input_prep_args(rng: np.random.Generator, counts: np.ndarray, num_decodes: int) -> list:
    """Persistent state for NUM_SLOTS requests and a batch of len(counts) of them.

    The first ``num_decodes`` requests decode (every position past the prompt); the others run a
    prefill chunk that ends inside or just past their prompt.
    """
    num_reqs = len(counts)
    idx = rng.permutation(NUM_SLOTS)[:num_reqs].astype(np.int32)
    computed = rng.integers(0, MAX_MODEL_LEN // 2, size=NUM_SLOTS).astype(np.int32)
    num_prefill = rng.integers(1, MAX_MODEL_LEN // 2, size=NUM_SLOTS).astype(np.int32)
    for b, slot in enumerate(idx):
        if b < num_decodes:
            num_prefill[slot] = min(num_prefill[slot], computed[slot])
        else:
            computed[slot] = rng.integers(0, MAX_MODEL_LEN - counts[b])
            num_prefill[slot] = computed[slot] + counts[b] - rng.integers(0, 2)
    max_blocks = MAX_MODEL_LEN // BLOCK_SIZE
    table = rng.permutation(NUM_SLOTS * max_blocks).reshape(NUM_SLOTS, max_blocks)

    def cuda(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(a).to("cuda", dtype)

    return [
        cuda(idx, torch.int32),
        cuda(counts, torch.int32),
        int(counts.sum()),
        cuda(computed, torch.int32),
        cuda(num_prefill, torch.int32),
        cuda(rng.integers(0, 128_000, size=(NUM_SLOTS, MAX_MODEL_LEN)), torch.int32),
        cuda(rng.integers(0, 128_000, size=NUM_SLOTS), torch.int64),
        cuda(table, torch.int32),
        BLOCK_SIZE,
    ]


def apply_args(rng: np.random.Generator, num_writes: int) -> list:
    """A [NUM_SLOTS, 256] int32 block table and ``num_writes`` appends of 1-3 ids, packed."""
    rows = rng.permutation(NUM_SLOTS)[:num_writes]
    lens = rng.integers(1, 4, size=num_writes)
    starts = rng.integers(0, 256 - 3, size=num_writes)
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]])
    values = rng.integers(0, 1 << 20, size=int(lens.sum()))
    packed = np.concatenate([rows, starts, lens, offsets, values]).astype(np.int32)
    base = torch.zeros(NUM_SLOTS, 256, dtype=torch.int32, device="cuda")
    return [base, torch.from_numpy(packed).cuda(), num_writes, int(lens.sum())]


def host_enqueue_us(fn: Callable[[], object], iters: int = 200) -> float:
    """Median wall time to enqueue one call; syncs every 20 calls so the queue stays short."""
    times = []
    for i in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
        if i % 20 == 19:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def measure(case: str, impl: str, fn: Callable[[], object]) -> dict:
    for _ in range(10):  # compile and warm caches before either clock
        fn()
    torch.cuda.synchronize()
    p50, p20, p80 = triton.testing.do_bench(fn, warmup=25, rep=200, quantiles=[0.5, 0.2, 0.8])
    return {
        "case": case,
        "impl": impl,
        "device_us_p50": p50 * 1e3,
        "device_us_p20": p20 * 1e3,
        "device_us_p80": p80 * 1e3,
        "host_enqueue_us_p50": host_enqueue_us(fn),
    }


def check_equal(case: str, ref: dict | torch.Tensor, out: dict | torch.Tensor) -> None:
    pairs = ref.items() if isinstance(ref, dict) else [("base", ref)]
    for key, want in pairs:
        got = out[key] if isinstance(out, dict) else out
        if not torch.equal(got, want):
            raise AssertionError(f"{case}: {key} differs between the kernel and the reference")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA device")
    rng = np.random.default_rng(args.seed)

    decode = input_prep_args(rng, np.ones(256, dtype=np.int32), num_decodes=256)
    chunks = rng.multinomial(8192 - 256, np.ones(56) / 56) + 1
    mixed = input_prep_args(
        rng, np.concatenate([np.ones(200), chunks]).astype(np.int32), num_decodes=200
    )
    apply = apply_args(rng, 256)

    results = []
    for case, a in [("decode 256 req / 256 tok", decode), ("mixed 256 req / 8192 tok", mixed)]:
        check_equal(case, prepare_inputs_ref(*a), prepare_inputs_triton(*a))
        results.append(measure(case, "torch", lambda a=a: prepare_inputs_ref(*a)))
        results.append(measure(case, "triton", lambda a=a: prepare_inputs_triton(*a)))
    case = "staged apply 256 writes"
    want, got = apply[0].clone(), apply[0].clone()
    apply_packed_writes_ref(want, *apply[1:])
    apply_packed_writes_triton(got, *apply[1:])
    check_equal(case, want, got)
    results.append(measure(case, "torch", lambda: apply_packed_writes_ref(*apply)))
    results.append(measure(case, "triton", lambda: apply_packed_writes_triton(*apply)))

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print()
    print("| case | impl | device p50 (us) | p20-p80 (us) | host enqueue p50 (us) | speed-up |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for i, r in enumerate(results):
        base = results[i - i % 2]["device_us_p50"]  # the torch row of the same case
        print(
            f"| {r['case']} | {r['impl']} | {r['device_us_p50']:.1f} | "
            f"{r['device_us_p20']:.1f}-{r['device_us_p80']:.1f} | "
            f"{r['host_enqueue_us_p50']:.1f} | {base / r['device_us_p50']:.2f}x |"
        )
    meta = {
        "num_slots": NUM_SLOTS,
        "max_model_len": MAX_MODEL_LEN,
        "block_size": BLOCK_SIZE,
        "seed": args.seed,
    }
    write_results(args.out, meta, results)


if __name__ == "__main__":
    main()
