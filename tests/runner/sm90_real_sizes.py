"""The decode kernels that are off by default, compiled for sm_90 at the presets' real sizes on
the CPU: what an H200 run with ``runner.rope_in_attention`` and ``runner.decode_gemm: triton``
(and PDL) would compile, each variant once.

Run as ``python -m tests.runner.sm90_real_sizes`` (without ``TRITON_INTERPRET``, as
``pdl_rules``): the RoPE-folded decode attention for each preset's head layout, and the decode
GEMM (with its split-K reduction) at every tile choice ``pick_gemm_tiles`` makes for the presets'
projections and row classes, and the GEMM with the SiLU-and-mul prologue (``DOWN_ADD_NORM``'s
down projection) in bf16 and float32, are recorded and compiled; it prints per variant the
kernel, its constexprs and its shared memory as JSON (``test_sm90_real_sizes.py`` checks it
fits an H200's 227 KiB a block). The kernels' arguments are CPU tensors of the real shapes,
never filled (a recorded launch reads nothing).
"""

from __future__ import annotations

import json
from typing import Any

from tests.runner.pdl_rules import compile_sm90, recorded_launches

FOLD_PRESETS = ("llama-1b", "qwen3-0.6b", "llama-3-8b", "qwen2-0.5b", "llama-tiny")
GEMM_PRESETS = ("llama-1b", "qwen3-0.6b", "llama-3-8b", "qwen2-0.5b")


def _fold(preset: str) -> None:
    import torch

    from mrv2_prof.runner.model import PRESETS
    from mrv2_prof.runner.model.attention_decode_rope_triton import paged_decode_rope_triton
    from tests.runner.attention_batches import make_batch

    a = PRESETS[preset]
    kvh, d = a.num_key_value_heads, a.head_dim
    b = make_batch([(100, 1), (37, 1)], kvh, a.num_attention_heads // kvh, d, 16, torch.bfloat16)
    k, v = (torch.empty(2, kvh, d, dtype=torch.bfloat16) for _ in range(2))
    table = torch.empty(64, d)
    w = (torch.empty(d, dtype=torch.bfloat16),) * 2 if a.qk_norm else (None, None)
    paged_decode_rope_triton(
        b.query, k, v, table[:, : d // 2], table[:, d // 2 :], torch.tensor([100, 37]), *w,
        a.rms_norm_eps, b.kv_cache, b.meta, b.scale,
    )  # fmt: skip


def _gemm_cases() -> dict[tuple, tuple[int, int, int, bool, bool]]:
    """One (m, n, k, bias, residual) per distinct compiled GEMM: its tiles, split or not
    (the split count is a runtime argument of the GEMM, a constexpr of the reduction, which
    uses no shared memory), bias and residual."""
    from mrv2_prof.runner.model import PRESETS
    from mrv2_prof.runner.model.gemm_decode_triton import ROW_CLASSES, pick_gemm_tiles

    cases: dict[tuple, tuple[int, int, int, bool, bool]] = {}
    for preset in GEMM_PRESETS:
        a = PRESETS[preset]
        hd, h, kvh = a.head_dim, a.num_attention_heads, a.num_key_value_heads
        projections = {  # (n, k, bias, residual)
            "qkv": ((h + 2 * kvh) * hd, a.hidden_size, a.attention_bias, False),
            "o": (a.hidden_size, h * hd, a.o_proj_bias, False),
            "gate_up": (2 * a.intermediate_size, a.hidden_size, False, False),
            "down": (a.hidden_size, a.intermediate_size, False, True),
        }
        for n, k, bias, residual in projections.values():
            for _, m in ROW_CLASSES:
                t = pick_gemm_tiles(m, n, k)
                key = (t.block_m, t.block_n, t.block_k, t.split_k > 1, t.num_warps,
                       t.num_stages, bool(bias), residual)  # fmt: skip
                cases.setdefault(key, (m, n, k, bool(bias), residual))
    return cases


def _gemm(m: int, n: int, k: int, bias: bool, residual: bool) -> None:
    import torch

    from mrv2_prof.runner.model.gemm_decode_triton import gemm_decode_triton

    def empty(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16)

    gemm_decode_triton(empty(m, k), empty(n, k), empty(n) if bias else None,
                       empty(m, n) if residual else None)  # fmt: skip


def _prologue(m: int, dtype_name: str) -> None:
    """qwen3-0.6b's down projection as ``DOWN_ADD_NORM`` launches it (the SiLU-and-mul prologue,
    float32 partials), in bf16 and in float32 (the engine tests' dtype)."""
    import torch

    from mrv2_prof.runner.model import PRESETS
    from mrv2_prof.runner.model.gemm_decode_triton import gemm_decode_partials

    a, dtype = PRESETS["qwen3-0.6b"], getattr(torch, dtype_name)
    gate_up = torch.empty(m, 2 * a.intermediate_size, dtype=dtype)
    gemm_decode_partials(gate_up, torch.empty(a.hidden_size, a.intermediate_size, dtype=dtype),
                         silu_mul=True)  # fmt: skip


PROLOGUE_CASES = ((64, "bfloat16"), (64, "float32"), (16, "float32"))


def _constexprs(jit, kwargs: dict[str, Any]) -> dict[str, Any]:
    names = {p.name for p in jit.params if p.is_constexpr}
    return {k: v for k, v in kwargs.items() if k in names or k.startswith("num_")}


def main() -> None:
    from mrv2_prof.runner.model import pdl

    pdl._supports_pdl = lambda device: True  # type: ignore[assignment]  # CPU tensors, sm_90 code
    pdl.LAUNCH_PDL = True
    calls_by_case = []
    for preset in FOLD_PRESETS:
        with recorded_launches() as calls:
            _fold(preset)
        calls_by_case.append((f"fold {preset}", calls))
    for args in _gemm_cases().values():
        with recorded_launches() as calls:
            _gemm(*args)
        calls_by_case.append((f"gemm m={args[0]} n={args[1]} k={args[2]} bias={args[3]} "
                              f"residual={args[4]}", calls))  # fmt: skip
    for m, dtype_name in PROLOGUE_CASES:
        with recorded_launches() as calls:
            _prologue(m, dtype_name)
        calls_by_case.append((f"prologue m={m} {dtype_name}", calls))
    report = []
    for case, calls in calls_by_case:
        for jit, args, kwargs in calls:
            compiled, _ = compile_sm90(jit, args, kwargs)
            meta = compiled.metadata
            report.append({
                "case": case, "kernel": jit.__name__, "shared": meta.shared,
                "num_warps": meta.num_warps, "constexprs": str(_constexprs(jit, kwargs)),
            })  # fmt: skip
    print(json.dumps(report))


if __name__ == "__main__":
    main()
