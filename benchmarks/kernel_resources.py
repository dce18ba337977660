"""What each Triton kernel of a decode step's forward asks of an SM, read on a CPU host.

The model's forward (the embedding, ``--layers`` decoder layers and the final norm: the LM head
is a cuBLAS matmul) runs on the CPU at a preset's real sizes in bf16 with the kernel paths of a
``decode_roofline.py`` variant, for a decode batch of ``--batch`` requests of ``--context`` keys.
Each Triton launch is recorded instead of run (its arguments, constexprs and launch options,
decided as on a GPU of ``--sms`` streaming multiprocessors with PDL), then compiled for sm_90
with Triton's own toolchain, and its cubin's resource usage read back (``cuobjdump
--dump-resource-usage``): no GPU is needed.

* ``regs``: registers a thread; ``spill B``: a thread's stack frame and local memory
  (``STACK`` + ``LOCAL``: registers ptxas spilled, or an array it could not keep in them);
  ``shared KiB``: the launch's shared memory (Triton's buffers);
* ``blocks / SM``: the programs one SM can hold at once, the least of what its 64K registers
  (allocated 256 a warp), its 228 KiB of shared memory (1 KiB reserved a block), its 64 warps
  and 32 blocks allow; 0: the launch cannot run (over 227 KiB of shared memory a block);
* ``waves``: the grid's programs over ``--sms`` x blocks / SM (above 1: not all at once).

The interpreter's stand-ins are set back to the GPU's values: the decode GEMM's ``DOT_F32`` (bf16
dots in float32 on the CPU) is compiled False. Arguments are specialised as Triton specialises
them at launch (a pointer's 16-byte alignment, an integer's ``== 1`` and ``% 16``).

    python benchmarks/kernel_resources.py --preset llama-1b --preset qwen3-0.6b --batch 1 64 \\
        --variant plain+pdl+fold+split --variant plain+pdl+fold+split+ds5
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_io import write_results
from decode_roofline import parse_variant, variant_paths, variant_switches

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model import attention_split_kv_triton, kv_cache_shape, pdl
from mrv2_prof.runner.model.args import ModelArgs
from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.checkpoint_args import model_args_for, preset_names
from mrv2_prof.runner.model.decoder import LlamaForCausalLM
from mrv2_prof.runner.model.model_kernels import triton_model_kernels
from mrv2_prof.runner.worker.kernel_paths import apply_kernel_paths

# sm_90 (H100 / H200): registers, shared memory (per SM; the most a block may take), warps, blocks
SM90 = {"regs": 65536, "shared": 233472, "block_shared": 232448, "warps": 64, "blocks": 32}
TYPES = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.uint8: "u8", torch.bool: "i1",
}  # fmt: skip
INTERPRETER_STAND_INS = {"DOT_F32": False}


@dataclass
class Launch:
    name: str
    fn: Any  # the JITFunction
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Resources:
    regs: int
    spill_bytes: int
    shared_bytes: int


def blocks_per_sm(regs: int, warps: int, shared_bytes: int, sm: dict = SM90) -> int:
    """Programs of ``warps`` warps, ``regs`` registers a thread and ``shared_bytes`` of shared
    memory that one SM holds at once (0: over the most shared memory a block may take)."""
    if shared_bytes > sm["block_shared"]:
        return 0
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = sm["regs"] // (per_warp * warps)
    by_shared = sm["shared"] // (shared_bytes + 1024)
    return min(by_regs, by_shared, sm["warps"] // warps, sm["blocks"])


@contextlib.contextmanager
def captured(sms: int):
    """Every ``kernel[grid](...)`` in the block recorded into the yielded list and not run, its
    launch decided as on a GPU of ``sms`` SMs that takes PDL."""
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []

    def record(self, *args, grid, warmup, **kwargs):
        grid = grid(kwargs) if callable(grid) else grid
        launches.append(Launch(self.__name__, self, tuple(grid), args, kwargs))

    saved = (JITFunction.run, attention_split_kv_triton.num_sms, pdl._supports_pdl)
    JITFunction.run = record
    attention_split_kv_triton.num_sms = lambda device: sms
    pdl._supports_pdl = lambda device: True
    try:
        yield launches
    finally:
        JITFunction.run, attention_split_kv_triton.num_sms, pdl._supports_pdl = saved


def ast_source(launch: Launch):
    """The launch as Triton compiles it: its signature, constexprs and specialisations."""
    from triton.compiler import ASTSource

    fn = launch.fn
    names = {p.name for p in fn.params}
    bound = inspect.signature(fn.fn).bind(
        *launch.args, **{k: v for k, v in launch.kwargs.items() if k in names}
    )
    bound.apply_defaults()
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        value = bound.arguments[p.name]
        if p.is_constexpr or value is None:
            signature[p.name] = "constexpr"
            constexprs[p.name] = INTERPRETER_STAND_INS.get(p.name, value)
            continue
        by_value = not getattr(p, "do_not_specialize", False)
        if isinstance(value, torch.Tensor):
            signature[p.name] = "*" + TYPES[value.dtype]
            by_align = not getattr(p, "do_not_specialize_on_alignment", False)
            aligned = by_align and value.data_ptr() % 16 == 0
        elif isinstance(value, bool):
            signature[p.name], aligned = "i1", False
        elif isinstance(value, int):
            if by_value and value == 1:
                signature[p.name], constexprs[p.name] = "constexpr", 1
                continue
            signature[p.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            aligned = by_value and value % 16 == 0
        elif isinstance(value, float):
            signature[p.name], aligned = "fp32", False
        else:
            raise TypeError(f"{launch.name}: argument {p.name} is a {type(value).__name__}")
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)


def launch_key(launch: Launch) -> str:
    """What one compile serves: the kernel, its signature, constexprs and options."""
    src = ast_source(launch)
    options = sorted((k, v) for k, v in launch.kwargs.items() if k not in src.signature)
    return repr(
        (launch.name, src.signature, sorted(src.constants.items()), sorted(src.attrs), options)
    )


def cuobjdump() -> str:
    import triton.backends.nvidia as nvidia

    bundled = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else "cuobjdump"


def resource_usage(text: str) -> tuple[int, int]:
    """(registers, stack + local bytes a thread) of the one function in ``cuobjdump
    --dump-resource-usage``: ptxas spills registers into the stack frame (``STL`` / ``LDL``)."""
    found = [re.search(rf"\b{name}:(\d+)", text) for name in ("REG", "STACK", "LOCAL")]
    if None in found:
        raise ValueError(f"no resource usage in cuobjdump's output: {text[:200]!r}")
    regs, stack, local = (int(m.group(1)) for m in found)
    return regs, stack + local


def compile_launch(launch: Launch) -> Resources:
    """The launch compiled for sm_90 and its cubin's resources."""
    import triton
    from triton.backends.compiler import GPUTarget

    names = {p.name for p in launch.fn.params}
    options = {k: v for k, v in launch.kwargs.items() if k not in names}
    kernel = triton.compile(ast_source(launch), target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        dump = subprocess.run(
            [cuobjdump(), "--dump-resource-usage", str(cubin)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    regs, spill = resource_usage(dump.stdout)
    return Resources(regs, spill, kernel.metadata.shared)


def decode_batch(num_reqs: int, context: int, width: int, block_size: int = 16):
    """A decode step's metadata and positions on the CPU: request i has ``context`` keys cached
    in its own blocks and one new token; block tables ``width`` blocks wide."""
    qsl = np.arange(num_reqs + 1, dtype=np.int32)
    seq = np.full(num_reqs, context + 1, dtype=np.int32)
    table = torch.arange(num_reqs * width, dtype=torch.int32).reshape(num_reqs, width)
    slots = table[:, context // block_size].long() * block_size + context % block_size
    meta = AttentionMetadata(
        num_reqs, num_reqs, torch.from_numpy(qsl), torch.from_numpy(seq), table, slots, qsl, seq,
        block_size,
    )  # fmt: skip
    return meta, torch.full((num_reqs,), context, dtype=torch.int64)


def step_launches(
    model_args: ModelArgs, num_reqs: int, variant: str, *, context: int = 192,
    max_model_len: int = 0, layers: int = 1, sms: int = 132,
) -> list[Launch]:  # fmt: skip
    """The Triton launches of one decode step's forward (``layers`` decoder layers of the model
    ``model_args`` describes), as a GPU of ``sms`` SMs would make them under ``variant``."""
    mode, extras = parse_variant(variant)
    args = replace(model_args, num_hidden_layers=layers)
    with torch.device("meta"):
        model = LlamaForCausalLM(args, triton_model_kernels())
    model = model.to(torch.bfloat16)._apply(lambda t: torch.empty(t.shape, dtype=t.dtype))
    model.init_buffers()
    block_size = 16
    width = -(-max(max_model_len, context + 1) // block_size)
    caches = [
        torch.zeros(kv_cache_shape(args, num_reqs * width, block_size), dtype=torch.bfloat16)
        for _ in range(layers)
    ]
    meta, positions = decode_batch(num_reqs, context, width, block_size)
    ids = torch.zeros(num_reqs, dtype=torch.int64)
    with variant_switches(extras):  # the paths read some switches (the narrow GEMM's bounds)
        apply_kernel_paths(variant_paths(mode, extras))
        with captured(sms) as launches, torch.no_grad():
            model(ids, positions, caches, meta)
    return launches


def resources_row(launch: Launch, compiled: dict[str, Resources] | None, sms: int) -> dict:
    """The launch's table row; ``compiled``: the launches compiled so far, by ``launch_key``."""
    warps = launch.kwargs.get("num_warps", 4)
    row = {
        "kernel": launch.name, "grid": list(launch.grid), "num_warps": warps,
        "num_stages": launch.kwargs.get("num_stages", 3), "maxnreg": launch.kwargs.get("maxnreg"),
    }  # fmt: skip
    if compiled is None:
        return row
    key = launch_key(launch)
    if key not in compiled:
        compiled[key] = compile_launch(launch)
    r = compiled[key]
    fit = blocks_per_sm(r.regs, warps, r.shared_bytes)
    waves = math.prod(launch.grid) / (sms * fit) if fit else None
    return {**row, **asdict(r), "blocks_per_sm": fit, "waves": waves}


def markdown_row(row: dict[str, Any]) -> str:
    cells = [row["kernel"], "x".join(map(str, row["grid"])), row["num_warps"], row["num_stages"]]
    if "regs" in row:
        shared = f"{row['shared_bytes'] / 1024:.1f}"
        waves = "-" if row["waves"] is None else f"{row['waves']:.2f}"
        cells += [row["regs"], row["spill_bytes"], shared, row["blocks_per_sm"], waves]
    return "| " + " | ".join(map(str, cells)) + " |"


def head_size(text: str) -> int:
    """``--head-dim``: a power of two in [16, 256], what the attention kernels' tiles take."""
    n = int(text) if text.isdigit() else 0
    if n < 16 or n > 256 or n & (n - 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a power of two in [16, 256]")
    return n


def variant_text(text: str) -> str:
    parse_variant(text)  # argparse.ArgumentTypeError names the text
    return text


def regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {exc}") from None
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", choices=preset_names(), help="repeatable")
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument(
        "--variant", action="append", type=variant_text,
        help="repeatable; decode_roofline.py's MODE[+pdl][+fold]... (default plain+pdl+fold+split)",
    )  # fmt: skip
    ap.add_argument("--context", type=int, default=192, help="keys cached a request")
    ap.add_argument(
        "--max-model-len", type=int, default=0,
        help="the block tables' width in keys (split-KV reads its count from it); "
        "default: the context + 1, as decode_roofline.py's prompt + output + 1",
    )  # fmt: skip
    ap.add_argument("--layers", type=int, default=1, help="decoder layers in the forward")
    ap.add_argument("--head-dim", type=head_size, default=0, help="the preset at another head size")
    ap.add_argument(
        "--kernels", type=regex, default="", help="compile only the kernels this regex finds"
    )
    ap.add_argument(
        "--stages", type=int, default=0, help="compile those kernels at N stages, not the launch's"
    )
    ap.add_argument(
        "--warps", type=int, default=0, help="compile those kernels with N warps, not the launch's"
    )
    ap.add_argument(
        "--maxnreg", type=int, default=0, help="compile those kernels capped at N registers"
    )
    ap.add_argument("--list", action="store_true", help="list the launches, compile nothing")
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SMs (H100 / H200: 132)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("kernel_resources: compiles for sm_90; unset TRITON_INTERPRET")
    results, compiled = [], None if args.list else {}
    cols = ["kernel", "grid", "warps", "stages"]
    cols += [] if args.list else ["regs", "spill B", "shared KiB", "blocks / SM", "waves"]
    head = f"| {' | '.join(cols)} |\n|{' --- |' * len(cols)}"
    for preset in args.preset or ["llama-1b"]:
        model_args = model_args_for(ModelSpec(preset=preset))
        if args.head_dim:
            model_args = replace(model_args, head_dim=args.head_dim)
        for variant in args.variant or ["plain+pdl+fold+split"]:
            for batch in args.batch:
                launches = step_launches(
                    model_args, batch, variant, context=args.context,
                    max_model_len=args.max_model_len, layers=args.layers, sms=args.sms,
                )  # fmt: skip
                print(f"\n{preset}, batch {batch}, {variant}: {len(launches)} launches")
                print(head)
                for launch in launches:
                    wanted = re.search(args.kernels, launch.name)
                    overrides = [("num_stages", args.stages), ("num_warps", args.warps)]
                    for option, value in overrides + [("maxnreg", args.maxnreg)]:
                        if wanted and value:
                            launch.kwargs[option] = value
                    row = resources_row(launch, compiled if wanted else None, args.sms)
                    print(markdown_row(row))
                    results.append({"preset": preset, "batch": batch, "variant": variant, **row})
    meta = {"target": "sm_90", "sms": args.sms, "context": args.context, "layers": args.layers}
    meta |= {"max_model_len": args.max_model_len, "head_dim": args.head_dim}
    write_results(args.out, meta, results)


if __name__ == "__main__":
    main()
