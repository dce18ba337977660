"""The fused model kernels against their torch references on one GPU, at the presets' shapes.

Times each Triton kernel of ``runner/model`` (RMSNorm, residual add + RMSNorm, RoPE and QK-norm +
RoPE of q and k, SiLU-and-mul) and its torch reference (median of ``triton.testing.do_bench``
after its warm-up) at 1 / 64 / 256 tokens, and one whole decoder layer with each op bundle
(both with the Triton attention over a paged cache, a uniform decode batch: eagerly, and as a
captured CUDA graph, which is how decode steps run). Prints a markdown table with the speed-up
and the bytes each kernel moves per second; ``--out`` writes the rows as JSON.

    python benchmarks/model_kernels.py --out model_kernels.json
    python benchmarks/model_kernels.py --cpu-smoke   # tiny shapes in Triton's interpreter
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

if "--cpu-smoke" in sys.argv:  # before triton is imported: it reads this at decoration time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402
from bench_io import write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runner"))
from test_fused_model import paged_batch  # noqa: E402

from mrv2_prof.runner.model import PRESETS, DecoderLayer, ModelArgs, kv_cache_shape  # noqa: E402
from mrv2_prof.runner.model.activation_triton import (  # noqa: E402
    silu_and_mul_ref,
    silu_and_mul_triton,
)
from mrv2_prof.runner.model.attention_triton import (  # noqa: E402
    paged_attention_triton,
    write_kv_triton,
)
from mrv2_prof.runner.model.layers import RotaryEmbedding  # noqa: E402
from mrv2_prof.runner.model.model_kernels import (  # noqa: E402
    TORCH_MODEL_KERNELS,
    ModelKernels,
    triton_model_kernels,
)
from mrv2_prof.runner.model.norm_triton import (  # noqa: E402
    fused_add_rmsnorm_ref,
    fused_add_rmsnorm_triton,
    rmsnorm_ref,
    rmsnorm_triton,
)
from mrv2_prof.runner.model.rotary_triton import (  # noqa: E402
    qk_norm_rope_ref,
    qk_norm_rope_triton,
    rope_cos_sin_cache,
)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SMOKE = replace(PRESETS["llama-tiny"], hidden_size=96, intermediate_size=160)


def time_us(fn, device: torch.device) -> float:
    if device.type == "cuda":
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
    fn()  # the interpreter: correctness of the wiring, not a timing
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def op_cases(args: ModelArgs, tokens: int, dtype: torch.dtype, device: torch.device):
    """(op, kernel call, reference call, bytes the kernel reads + writes) at one batch size."""
    H, inter, d = args.hidden_size, args.intermediate_size, args.head_dim
    h, kvh, eps, size = args.num_attention_heads, args.num_key_value_heads, 1e-5, dtype.itemsize
    gen = torch.Generator(device).manual_seed(tokens)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    x, residual, weight = randn(tokens, H), randn(tokens, H), randn(H) + 1
    fused = randn(tokens, (h + 2 * kvh) * d)  # the QKV projection's output
    q = fused[:, : h * d].view(tokens, h, d)
    k = fused[:, h * d : (h + kvh) * d].view(tokens, kvh, d)
    cache = rope_cos_sin_cache(RotaryEmbedding(args).inv_freq.to(device), 4096)
    positions = torch.randint(0, 4096, (tokens,), generator=gen, device=device)
    tables = (cache[:, : d // 2], cache[:, d // 2 :], positions)
    norm = (randn(d) + 1, randn(d) + 1, eps)
    gate_up = randn(tokens, 2 * inter)
    rope_bytes = 2 * tokens * (h + kvh) * d * size + tokens * d * 4  # q, k in and out; cos, sin
    return [
        (
            "rmsnorm",
            lambda: rmsnorm_triton(x, weight, eps),
            lambda: rmsnorm_ref(x, weight, eps),
            2 * tokens * H * size,
        ),
        (
            "add + rmsnorm",
            lambda: fused_add_rmsnorm_triton(x, residual, weight, eps),
            lambda: fused_add_rmsnorm_ref(x, residual, weight, eps),
            4 * tokens * H * size,
        ),
        (
            "rope q, k",
            lambda: qk_norm_rope_triton(q, k, *tables),
            lambda: qk_norm_rope_ref(q, k, *tables),
            rope_bytes,
        ),
        (
            "qk-norm + rope",
            lambda: qk_norm_rope_triton(q, k, *tables, *norm),
            lambda: qk_norm_rope_ref(q, k, *tables, *norm),
            rope_bytes,
        ),
        (
            "silu-and-mul",
            lambda: silu_and_mul_triton(gate_up),
            lambda: silu_and_mul_ref(gate_up),
            3 * tokens * inter * size,
        ),
    ]


def layer_case(args: ModelArgs, kernels: ModelKernels, tokens: int, dtype, device):
    """One decoder layer with ``kernels`` over a decode batch of ``tokens`` requests: a call."""
    with torch.device(device):
        layer = DecoderLayer(args, kernels).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.02)
    rope = RotaryEmbedding(args, cos_sin_cache=kernels.cos_sin_cache).to(device)
    rope.reset_inv_freq(device)
    bs = 16
    meta, positions = paged_batch([(500 + i, 1) for i in range(tokens)], bs, device)
    kv_cache = torch.zeros(kv_cache_shape(args, 64 * tokens, bs), dtype=dtype, device=device)
    x = torch.randn(tokens, args.hidden_size, device=device).to(dtype)
    tables = rope.tables(positions, dtype)
    return lambda: layer(x, tables, kv_cache, meta)


def graphed(fn):
    """``fn`` captured in a CUDA graph; returns the replay."""
    fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def layer_rows(name, args, tokens, dtype, device) -> list[dict]:
    torch_ops = TORCH_MODEL_KERNELS.with_attention(write_kv_triton, paged_attention_triton)
    calls = {
        b: layer_case(args, k, tokens, dtype, device)
        for b, k in (("torch", torch_ops), ("triton", triton_model_kernels()))
    }
    weight_bytes = (
        args.hidden_size
        * ((args.num_attention_heads + 2 * args.num_key_value_heads) * args.head_dim)
        + args.num_attention_heads * args.head_dim * args.hidden_size
        + 3 * args.hidden_size * args.intermediate_size
    ) * dtype.itemsize
    rows = []
    modes = ["eager", "graph"] if device.type == "cuda" else ["eager"]
    for mode in modes:
        wrap = graphed if mode == "graph" else (lambda f: f)
        us = {b: time_us(wrap(call), device) for b, call in calls.items()}
        rows.append(
            row(name, f"decoder layer ({mode})", tokens, us["triton"], us["torch"], weight_bytes)
        )
    return rows


def row(preset, op, tokens, kernel_us, reference_us, moved_bytes) -> dict:
    return {
        "preset": preset,
        "op": op,
        "tokens": tokens,
        "kernel_us": kernel_us,
        "reference_us": reference_us,
        "speedup": reference_us / kernel_us,
        "gb_per_s": moved_bytes / kernel_us * 1e-3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--presets", nargs="+", default=["llama-1b", "llama-3-8b"], choices=sorted(PRESETS)
    )
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--skip-layer", action="store_true", help="only the single kernels")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, Triton's interpreter")
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    if args.cpu_smoke:
        device, presets, token_counts = torch.device("cpu"), {"smoke": SMOKE}, [1, 3]
        dtype = torch.float32
    else:
        if not torch.cuda.is_available():
            sys.exit("model_kernels benchmark: needs a CUDA device (or --cpu-smoke)")
        device, dtype, token_counts = torch.device("cuda"), DTYPES[args.dtype], args.tokens
        presets = {name: PRESETS[name] for name in args.presets}

    rows = []
    with torch.no_grad():
        for name, model in presets.items():
            for tokens in token_counts:
                for op, kernel, reference, moved in op_cases(model, tokens, dtype, device):
                    kernel_us, ref_us = time_us(kernel, device), time_us(reference, device)
                    rows.append(row(name, op, tokens, kernel_us, ref_us, moved))
                if not args.skip_layer:
                    rows += layer_rows(name, model, tokens, dtype, device)
                if device.type == "cuda":
                    torch.cuda.empty_cache()

    where = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"
    print(
        f"\n{where}, {str(dtype).removeprefix('torch.')}, torch {torch.__version__}, "
        f"triton {triton.__version__}"
    )
    print(
        "decoder layer: torch ops vs Triton ops, both with the Triton attention; GB/s counts "
        "its weights\n"
    )
    print("| preset | op | tokens | Triton (µs) | torch (µs) | speed-up | GB/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['preset']} | {r['op']} | {r['tokens']} | {r['kernel_us']:.1f} "
            f"| {r['reference_us']:.1f} | {r['speedup']:.2f}x | {r['gb_per_s']:.0f} |"
        )
    if args.out:
        meta = {"presets": list(presets), "dtype": str(dtype), "cpu_smoke": args.cpu_smoke}
        write_results(args.out, meta, rows)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
