"""The per-step roofline's host cost: what each step pays so the roofline can be computed later.

Per step the engine computes the step's attention extent (``SchedulerOutput.attention_extent``:
context tokens and query-key pairs) and hands both to ``RecordingProbe.step_end``; everything
else (bytes, FLOPs, the fraction) is computed from the stored rows after the run. Timed here,
median of repeats of ``timeit`` loops, in microseconds per step:

* ``attention_extent`` of a decode step of B requests (the steady decode path: an int64 array of
  computed tokens, one token each) and of a mixed step (B cached requests decoding, one new
  request prefilling 512 tokens: the per-request loop);
* ``step_end`` with the two extra values against ``step_end`` without them.

    python benchmarks/roofline_overhead.py --out roofline_overhead.json
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np
from bench_io import write_results

from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.core.scheduler_output import (
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)

REPEATS, NUMBER = 7, 2000


def per_call_us(fn) -> float:
    return statistics.median(timeit.repeat(fn, repeat=REPEATS, number=NUMBER)) / NUMBER * 1e6


def decode_step(batch: int) -> SchedulerOutput:
    ids = [f"r{i}" for i in range(batch)]
    cached = CachedRequestData(ids, np.arange(100, 100 + batch, dtype=np.int64), {})
    return SchedulerOutput([], cached, dict.fromkeys(ids, 1), batch, set())


def mixed_step(batch: int) -> SchedulerOutput:
    ids = [f"r{i}" for i in range(batch)]
    cached = CachedRequestData(ids, list(range(100, 100 + batch)), {})
    new = NewRequestData("p", list(range(512)), SamplingParams(), [], 0, 512)
    return SchedulerOutput([new], cached, {**dict.fromkeys(ids, 1), "p": 512}, batch + 512, set())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for b in args.batches:
        decode, mixed = decode_step(b), mixed_step(b)
        rows.append({"batch": b, "decode_extent_us": per_call_us(decode.attention_extent),
                     "mixed_extent_us": per_call_us(mixed.attention_extent)})  # fmt: skip
    probe = RecordingProbe(capacity=1 << 23)  # no growth inside a timing
    probe.step_begin(0)
    plain = lambda: probe.step_end(8, 8, 0, 0, 8, 40, 0, 1500, "none")  # noqa: E731
    extent = lambda: probe.step_end(8, 8, 0, 0, 8, 40, 0, 1500, "none", 900, 900)  # noqa: E731
    for _ in range(2):  # alternating sides, the second round kept (the first touches the pages)
        plain_us, extent_us = per_call_us(plain), per_call_us(extent)
    plain, extent = plain_us, extent_us
    print("| batch | extent, decode step (us) | extent, mixed step (us) |")
    print("| --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['decode_extent_us']:.2f} | {r['mixed_extent_us']:.2f} |")
    print(f"step_end: {plain:.2f} us without the extent, {extent:.2f} us with it")
    write_results(args.out, {"step_end_us": plain, "step_end_with_extent_us": extent}, rows)


if __name__ == "__main__":
    main()
