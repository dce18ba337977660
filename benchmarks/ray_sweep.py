"""A sweep's cells on a local Ray cluster against ``--executor local``, both in one invocation.

A ``--cells``-cell CPU matrix of the quickstart (``matrix: {seed: [0 .. cells-1]}``, llama-tiny,
``--requests`` requests each, one torch thread per runner) runs first with ``--executor local``
(one cell after another) and then with ``--executor ray`` on a Ray cluster of ``--workers`` CPUs
started here (``ray.init(address="local")``; each cell a task asking one CPU). Wall time of each
command, and every cell's stored rows (steps, tokens) compared between the two databases.

    python benchmarks/ray_sweep.py --cells 12 --workers 2 --out ray_sweep.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_io import write_results

from mrv2_prof.store import Store


def sweep(scenario: Path, db: Path, *extra: str) -> float:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "mrv2_prof", "run", str(scenario), "--headless", "--db", str(db)]
    t0 = time.perf_counter()
    done = subprocess.run([*cmd, *extra], capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(extra) or 'local'}: exit {done.returncode}\n{done.stderr[-3000:]}"
        )
    return wall


def rows(db: Path) -> dict[str, tuple[int, int]]:
    with Store.open(db, read_only=True) as store:
        got = store.connection.execute(
            "SELECT r.label, (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id), "
            "(SELECT count(*) FROM tokens t WHERE t.run_id = r.run_id) FROM runs r "
            "WHERE r.status = 'completed'"
        ).fetchall()
    return {label: (steps, tokens) for label, steps, tokens in got}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "sweep.yaml"
        seeds = ", ".join(str(i) for i in range(args.cells))
        scenario.write_text(
            "name: ray-sweep\nmodel: {preset: llama-tiny}\nrunner: {device: cpu}\n"
            f"workload: {{num_requests: {args.requests}}}\nmatrix: {{seed: [{seeds}]}}\n"
        )
        local_s = sweep(scenario, Path(tmp) / "local.duckdb")
        ray.init(address="local", num_cpus=args.workers, include_dashboard=False)
        address = ray.get_runtime_context().gcs_address
        try:
            ray_s = sweep(scenario, Path(tmp) / "ray.duckdb", "--executor", "ray",
                          "--ray-address", address)  # fmt: skip
        finally:
            ray.shutdown()
        local_rows, ray_rows = rows(Path(tmp) / "local.duckdb"), rows(Path(tmp) / "ray.duckdb")
    same = local_rows == ray_rows and len(local_rows) == args.cells
    print(f"{args.cells} cells: local {local_s:.1f} s, ray ({args.workers} workers) {ray_s:.1f} s"
          f" = {ray_s / local_s:.2f}x; every cell's rows equal: {same}")  # fmt: skip
    row = {"local_s": local_s, "ray_s": ray_s, "ratio": ray_s / local_s, "rows_equal": same}
    write_results(args.out, {"cells": args.cells, "workers": args.workers}, [row])


if __name__ == "__main__":
    main()
