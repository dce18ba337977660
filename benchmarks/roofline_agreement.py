"""The tool's per-step roofline against ``benchmarks/decode_roofline.py``, both in one invocation.

For each preset and batch size B: the benchmark's decode run (its engine in this process: TPOT as
the median wall time of the steady decode steps, the bytes it counts, its measured bandwidth) and
a tool run of the same configuration through ``mrv2-prof run`` (its own runner process, the
default probes, ``probes.hbm_gbps`` set to the benchmark's measured bandwidth so both divide by
the same number): B requests at once, ``--prompt-len`` prompt and ``--output-len`` output tokens,
EOS ignored, FULL graphs captured at B. The tool's figure is ``analysis/roofline.py``'s median
decode step (bytes over the step's GPU time); the benchmark's is its bytes over TPOT. The table
gives both, their bytes per step and times, and the difference in points.

    python benchmarks/roofline_agreement.py --preset llama-1b --preset smollm2-135m \\
        --batches 1 64 --out roofline_agreement.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import decode_roofline as bench
from bench_io import write_results

from mrv2_prof.analysis.roofline import run_roofline
from mrv2_prof.store import Store


def tool_run(preset: str, batch: int, args, bandwidth: float, db: Path) -> dict:
    max_model_len = args.prompt_len + args.output_len + 1
    scenario = db.with_suffix(".yaml")  # the benchmark's engine settings (run_preset), as YAML
    scenario.write_text(
        f"name: roofline-{preset}-b{batch}\n"
        f"model: {{preset: {preset}}}\n"
        f"runner: {{device: cuda, kernels: triton, async_scheduling: true, staged_writes: true,"
        f" uva: true, cudagraph_mode: full, cudagraph_capture_sizes: [{batch}],"
        f" max_num_seqs: {batch}, max_num_reqs: {2 * batch}, max_num_batched_tokens: 8192,"
        f" max_model_len: {max_model_len}, enable_prefix_caching: false,"
        f" num_kv_blocks: {batch * -(-max_model_len // 16) + 16}}}\n"
        f"workload: {{num_requests: {batch}, arrival: {{pattern: burst}}, ignore_eos: true,"
        f" prompt_len: {{dist: fixed, value: {args.prompt_len}}},"
        f" output_len: {{dist: fixed, value: {args.output_len}}}}}\n"
        f"probes: {{hbm_gbps: {bandwidth / 1e9}}}\n"
    )
    cmd = [sys.executable, "-m", "mrv2_prof", "run", str(scenario), "--headless", "--db", str(db)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{preset} b{batch}: mrv2-prof run failed:\n{done.stderr[-3000:]}")
    with Store.open(db, read_only=True) as store:
        run_id = store.resolve_run("latest")
        roof = run_roofline(store, run_id)
        counts = store.connection.execute(
            "SELECT count(*), count(gpu_start_ns), count(*) FILTER (context_tokens >= 0), "
            "count(*) FILTER (perturbed) FROM steps WHERE run_id = ?",
            [run_id],
        ).fetchone()
    decode = next((s for s in roof.summaries if s.kind == "decode"), None)
    if decode is None:
        print(
            f"{preset} b{batch}: no decode step in the tool's roofline ({roof.note}); steps, "
            f"with GPU times, with extent, perturbed: {counts}\n{done.stdout[-2500:]}"
        )
        return {"tool_fraction": float("nan"), "tool_bytes": float("nan"),
                "tool_gpu_ms": float("nan"), "tool_steps": 0}  # fmt: skip
    per = roof.per_step
    mask = per.decode
    return {
        "tool_fraction": decode.fraction_p50,
        "tool_bytes": decode.bytes_p50,
        "tool_gpu_ms": float(sorted(per.gpu_s[mask])[mask.sum() // 2] * 1e3),
        "tool_steps": decode.steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    bandwidth = bench.read_bandwidth(4 << 30)
    print(f"HBM read bandwidth (torch.sum, best of 10): {bandwidth / 1e9:,.0f} GB/s", flush=True)
    bargs = SimpleNamespace(
        cpu_smoke=False, batches=args.batches, prompt_len=args.prompt_len,
        output_len=args.output_len, trace_steps=0,
    )  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.preset:
            for r in bench.run_preset(preset, bargs, bandwidth):
                b = r["batch"]
                tool = tool_run(preset, b, args, bandwidth, Path(tmp) / f"{preset}-{b}.duckdb")
                row = {"preset": preset, "batch": b, "bench_fraction": r["utilisation"],
                       "bench_bytes": r["step_bytes"], "bench_tpot_ms": r["tpot_ms"],
                       **tool}  # fmt: skip
                row["points"] = 100 * (row["tool_fraction"] - row["bench_fraction"])
                rows.append(row)
                print(
                    f"{preset:14s} b{b:<4d} bench {100 * r['utilisation']:5.1f}% "
                    f"({r['step_bytes'] / 1e9:.4f} GB, {r['tpot_ms']:.3f} ms)  tool "
                    f"{100 * tool['tool_fraction']:5.1f}% ({tool['tool_bytes'] / 1e9:.4f} GB, "
                    f"{tool['tool_gpu_ms']:.3f} ms GPU)  {row['points']:+.1f} points",
                    flush=True,
                )
    write_results(args.out, {"read_bytes_per_s": bandwidth}, rows)


if __name__ == "__main__":
    main()
