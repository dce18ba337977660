"""How long a GGUF checkpoint takes to load: the header, the bytes, the dequantization, in all.

For the shipped SmolLM2-135M (Q4_1, 98 MB) or any ``--path``, times, each the median of
``--repeats`` runs:

* ``header``: ``read_header`` (the metadata and tensor table, every offset checked), what the
  CLI's preflight reads before a run; and ``gguf.GGUFReader`` on the same file for comparison
  (``--no-reader`` leaves it out; it decodes the whole vocabulary);
* ``check``: ``ModelArgs`` from the metadata and every tensor's name, shape and type checked;
* ``read``: every tensor's bytes read from the file into host memory;
* ``dequantize``: the bytes copied to ``--device`` and dequantized there to ``--dtype``;
* ``total``: ``load_model`` end to end (the above, the model built and its state assigned).

    python benchmarks/gguf_load.py                        # SmolLM2 on the CPU, float32
    python benchmarks/gguf_load.py --device cuda --dtype bfloat16 --out gguf_load.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from bench_io import write_results

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model.checkpoint_args import expected_tensors
from mrv2_prof.runner.model.gguf_dequant import dequantize, type_name
from mrv2_prof.runner.model.gguf_file import read_header
from mrv2_prof.runner.model.gguf_model import checked_tensors, model_args, unpermute_qk
from mrv2_prof.runner.model.loader import load_model
from mrv2_prof.runner.model.shipped import require_shipped

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def phases(path: Path, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Seconds of each phase of one load, done step by step as the loader does it."""
    t0 = time.perf_counter()
    header = read_header(path)
    t1 = time.perf_counter()
    args = model_args(header)
    tensors = checked_tensors(header, expected_tensors(args))
    t2 = time.perf_counter()
    raw = {}
    with path.open("rb") as f:
        for name, info in sorted(tensors.items(), key=lambda item: item[1].offset):
            raw[name] = torch.empty(info.nbytes, dtype=torch.uint8)
            f.seek(info.offset)
            f.readinto(raw[name].numpy())
    t3 = time.perf_counter()
    for name, info in tensors.items():
        values = dequantize(raw[name].to(device), info.qtype, info.shape, dtype)
        unpermute_qk(name, values, args)
    sync(device)
    t4 = time.perf_counter()
    return {"header": t1 - t0, "check": t2 - t1, "read": t3 - t2, "dequantize": t4 - t3}


def total(path: Path, device: torch.device, dtype: torch.dtype) -> float:
    t0 = time.perf_counter()
    load_model(ModelSpec(preset=None, path=str(path)), device, dtype)
    sync(device)
    return time.perf_counter() - t0


def gguf_reader(path: Path) -> float:
    import gguf

    t0 = time.perf_counter()
    gguf.GGUFReader(path)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", type=Path, help="a GGUF file (default: the shipped smollm2-135m)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-reader", action="store_true", help="do not time gguf.GGUFReader")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    path = args.path or require_shipped("smollm2-135m")
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    header = read_header(path)
    types: dict[str, int] = {}
    for info in header.tensors.values():
        types[type_name(info.qtype)] = types.get(type_name(info.qtype), 0) + 1
    total(path, device, dtype)  # warm-up: imports, the page cache, first allocations
    runs = [phases(path, device, dtype) | {"total": total(path, device, dtype)}
            for _ in range(args.repeats)]  # fmt: skip
    result = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    if not args.no_reader:
        result["gguf_reader"] = statistics.median(gguf_reader(path) for _ in range(args.repeats))
    size = path.stat().st_size
    print(f"{path.name}: {size / 1e6:.1f} MB, {len(header.tensors)} tensors "
          f"({', '.join(f'{n} {t}' for t, n in types.items())}), {device} {args.dtype}, "
          f"median of {args.repeats}, {torch.get_num_threads()} threads")  # fmt: skip
    print("| phase | seconds |\n| --- | ---: |")
    for key, seconds in result.items():
        print(f"| {key} | {seconds:.3f} |")
    meta = {"file": path.name, "bytes": size, "device": str(device), "dtype": args.dtype,
            "repeats": args.repeats, "threads": torch.get_num_threads(),
            "types": types}  # fmt: skip
    write_results(args.out, meta, [result])


if __name__ == "__main__":
    main()
