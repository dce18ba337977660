"""Where a decode step's kernels spend their time: Nsight Compute (``ncu``) on one steady decode
step of the benchmark's engine, each kernel of the step's CUDA graph measured alone.

The script runs itself under ``ncu`` (``--drive``): one engine of ``--preset`` with the paths of
``--variant`` (``decode_roofline.py``'s variants and engine: FULL graphs at exactly the batch),
``--batch`` requests of ``--prompt-len`` tokens decoding; after ``--warm-steps`` steady decode
steps the profiler range (``cudaProfilerStart`` / ``Stop``) opens around one ``Engine.step``.
``ncu`` profiles every kernel launched in the range, the graph's kernel nodes one by one
(``--graph-profiling node``), with clocks left as they are (``--clock-control none``) and the
caches flushed before each kernel (ncu's default: a decode step's weights are not in L2 either).
A kernel measured alone runs without the PDL overlap of its neighbours, so the sum of the
durations is the step's kernel bodies without its launch overlap or gaps.

Per kernel (in launch order): duration, grid and block, registers a thread, achieved occupancy,
DRAM throughput (% of peak), the warp cycles per issued instruction, and the stall reasons that
make them up (``smsp__average_warps_issue_stalled_<reason>_per_issue_active``: warps stalled for
the reason per issued instruction; their sum is the cycles per instruction). The summary puts the
kernels together by name, grid and the kernel launched before them (one op of every layer each:
two projections of one GEMV kernel and grid, as llama-1b's o and down at batch 1, follow
different kernels in the layer), with their time per step and their top stall reasons: a
kernel whose cycles go to ``long_scoreboard`` waits on global memory loads, ``barrier`` on its
threads' barriers, ``membar`` on fences, ``no_instruction`` / ``wait`` on its own instruction
stream.

    python benchmarks/kernel_stalls.py --preset smollm2-135m \\
        --variant fused_onepass+pdl+fold+split --out stalls.json
    python benchmarks/kernel_stalls.py --summarize raw.csv   # a saved ncu --page raw --csv
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from bench_io import write_results

SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats")
# warps stalled for a reason per issued instruction (WarpStateStats); the sampled counts if not
STALL_FAMILIES = (
    re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$"),
    re.compile(r"smsp__pcsamp_warps_issue_stalled_(\w+)$"),
)
COLUMNS = {  # our name: ncu's metric (the first present)
    "duration": ("gpu__time_duration.sum",),
    "registers": ("launch__registers_per_thread",),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "dram_pct": (
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "cycles_per_issue": ("smsp__average_warp_latency_per_inst_issued.ratio",),
}
TO_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_raw(text: str) -> list[dict]:
    """``ncu --page raw --csv``: a header of metric names, a row of their units, then a row a
    kernel. -> one dict a kernel: name, grid, block, ``COLUMNS``' values (duration in µs) and
    ``stalls`` {reason: warps stalled a issued instruction}."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None or len(rows) < start + 2:
        raise ValueError("not an ncu --page raw --csv table (no ID header)")
    header, units = rows[start], rows[start + 1]
    kernels = []
    for r in rows[start + 2 :]:
        if len(r) != len(header):
            continue
        cell = dict(zip(header, r, strict=True))
        k = {
            "id": int(_number(cell["ID"]) or 0),
            "name": cell.get("Kernel Name", "?"),
            "grid": cell.get("Grid Size", "").strip(),
            "block": cell.get("Block Size", "").strip(),
            "stalls": {},
        }
        for ours, metrics in COLUMNS.items():
            metric = next((m for m in metrics if m in cell), None)
            k[ours] = _number(cell[metric]) if metric else None
            if ours == "duration" and k[ours] is not None:
                k[ours] *= TO_US.get(units[header.index(metric)], 1.0)
        for family in STALL_FAMILIES:
            for metric, value in cell.items():
                m = family.match(metric)
                if m and not m.group(1).endswith("not_issued") and _number(value):
                    k["stalls"][m.group(1)] = _number(value)
            if k["stalls"]:
                break
        kernels.append(k)
    return kernels


def top_stalls(stalls: dict[str, float], n: int = 3) -> list[tuple[str, float]]:
    """The ``n`` largest stall reasons with their share of all stalled warp cycles."""
    total = sum(stalls.values()) or 1.0
    return [(r, v / total) for r, v in sorted(stalls.items(), key=lambda x: -x[1])[:n]]


def summarize(kernels: list[dict]) -> list[dict]:
    """The kernels put together by (name, grid, the short name of the kernel launched before, in
    ``kernels``' order): launches, µs in all and the mean a launch, and the stall reasons summed
    over their launches weighted by duration."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    ordered = sorted(kernels, key=lambda k: k["id"])  # launch order
    for before, k in zip([None, *ordered], ordered, strict=False):
        groups[(k["name"], k["grid"], _short(before["name"]) if before else "")].append(k)
    out = []
    for (name, grid, after), ks in groups.items():
        total = sum(k["duration"] or 0.0 for k in ks)
        stalls: dict[str, float] = defaultdict(float)
        for k in ks:
            for reason, v in k["stalls"].items():
                stalls[reason] += v * (k["duration"] or 0.0)
        first = ks[0]
        out.append({
            "name": name, "grid": grid, "after": after, "block": first["block"],
            "launches": len(ks),
            "total_us": total, "us_per_launch": total / len(ks),
            "registers": first["registers"],
            "occupancy_pct": _mean(k["occupancy_pct"] for k in ks),
            "dram_pct": _mean(k["dram_pct"] for k in ks),
            "cycles_per_issue": _mean(k["cycles_per_issue"] for k in ks),
            "top_stalls": top_stalls(dict(stalls)),
        })  # fmt: skip
    return sorted(out, key=lambda g: -g["total_us"])


def _mean(values) -> float | None:
    vs = [v for v in values if v is not None]
    return sum(vs) / len(vs) if vs else None


def _short(name: str, width: int = 40) -> str:
    name = name.split("(")[0]
    return name if len(name) <= width else name[: width - 1] + "…"


def markdown(groups: list[dict], kernels: list[dict]) -> str:
    total = sum(k["duration"] or 0.0 for k in kernels)
    lines = [
        f"{len(kernels)} kernels, {total:.1f} µs of kernel bodies measured alone",
        "",
        "| kernel | grid | after | block | launches | µs / launch | µs in all | regs | "
        "occupancy | DRAM % | cycles / issue | top stalls (share of stalled cycles) |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    f = lambda v, d=1: "" if v is None else f"{v:.{d}f}"  # noqa: E731
    for g in groups:
        stalls = ", ".join(f"{r} {100 * s:.0f} %" for r, s in g["top_stalls"])
        lines.append(
            f"| {_short(g['name'])} | {g['grid']} | {g['after']} | {g['block']} | "
            f"{g['launches']} | "
            f"{f(g['us_per_launch'], 2)} | {f(g['total_us'])} | {f(g['registers'], 0)} | "
            f"{f(g['occupancy_pct'])} | {f(g['dram_pct'])} | {f(g['cycles_per_issue'])} | "
            f"{stalls} |"
        )
    return "\n".join(lines)


def drive(args) -> None:
    """The profiled process: the engine to its steady decode, then one step in the range."""
    import numpy as np
    import torch
    from decode_roofline import engine_config, parse_variant, variant_paths, variant_switches

    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.runner.core.request import SamplingParams
    from mrv2_prof.runner.engine import Engine

    mode, extras = parse_variant(args.variant)
    with variant_switches(extras):  # its module switches too (forced splits, key tiles, ...)
        max_len = args.prompt_len + args.warm_steps + 8
        config = engine_config(True, [args.batch], max_len, variant_paths(mode, extras))
        engine = Engine(config, ModelSpec(preset=args.preset))
        rng = np.random.default_rng(0)
        params = SamplingParams(max_tokens=args.warm_steps + 6, ignore_eos=True)
        for i in range(args.batch):
            prompt = rng.integers(0, engine.vocab_size, args.prompt_len).tolist()
            engine.add_request(f"r{i}", prompt, params)
        steady = 0
        while engine.has_unfinished_requests():
            so = engine.step().scheduler_output
            steady += so.num_reqs == args.batch and so.total_num_scheduled_tokens == args.batch
            if steady == args.warm_steps:
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                engine.step()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                return
    raise SystemExit("kernel_stalls: the run ended before its steady decode steps")


def step_arguments(ap: argparse.ArgumentParser) -> None:
    """The engine and step ``--drive`` runs, and the ncu binary (this script's and
    ``kernel_source.py``'s)."""
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument(
        "--variant",
        default="plain+pdl+fold+split",
        help="decode_roofline.py's MODE[+pdl][+fold][+split]... (the runner paths)",
    )
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--warm-steps", type=int, default=8, help="steady decode steps before")
    ap.add_argument("--ncu", default=None, help="the ncu binary (default: on PATH, then CUDA's)")


def ncu_binary(args, who: str) -> str:
    """``--ncu``, else ncu on PATH, else CUDA's; one line and exit where there is none."""
    ncu = args.ncu or shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not Path(ncu).exists() and not shutil.which(ncu):
        raise SystemExit(f"{who}: --ncu {ncu}: no Nsight Compute CLI there")
    return ncu


def drive_command(args) -> list[str]:
    """This script run as ``--drive`` with ``args``' engine and step (the profiled process)."""
    return [sys.executable, __file__, "--drive", "--preset", args.preset, "--variant",
            args.variant, "--batch", str(args.batch), "--prompt-len", str(args.prompt_len),
            "--warm-steps", str(args.warm_steps)]  # fmt: skip


def page_text(args, profile, who: str) -> str:
    """The ncu page to read: the saved one given to ``--summarize`` (one line and exit where
    there is none), else ``profile(args)``'s, kept at ``--raw-out`` where asked."""
    if args.summarize:
        path = Path(args.summarize)
        if not path.is_file():
            raise SystemExit(f"{who}: --summarize {path}: no such file")
        return path.read_text()
    text = profile(args)
    if args.raw_out:
        Path(args.raw_out).write_text(text)
    return text


def profile(args) -> str:
    """Run ``--drive`` under ncu; its raw CSV."""
    ncu = ncu_binary(args, "kernel_stalls")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.report or Path(tmp) / "stalls").with_suffix("")
        rep = base.with_name(base.name + ".ncu-rep")  # ncu -o adds the suffix
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none",
               "--graph-profiling", "node", "--target-processes", "all", "-f", "-o",
               str(base)]  # fmt: skip
        for s in SECTIONS:
            cmd += ["--section", s]
        if args.launch_count:
            cmd += ["--launch-count", str(args.launch_count)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        run = subprocess.run(cmd + drive_command(args), env=env, capture_output=True, text=True)
        if run.returncode != 0 or not rep.exists():
            sys.stderr.write(run.stdout[-3000:] + run.stderr[-3000:])
            raise SystemExit(f"kernel_stalls: ncu exited {run.returncode}")
        raw = subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "raw"],
                             capture_output=True, text=True, check=True)  # fmt: skip
        return raw.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    step_arguments(ap)
    ap.add_argument("--launch-count", type=int, default=0, help="at most N kernels (0: all)")
    ap.add_argument("--report", default=None, help="keep ncu's report (.ncu-rep) here")
    ap.add_argument("--raw-out", default=None, help="keep ncu's raw CSV here")
    ap.add_argument("--summarize", default=None, help="a saved ncu --page raw --csv to read")
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="write the kernels and the summary as JSON here")
    args = ap.parse_args()
    if args.drive:
        return drive(args)
    text = page_text(args, profile, "kernel_stalls")
    try:
        kernels = parse_raw(text)
    except ValueError as e:
        raise SystemExit(f"kernel_stalls: {e}") from None
    groups = summarize(kernels)
    print(f"{args.preset} {args.variant} batch {args.batch}")
    print(markdown(groups, kernels))
    meta = {"preset": args.preset, "variant": args.variant, "batch": args.batch}
    write_results(args.out, meta, [{"kernels": kernels, "groups": groups}])


if __name__ == "__main__":
    main()
