"""Host time per decode step, by phase, from the harness's own spans; the probes' host cost; and
the async-on/off throughput ratio on a host-bound small model.

(a) phases: ``--batches`` requests arrive at once (short prompts, ``--decode-tokens`` new tokens,
    EOS ignored), run through the harness (``runner_main`` in this process, a fresh DuckDB file
    per run) with the default probes and with every switchable probe off, alternating sides
    ``--repeats`` times. Over the uniform-decode steps at the full batch (no prefill token,
    ``num_reqs`` = batch) it reports the median of each CPU phase span (schedule, execute,
    prepare, forward, sample, update, step) and of host prep (``schedule`` start to ``execute``
    end, the end of enqueueing); and the ``flush`` spans that fell inside the step loop (median
    and max). CUDA graphs are captured at the batch size only (the decode steps replay them).
(b) engine: the same batch through ``Engine`` directly with the no-op ``Probe`` and with
    ``RecordingProbe`` (drained as the harness drains it), alternating; per uniform-decode step
    the median host time (``StepResult.host_ns`` less the output wait), its schedule, queue and
    update calls, the time inside the calls that do device work (input prep, model, sampler:
    compute on the CPU, launches on a GPU) and the rest, the bookkeeping; the probe's cost is
    the difference of the bookkeeping. On the CPU this is the host-path micro-benchmark.
(c) hooks: the recording probe's own cost per decode step, the hooks one step calls replayed
    without the engine (the flush timed apart); on CUDA also with the GPU timeline, its event
    records and resolution, the device idle and busy.
(e) flush: the step loop's part of one hand-off to the store writer, isolated: the probe's
    buffer swap after ``--flush-steps`` decode steps of each batch (the hooks of part (c), the
    requests in flight), median over repeated hand-offs with the arrays given back between them
    as the writer gives them back.
(f) syncfinder: the sync finder's and the host-wait catcher's host cost per decode step, the
    wrapped torch calls of one step replayed alone with them on and off (``host_path_syncs``).
(d) throughput: the host-bound small preset (``--small-preset``, ``--small-requests`` requests,
    16-32 token prompts, ``--small-tokens`` new tokens) through the harness with
    ``runner.async_scheduling`` on and off, alternating the order each repeat; output tokens/s
    (first arrival to last finish) per side and the on/off ratio per repeat.

The parts live beside this script: (a) and (d) in ``host_path_runs.py``, (b) in
``host_path_engine.py``, (c) and (e) in ``host_path_hooks.py``, (f) in ``host_path_syncs.py``.
The machine's host is shared and noisy: compare sides only inside one invocation.

    python benchmarks/host_path.py --out host_path.json                  # H200, all parts
    python benchmarks/host_path.py --part phases --out phases.json       # one part
    python benchmarks/host_path.py --quick --out /tmp/host_path.json     # CPU, llama-tiny
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench_io import write_results
from host_path_engine import markdown_engine, part_engine
from host_path_hooks import markdown_flush, markdown_hooks, part_flush, part_hooks
from host_path_runs import markdown_phases, markdown_throughput, part_phases, part_throughput
from host_path_syncs import markdown_syncfinder, part_syncfinder


def markdown(results: list[dict]) -> str:
    lines = markdown_phases(results)
    lines += markdown_engine(results)
    lines += markdown_hooks(results)
    lines += markdown_flush(results)
    lines += markdown_syncfinder(results)
    lines += markdown_throughput(results)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CPU, llama-tiny, small sizes")
    ap.add_argument(
        "--part",
        choices=("all", "phases", "engine", "hooks", "flush", "syncfinder", "throughput"),
        default="all",
    )
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument(
        "--probe-sets",
        default="default,off",
        help="phases: probe sets to alternate (default, off, +cuda_events: only that probe on)",
    )
    ap.add_argument(
        "--full-step",
        default="on",
        help="phases: runner.full_step_graph values to alternate (on, off or on,off)",
    )
    ap.add_argument("--decode-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--flush-steps", type=int, default=300, help="flush: steps per hand-off")
    ap.add_argument("--small-preset", default="qwen3-0.6b")
    ap.add_argument("--small-requests", type=int, default=256)
    ap.add_argument("--small-tokens", type=int, default=256)
    ap.add_argument("--out", help="JSON results")
    args = ap.parse_args(argv)
    if args.quick:
        import torch

        torch.set_num_threads(1)  # no intra-op pool spinning against the host path being timed
        args.preset = args.small_preset = "llama-tiny"
        args.decode_tokens, args.small_tokens = min(args.decode_tokens, 16), 16
        args.small_requests = min(args.small_requests, 32)
    args.batches = [int(b) for b in args.batches.split(",")]
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="host_path-") as d:
        tmp = Path(d)
        if args.part in ("all", "phases"):
            results += part_phases(args, tmp)
        if args.part in ("all", "hooks"):
            results += part_hooks(args)
        if args.part in ("all", "flush"):
            results += part_flush(args)
        if args.part in ("all", "syncfinder"):
            results += part_syncfinder(args)
        if args.part in ("all", "engine"):
            results += part_engine(args)
        if args.part in ("all", "throughput"):
            results += part_throughput(args, tmp)
    print(markdown(results))
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    write_results(args.out, meta, results)
    sys.stdout.flush()
    os._exit(0)  # skip the interpreter's teardown of torch and triton (leak reports)


if __name__ == "__main__":
    main()
