"""Probe overhead on whole runs: the same scenario with probes off, the default probes and all
probes, through ``mrv2-prof run --headless`` as a user runs it (NVML sampling in the parent).

Sets (``probes`` section):
  off      nvtx, cuda_events, sync_finder, copy_audit off, nvml_hz 0
  default  what a scenario gets without a probes section (NVTX, CUDA-event timeline, NVML 10 Hz)
  all      default + sync finder + copy audit (the kernel trace is a window tool: it slows the
           steps it traces by design and is not part of this comparison)

Sides alternate (off, default, all, off, ...) ``--repeats`` times. Reported per set: the median
output tokens/s of the run (first arrival to last finish) and the median host time per step
(``steps.cpu_end_ns - cpu_start_ns`` less ``output_wait_ns``: the host's own work, without the
designed wait for the device), and their ratios to ``off``.

    python benchmarks/probe_overhead_runs.py scenarios/decode_heavy.yaml --repeats 3 \
        --set workload.num_requests=64 --out probe_overhead_runs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

SETS = {
    "off": ["probes.nvtx=false", "probes.cuda_events=false", "probes.sync_finder=false",
            "probes.copy_audit=false", "probes.nvml_hz=0"],
    "default": ["probes.nvtx=true", "probes.cuda_events=true", "probes.sync_finder=false",
                "probes.copy_audit=false", "probes.nvml_hz=10"],
    "all": ["probes.nvtx=true", "probes.cuda_events=true", "probes.sync_finder=true",
            "probes.copy_audit=true", "probes.nvml_hz=10"],
}  # fmt: skip


def one_run(scenario: str, sets: list[str], db: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "mrv2_prof", "run", scenario, "--headless", "--db", str(db)]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    con = duckdb.connect(str(db), read_only=True)
    try:
        run_id = con.execute("SELECT run_id FROM runs ORDER BY started_ns DESC LIMIT 1").fetchone()[
            0
        ]
        tok_s = con.execute(
            "SELECT sum(output_tokens) / ((max(finish_ns) - min(arrival_ns)) / 1e9) "
            "FROM requests WHERE run_id = ?", [run_id]
        ).fetchone()[0]  # fmt: skip
        host_us = con.execute(  # the step's host work: its span less the wait for tokens
            "SELECT median(cpu_end_ns - cpu_start_ns - coalesce(output_wait_ns, 0)) / 1e3 "
            "FROM steps WHERE run_id = ? AND num_tokens > 0", [run_id]
        ).fetchone()[0]  # fmt: skip
    finally:
        con.close()
    return {"tok_s": float(tok_s), "host_us_per_step": float(host_us)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--out")
    a = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {k: [] for k in SETS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            for name, probe_sets in SETS.items():
                res = one_run(a.scenario, a.sets + probe_sets, Path(tmp) / f"{name}.duckdb")
                results[name].append(res)
                print(f"repeat {r} {name:8s} {res['tok_s']:10.1f} tok/s "
                      f"{res['host_us_per_step']:8.1f} us/step", flush=True)  # fmt: skip
    med = {
        k: {m: statistics.median(x[m] for x in v) for m in ("tok_s", "host_us_per_step")}
        for k, v in results.items()
    }
    print(f"\n{'set':8s} {'tok/s':>10s} {'vs off':>8s} {'host us/step':>13s} {'vs off':>8s}")
    for k, v in med.items():
        print(f"{k:8s} {v['tok_s']:10.1f} {v['tok_s'] / med['off']['tok_s']:8.3f} "
              f"{v['host_us_per_step']:13.1f} "
              f"{v['host_us_per_step'] / med['off']['host_us_per_step']:8.3f}")  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps({"runs": results, "median": med, "args": vars(a)}))


if __name__ == "__main__":
    main()
