"""Merging a run file into the database: the time a returned cell (``--executor ray``) or an
ended live run takes to land in ``--db``.

A run of ``--steps`` steps is written into its own side file as a live run writes it (8 spans
and 16 tokens per step, a request per 64 steps, rows in columnar batches), closed, and merged
into a database that already holds ``--existing`` such runs; the merge (``Store.merge_ended_runs``:
one transaction copying every table's rows) is timed, best and median of ``--repeats``.

    python benchmarks/merge_run_file.py --steps 10000 --out merge.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_io import write_results

from mrv2_prof.store import Store


def write_run(db: Path, steps: int) -> str:
    store, run_id = Store.open_live_run(db, label="merge", scenario_name="merge")
    with store:
        store.begin_run(
            run_id, scenario_name="merge", label="merge", matrix_combo=None,
            scenario_yaml="name: merge\n", device="cuda:0", versions={}, started_ns=0,
        )  # fmt: skip
        s = np.arange(steps, dtype=np.int64)
        store.append(run_id, "steps", {
            "step": s, "cpu_start_ns": s * 1000, "cpu_end_ns": s * 1000 + 900,
            "gpu_start_ns": s * 1000 + 100, "gpu_end_ns": s * 1000 + 950,
            "num_reqs": np.full(steps, 16), "num_tokens": np.full(steps, 16),
            "context_tokens": s, "attn_pairs": s,
        })  # fmt: skip
        sp = np.repeat(s, 8)
        store.append(run_id, "spans", {
            "step": sp, "track": ["cpu"] * len(sp), "name": ["forward"] * len(sp),
            "start_ns": sp * 1000, "end_ns": sp * 1000 + 50,
        })  # fmt: skip
        tk = np.repeat(s, 16)
        store.append(run_id, "tokens", {
            "req_id": [f"r{i % 64}" for i in range(len(tk))], "idx": tk, "t_ns": tk * 1000,
        })  # fmt: skip
        n = max(steps // 64, 1)
        store.append(run_id, "requests", {
            "req_id": [f"r{i}" for i in range(n)], "arrival_ns": np.zeros(n, dtype=np.int64),
        })  # fmt: skip
        store.finish_run(run_id, "completed", ended_ns=steps * 1000)
    return run_id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--existing", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    times = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "runs.duckdb"
            for _ in range(args.existing):
                write_run(db, args.steps)
                Store.merge_ended_runs(db)
            write_run(db, args.steps)
            t0 = time.perf_counter()
            merged = Store.merge_ended_runs(db)
            times.append(time.perf_counter() - t0)
            assert len(merged) == 1, merged
    best, median = min(times), statistics.median(times)
    print(f"merge of a {args.steps:,}-step run ({args.steps * 8:,} spans, {args.steps * 16:,} "
          f"tokens) into a database of {args.existing} runs: best {best:.3f} s, median "
          f"{median:.3f} s over {args.repeats}")  # fmt: skip
    write_results(args.out, {"steps": args.steps, "existing": args.existing}, [
        {"best_s": best, "median_s": median, "times_s": times}])  # fmt: skip


if __name__ == "__main__":
    main()
