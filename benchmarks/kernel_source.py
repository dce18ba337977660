"""Where inside one kernel its warps wait: Nsight Compute's source counters (warp-state sampling
per instruction) of one kernel of a steady decode step, put together by Triton source line.

``kernel_stalls.py`` says how long each kernel of a step takes alone and which stall reasons
make up its cycles; this says at which line. The engine and its steady step are
``kernel_stalls.py``'s (``--drive``: ``--preset``, ``--variant``, ``--batch`` requests of
``--prompt-len`` tokens, the range around one step after ``--warm-steps``). ``ncu`` profiles the
first ``--launch-count`` launches of the kernels named by ``--kernel`` (a regular expression; one
launch a layer) with the ``SourceCounters`` and ``WarpStateStats`` sections, sampling every
warp's state every 32 cycles (``--warp-sampling-interval 0``), with the source imported, and its
source page (``--page source --print-source cuda,sass --csv``) gives per source line the samples
of its instructions and their stall reasons. The lines are summed over the launches, and then
by the function that holds each line (the kernel's body, the ``@triton.jit`` helpers it calls,
Triton's own reductions): the line's file is found by name in this checkout's package or in
Triton's, and a line whose text there is not the profiled one (the source changed since) is
counted as such, not guessed.

A sample is a warp seen at an instruction, so a line's share is the share of the kernel's warp
time spent at it: a load's consumer collects the wait for the load (``long_sb``: the long
scoreboard), a barrier its threads' waits. A short kernel gives few samples (an 8 µs attention
launch of 8 programs: about 45); each row shows its count, so a share can be weighed.

    python benchmarks/kernel_source.py --preset llama-1b --kernel _paged_decode_rope_kernel \\
        --out source.json
    python benchmarks/kernel_source.py --summarize source.csv   # a saved ncu source page
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from bench_io import write_results
from kernel_stalls import drive_command, ncu_binary, page_text, step_arguments

SAMPLES = "Warp Stall Sampling (All Samples)"
STALL_PREFIX = "stall_"  # a reason's samples: stall_long_sb, stall_barrier, ... (all samples)


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:  # "-" or empty: nothing sampled there
        return 0.0


def parse_source(text: str) -> list[dict]:
    """``ncu --page source --csv --print-source cuda,sass``: a ``File Path`` row opens a source
    file's block, a ``Line No`` row its header, then a row a source line (its number first) and
    rows of its instructions (number empty). Per (file, line), summed over the blocks (one set a
    launch): the line's text, its samples and its samples by stall reason, most samples first."""
    lines: dict[tuple[str, int], dict] = {}
    path, header = None, None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "File Path":
            path, header = Path(row[1]).name, None
        elif row[0] == "Line No":
            header = row
        elif header and path and row[0].strip().isdigit() and len(row) == len(header):
            key = (path, int(row[0]))
            cell = lines.setdefault(
                key, {"file": path, "line": key[1], "source": row[1].strip(), "samples": 0.0,
                      "stalls": defaultdict(float)},
            )  # fmt: skip
            cell["samples"] += _number(row[header.index(SAMPLES)])
            for i, name in enumerate(header):
                if name.startswith(STALL_PREFIX) and "(Not Issued)" not in name:
                    cell["stalls"][name[len(STALL_PREFIX) :]] += _number(row[i])
    if not lines:
        raise ValueError("not an ncu source page (no File Path / Line No blocks)")
    out = sorted(lines.values(), key=lambda c: (-c["samples"], c["file"], c["line"]))
    for c in out:
        c["stalls"] = {k: v for k, v in sorted(c["stalls"].items(), key=lambda kv: -kv[1]) if v}
    return out


PACKAGE = Path(__file__).resolve().parent.parent / "mrv2_prof"


def source_roots() -> list[Path]:
    """Where a profiled line's file is looked for: this checkout's package, and Triton's."""
    roots = [PACKAGE]
    try:
        import triton
    except ImportError:
        return roots
    return [*roots, Path(triton.__file__).resolve().parent]


def enclosing_functions(text: str) -> dict[int, str]:
    """Line number -> the name of the innermost ``def`` holding it, of a Python source."""
    out: dict[int, str] = {}
    for node in ast.walk(ast.parse(text)):  # outer functions first: an inner one overwrites
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for no in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                out[no] = node.name
    return out


def _same(line: str, profiled: str) -> bool:
    """A file's line is the profiled one: the same text but for spaces and quotes (ncu's CSV
    does not escape a quote inside a line: ``float("-inf")`` comes as ``float(-inf"))"``)."""
    return line.translate(_LOOSE) == profiled.translate(_LOOSE)


_LOOSE = str.maketrans("", "", "\"' \t")


def _function_of(cell: dict, candidates: list[Path], cache: dict) -> str:
    """The function holding a profiled line, in the one candidate file whose line has the
    profiled text; else why not."""
    matches = []
    for path in candidates:
        if path not in cache:
            text = path.read_text()
            cache[path] = (text.splitlines(), enclosing_functions(text))
        rows, funcs = cache[path]
        if 0 < cell["line"] <= len(rows) and _same(rows[cell["line"] - 1], cell["source"]):
            matches.append(funcs.get(cell["line"], "(module level)"))
    if not candidates:
        return "(source not found)"
    if len(set(matches)) == 1:
        return matches[0]
    return "(source changed)" if not matches else "(ambiguous)"


def by_function(lines: list[dict], roots: list[Path] | None = None) -> list[dict]:
    """The samples summed by (file, function holding the line), most first, with each group's
    share of all samples and its lines."""
    roots = source_roots() if roots is None else roots
    found: dict[str, list[Path]] = {}
    cache: dict = {}
    groups: dict[tuple[str, str], dict] = {}
    total = sum(c["samples"] for c in lines) or 1.0
    for c in lines:
        if c["file"] not in found:
            found[c["file"]] = sorted(p for root in roots for p in root.rglob(c["file"]))
        key = (c["file"], _function_of(c, found[c["file"]], cache))
        g = groups.setdefault(key, {"file": key[0], "function": key[1], "samples": 0.0, "lines": 0})
        g["samples"] += c["samples"]
        g["lines"] += 1
    out = sorted(groups.values(), key=lambda g: (-g["samples"], g["file"], g["function"]))
    for g in out:
        g["share"] = g["samples"] / total
    return out


def function_markdown(groups: list[dict]) -> str:
    rows = ["| function | file | share | samples | lines |", "| --- | --- | ---: | ---: | ---: |"]
    for g in groups:
        rows.append(f"| {g['function']} | {g['file']} | {100 * g['share']:.1f} % | "
                    f"{g['samples']:.0f} | {g['lines']} |")  # fmt: skip
    return "\n".join(rows)


def markdown(lines: list[dict], top: int = 20) -> str:
    """The lines with the most samples: share of all, samples, the two main stall reasons."""
    total = sum(c["samples"] for c in lines)
    rows = [
        f"{total:.0f} samples over {len(lines)} source lines",
        "",
        "| file:line | share | samples | main stalls | source |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    for c in lines[:top]:
        if not c["samples"]:
            break
        main = ", ".join(f"{k} {v:.0f}" for k, v in list(c["stalls"].items())[:2])
        src = c["source"].replace("|", "\\|")[:80]
        rows.append(f"| {c['file']}:{c['line']} | {100 * c['samples'] / total:.1f} % | "
                    f"{c['samples']:.0f} | {main} | `{src}` |")  # fmt: skip
    return "\n".join(rows)


def profile(args) -> str:
    """Run ``kernel_stalls.py --drive`` under ncu with the source counters; the source page."""
    ncu = ncu_binary(args, "kernel_source")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "source"
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none",
               "--graph-profiling", "node", "--target-processes", "all", "-k",
               f"regex:{args.kernel}", "--launch-count", str(args.launch_count),
               "--section", "SourceCounters", "--section", "WarpStateStats",
               "--warp-sampling-interval", "0", "--import-source", "yes", "-f", "-o", str(base),
               *drive_command(args)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        rep = base.with_name(base.name + ".ncu-rep")
        if run.returncode != 0 or not rep.exists():
            sys.stderr.write(run.stdout[-3000:] + run.stderr[-3000:])
            raise SystemExit(f"kernel_source: ncu exited {run.returncode}")
        page = subprocess.run(
            [ncu, "--import", str(rep), "--page", "source", "--csv", "--print-source",
             "cuda,sass"], capture_output=True, text=True, check=True,
        )  # fmt: skip
        return page.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    step_arguments(ap)
    ap.add_argument(
        "--kernel",
        default="_paged_decode_rope_kernel",
        help="a regular expression of the kernel's name (default: batch-1 attention)",
    )
    ap.add_argument("--launch-count", type=int, default=16, help="launches profiled (a layer each)")
    ap.add_argument("--top", type=int, default=20, help="source lines shown")
    ap.add_argument("--raw-out", default=None, help="keep ncu's source page (CSV) here")
    ap.add_argument("--summarize", default=None, help="a saved source page to read")
    ap.add_argument("--out", default=None, help="write the lines as JSON here")
    args = ap.parse_args()
    text = page_text(args, profile, "kernel_source")
    try:
        lines = parse_source(text)
    except ValueError as e:
        raise SystemExit(f"kernel_source: {e}") from None
    run = f"{args.preset} {args.variant} batch {args.batch}: {args.kernel}"
    print(f"the saved page {args.summarize}" if args.summarize else run)
    print(markdown(lines, args.top))
    functions = by_function(lines)
    print("\nBy the function that holds the line:\n")
    print(function_markdown(functions))
    meta = {"preset": args.preset, "variant": args.variant, "batch": args.batch,
            "kernel": args.kernel, "by_function": functions}  # fmt: skip
    write_results(args.out, meta, lines)


if __name__ == "__main__":
    main()
