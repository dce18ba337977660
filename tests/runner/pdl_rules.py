"""Checks of ``pdl.py``'s three rules on a kernel's compiled code, without a GPU.

Run as ``python -m tests.runner.pdl_rules`` (without ``TRITON_INTERPRET``: the interpreter
replaces triton's own library functions, which then cannot be compiled), it calls each kernel's
host wrapper as the decoder does, with PDL on and off; ``recorded_launches`` records each
``kernel[grid](...)`` instead of running it, ``compile_sm90`` binds it as triton's JIT would for
an sm_90 target and compiles it (triton's CUDA backend compiles on a machine without a GPU) to
TTGIR, the last IR triton itself reorders, and it prints per case what ``rule_breaks`` found, as
JSON (``tests/runner/test_pdl_order.py`` reads it). ``rule_breaks`` walks the TTGIR:

* every ``tt.load`` (or async copy) whose pointer derives from one of the ``dependent`` kernel
  arguments (activations, the KV cache: what the kernel before may write), every ``tt.store`` and
  atomic, and every ``launch_dependents``, must come after a ``grid_dependency_wait`` in the
  same or an enclosing block (rules 1-2; rule 3 follows: a wait inside a loop covers nothing
  after the loop);
* pointers are traced through SSA definitions (and ``scf.for`` iter-args) back to the function's
  arguments.

It returns the broken rules as readable lines (empty: none).
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from typing import Any

JIT_DIFFERS = 3  # the exit status when triton's JIT cannot be driven as compile_sm90 does
_DEF = re.compile(r"^\s*((?:%[\w.#]+(?::\d+)?(?:, )?)+) = (.*)$")
_SSA = re.compile(r"%[\w.]+")
_LOADS = ("tt.load ", "ttg.async_copy_global_to_local ", "tt.descriptor_load ")
_WRITES = ("tt.store ", "tt.atomic_rmw ", "tt.atomic_cas ", "tt.descriptor_store ")


def run_without_interpreter(module: str) -> Any:
    """``python -m module`` from the repository root without ``TRITON_INTERPRET``: the JSON of
    its last line. Skips the calling test where this triton's JIT differs (``JIT_DIFFERS``)."""
    import json
    import os
    import subprocess
    from pathlib import Path

    import pytest

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", module], cwd=Path(__file__).resolve().parents[2], env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if proc.returncode == JIT_DIFFERS:
        pytest.skip(f"compiling for sm_90 without a GPU: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextmanager
def recorded_launches():
    """Inside the block, direct launches are recorded, not run: yields the list of
    ``(JITFunction, args, kwargs)``."""
    from triton.runtime.jit import JITFunction

    calls: list[tuple[Any, tuple, dict[str, Any]]] = []
    original = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        calls.append((self, args, kwargs))

    JITFunction.run = record
    try:
        yield calls
    finally:
        JITFunction.run = original


def compile_sm90(jit, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, list[str]]:
    """``jit[grid](*args, **kwargs)`` as triton compiles it for sm_90 (its TTGIR is
    ``.asm["ttgir"]``, its shared memory ``.metadata.shared``), and the parameters that stay
    arguments of the compiled function (an integer equal to 1, like a constexpr, is folded in),
    in order. Where this triton's JIT internals differ from the ones read here (they are not a
    public API), the process exits with ``JIT_DIFFERS`` and says so: the tests then skip."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, compile, make_backend
        from triton.runtime.jit import create_function_from_signature

        target = GPUTarget("cuda", 90, 32)
        backend = make_backend(target)
        binder = create_function_from_signature(jit.signature, jit.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = jit._pack_args(
            backend, kwargs, bound, specialization, options
        )
        src = ASTSource(jit, signature, constexprs, attrs)
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        print(f"this triton's JIT differs ({type(e).__name__}: {e})", file=sys.stderr)
        raise SystemExit(JIT_DIFFERS) from e
    kept = [name for name, kind in signature.items() if kind != "constexpr"]
    return compile(src, target=target, options=options.__dict__), kept


def _func_args(ir: str) -> list[str]:
    """The SSA names of the kernel's arguments, in order."""
    head = ir[ir.index("tt.func public") :]
    head = head[head.index("(") : head.index("attributes") if "attributes" in head else None]
    return re.findall(r"(%[\w.]+): ", head)


def _operands(text: str) -> list[str]:
    """The SSA names an op reads (its type annotations and locations cut off)."""
    text = re.sub(r"loc\(.*$", "", text)
    return _SSA.findall(text.split(" : ")[0])


def rule_breaks(ir: str, arg_names: list[str], dependent: set[str]) -> list[str]:
    """``pdl.py``'s rules broken in ``ir`` (TTGIR of one kernel): one line each. ``arg_names``
    are the compiled function's parameters in order (``compile_sm90``'s), ``dependent`` those
    whose loads must wait."""
    return walk(ir, arg_names, dependent)[0]


def walk(ir: str, arg_names: list[str], dependent: set[str]) -> tuple[list[str], set[str]]:
    """(``rule_breaks``, the parameters whose memory the kernel loads or stores at all)."""
    ssa_args = _func_args(ir)
    if len(ssa_args) != len(arg_names):
        raise ValueError(f"{len(ssa_args)} IR arguments for parameters {arg_names}")
    root = dict(zip(ssa_args, arg_names, strict=True))
    deps: dict[str, set[str]] = {}
    region: list[int] = [0]  # the block path of the current line
    counter = 0
    waits: list[tuple[int, ...]] = []
    breaks: list[str] = []
    accessed: set[str] = set()

    def roots(name: str) -> set[str]:
        if name in root:
            return {root[name]}
        return deps.get(name, set())

    def waited() -> bool:
        here = tuple(region)
        return any(here[: len(w)] == w for w in waits)

    for raw in ir[ir.index("tt.func public") :].splitlines()[1:]:
        line = raw.strip()
        if line.startswith("}"):
            if len(region) == 1:  # the function's end
                break
            region.pop()
        body = line.lstrip("} ")
        m = _DEF.match(body)
        op = m.group(2) if m else body
        if m:
            reads = set().union(*(roots(n) for n in _operands(op))) if _operands(op) else set()
            for name in _SSA.findall(m.group(1)):
                deps[name.split(":")[0]] = reads
        for init in re.finditer(r"(%[\w.]+) = (%[\w.]+)", op if "iter_args" in op else ""):
            deps[init.group(1)] = roots(init.group(2))
        if op.startswith("scf.for "):  # the induction variable: no pointer
            deps[op.split()[1]] = set()
        if op.startswith("tt.grid_dependency_wait"):
            waits.append(tuple(region))
        elif op.startswith("tt.grid_dependency_launch_dependents") and not waited():
            breaks.append(f"launch_dependents before a wait: {line[:80]}")
        elif op.startswith(_LOADS):
            pointer = _operands(op.split(" ", 1)[1])[:1]
            accessed.update(roots(pointer[0]) if pointer else ())
            read = roots(pointer[0]) & dependent if pointer else set()
            if read and not waited():
                breaks.append(f"load of {sorted(read)} before a wait: {line[:80]}")
        elif op.startswith(_WRITES):
            pointer = _operands(op.split(" ", 1)[1])[:1]
            written = roots(pointer[0]) if pointer else set()
            accessed.update(written)
            if not waited():
                breaks.append(f"write to {sorted(written)} before a wait: {line[:80]}")
        if line.endswith("{"):
            counter += 1
            region.append(counter)
    return breaks, accessed


# --------------------------------------------------------------------------------------------
# The kernels' cases (run in this module's own process: ``main``)


def _randn(*shape, dtype=None):
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g).to(dtype or torch.bfloat16)


def _gemv(prologue: str, loop_stages: int = 0) -> None:
    """``loop_stages``: the software-pipelined walk of K (its prologue loads ahead of the loop)."""
    from mrv2_prof.runner.model.gemv_triton import GemvTiles, gemv_triton

    t = GemvTiles(4, 128, loop_stages=loop_stages) if loop_stages else None
    x, w, r = _randn(1, 256), _randn(96, 256), _randn(1, 96)
    if prologue == "norm":
        gemv_triton(x, w, norm=(_randn(256), 1e-6), tiles=t)
    elif prologue == "norm_one_pass":
        gemv_triton(x, w, norm=(_randn(256), 1e-6), one_pass=True, tiles=t)
    elif prologue == "silu_mul":
        gemv_triton(_randn(1, 512), w, residual=r, silu_mul=True, tiles=t)
    else:
        gemv_triton(x, w, _randn(96), residual=r, tiles=t)


def _decode_batch():
    import torch

    from tests.runner.attention_batches import make_batch

    return make_batch([(40, 1), (7, 1)], num_kv_heads=2, group=4, head_dim=64, block_size=16,
                      dtype=torch.bfloat16)  # fmt: skip


def _decode(splits: int = 0, fused: bool = True) -> None:
    import torch

    from mrv2_prof.runner.model import attention_decode_triton, attention_split_kv_triton

    b = _decode_batch()
    out = torch.empty_like(b.query)
    if splits:
        attention_split_kv_triton.paged_decode_split_kv(
            b.query, b.kv_cache, b.meta, b.scale, out, num_splits=splits, fused=fused
        )
    else:
        attention_decode_triton.paged_decode_triton(b.query, b.kv_cache, b.meta, b.scale, out)


def _decode_rope(splits: int = 0) -> None:
    import torch

    from mrv2_prof.runner.model.attention_decode_rope_triton import paged_decode_rope_triton
    from mrv2_prof.runner.model.attention_split_kv_rope_triton import paged_decode_split_kv_rope

    b = _decode_batch()
    t, h, d = b.query.shape
    kv = _randn(t, 2, d), _randn(t, 2, d)
    cos_sin = torch.randn(64, d)
    args = (b.query, *kv, cos_sin[:, : d // 2], cos_sin[:, d // 2 :], torch.tensor([40, 7]),
            _randn(d), _randn(d), 1e-6, b.kv_cache, b.meta, b.scale)  # fmt: skip
    if splits:
        paged_decode_split_kv_rope(*args, num_splits=splits)
    else:
        paged_decode_rope_triton(*args)


def _gemm(split: int, last: bool = False, silu_mul: bool = False) -> None:
    from mrv2_prof.runner.model import gemm_decode_triton as module

    x, w, b, r = _randn(4, 512 if silu_mul else 256), _randn(96, 256), _randn(96), _randn(4, 96)
    before, module.LAST_SPLIT_REDUCES = module.LAST_SPLIT_REDUCES, last
    try:
        tiles = module.DecodeGemmTiles(16, 32, 64, split)
        module.gemm_decode_triton(x, w, b, r, tiles=tiles, silu_mul=silu_mul)
    finally:
        module.LAST_SPLIT_REDUCES = before


def _gemm_add_norm(split: int, down: bool = False) -> None:
    from mrv2_prof.runner.model.gemm_add_norm_triton import gemm_add_norm_triton
    from mrv2_prof.runner.model.gemm_decode_triton import DecodeGemmTiles

    attn, w, b, x = _randn(4, 512 if down else 256), _randn(96, 256), _randn(96), _randn(4, 96)
    tiles = DecodeGemmTiles(16, 32, 64, split)
    gemm_add_norm_triton(attn, w, None if down else b, x, _randn(96), 1e-6, tiles=tiles,
                         silu_mul=down, round_first=not down)  # fmt: skip


def _rope() -> None:
    import torch

    from mrv2_prof.runner.model.rotary_triton import qk_norm_rope_triton

    q, k, v = _randn(2, 8, 64), _randn(2, 2, 64), _randn(2, 2, 64)
    cache = torch.zeros(2, 4, 16, 2, 64, dtype=torch.bfloat16)
    cos_sin = torch.randn(32, 64)
    qk_norm_rope_triton(
        q, k, cos_sin[:, :32], cos_sin[:, 32:], torch.tensor([3, 9]), _randn(64), _randn(64),
        v=v, kv_cache=cache, slot_mapping=torch.tensor([3, 20]),
    )  # fmt: skip


def _norm(residual: bool) -> None:
    from mrv2_prof.runner.model import norm_triton

    if residual:
        norm_triton.fused_add_rmsnorm_triton(_randn(2, 96), _randn(2, 96), _randn(96), 1e-6)
    else:
        norm_triton.rmsnorm_triton(_randn(2, 96), _randn(96), 1e-6)


def _mlp() -> None:
    from mrv2_prof.runner.model.mlp_decode_triton import MlpTiles, mlp_decode_triton

    # two steps of each walk: the first down tile is loaded before the wait, the rest after
    mlp_decode_triton(_randn(1, 96), _randn(96), 1e-6, _randn(2 * 48, 96), _randn(96, 48),
                      tiles=MlpTiles(16, 64, 64))  # fmt: skip


def _silu_and_mul() -> None:
    from mrv2_prof.runner.model.activation_triton import silu_and_mul_triton

    silu_and_mul_triton(_randn(2, 192))


_SPLIT = {"query_ptr", "k_cache_ptr", "v_cache_ptr", "acc_ptr", "max_ptr", "sum_ptr"}
# case -> (the wrapper's call, the parameters the previous kernel may write: their loads wait)
CASES = {
    "gemv": (lambda: _gemv("none"), {"x_ptr", "out_ptr"}),
    "gemv_norm": (lambda: _gemv("norm"), {"x_ptr", "out_ptr"}),
    "gemv_norm_one_pass": (lambda: _gemv("norm_one_pass"), {"x_ptr", "out_ptr"}),
    "gemv_silu_mul": (lambda: _gemv("silu_mul"), {"x_ptr", "out_ptr"}),
    "gemv_pipelined": (lambda: _gemv("none", 3), {"x_ptr", "out_ptr"}),
    "gemv_norm_one_pass_pipelined": (lambda: _gemv("norm_one_pass", 3), {"x_ptr", "out_ptr"}),
    "gemv_silu_mul_pipelined": (lambda: _gemv("silu_mul", 3), {"x_ptr", "out_ptr"}),
    "rmsnorm": (lambda: _norm(False), {"x_ptr"}),
    "fused_add_rmsnorm": (lambda: _norm(True), {"x_ptr", "res_ptr"}),
    "silu_and_mul": (_silu_and_mul, {"x_ptr"}),
    "mlp_decode": (_mlp, {"x_ptr", "sum_ptr", "counter_ptr"}),
    "qk_norm_rope_kv_write": (_rope, {"q_ptr", "k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr"}),
    "paged_decode": (_decode, {"query_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"}),
    "paged_decode_rope": (
        _decode_rope,
        {"q_ptr", "k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"},
    ),
    "split_kv_decode_rope": (
        lambda: _decode_rope(2),
        {
            "q_ptr",
            "k_ptr",
            "v_ptr",
            "k_cache_ptr",
            "v_cache_ptr",
            "out_ptr",
            "acc_ptr",
            "max_ptr",
            "sum_ptr",
            "counter_ptr",
        },
    ),  # fmt: skip
    "gemm_decode": (lambda: _gemm(1), {"x_ptr", "out_ptr"}),
    "gemm_decode_split": (lambda: _gemm(2), {"x_ptr", "out_ptr", "ws_ptr"}),
    "gemm_decode_silu_mul": (lambda: _gemm(2, silu_mul=True), {"x_ptr", "out_ptr", "ws_ptr"}),
    "gemm_add_norm": (lambda: _gemm_add_norm(2), {"x_ptr", "ws_ptr", "res_ptr", "out_ptr"}),
    "gemm_add_norm_down": (
        lambda: _gemm_add_norm(2, down=True),
        {"x_ptr", "ws_ptr", "res_ptr", "out_ptr"},
    ),
    "gemm_decode_split_last": (
        lambda: _gemm(2, last=True),
        {"x_ptr", "out_ptr", "ws_ptr", "counter_ptr"},
    ),
    "split_kv_fused": (lambda: _decode(2), _SPLIT | {"counter_ptr", "out_ptr"}),
    "split_kv_two_kernels": (lambda: _decode(2, fused=False), _SPLIT | {"out_ptr"}),
}


def _reads_first_kernel():
    """A kernel breaking rule 1 (its input read, and a write, before the wait) and rule 3 (its
    last store covered only by waits inside a loop)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _reads_first(x_ptr, w_ptr, out_ptr, USE_GDC: tl.constexpr):
        i = tl.arange(0, 16)
        w = tl.load(w_ptr + i)
        x = tl.load(x_ptr + i)  # the previous kernel's output, before the wait
        tl.store(out_ptr + i, w)
        for _ in range(2):
            if USE_GDC:
                tl.extra.cuda.gdc_wait()
            x += tl.load(x_ptr + i)
        tl.store(out_ptr + i, x * w)  # after a loop whose wait may not have run

    return _reads_first


def _check(calls, dependent: set[str]) -> list[dict[str, Any]]:
    out = []
    for jit, args, kwargs in calls:
        compiled, params = compile_sm90(jit, args, kwargs)
        ir = compiled.asm["ttgir"]
        breaks, accessed = walk(ir, params, dependent & set(params))
        out.append({
            "kernel": jit.__name__,
            "use_gdc": kwargs.get("USE_GDC"),
            "launch_pdl": kwargs.get("launch_pdl", False),
            "waits": ir.count("tt.grid_dependency_wait"),
            "launches_dependents": ir.count("tt.grid_dependency_launch_dependents"),
            "async_copies": ir.count("ttg.async_copy_global_to_local"),
            "dependent": sorted(dependent & accessed),
            "breaks": breaks,
        })  # fmt: skip
    return out


def main() -> None:
    """Every case with PDL on and off, and the rule-breaking kernel: JSON on stdout."""
    import json

    import torch

    from mrv2_prof.runner.model import pdl

    pdl._supports_pdl = lambda device: True  # type: ignore[assignment]  # CPU tensors, sm_90 code
    result: dict[str, Any] = {}
    for name, (call, dependent) in CASES.items():
        for on in (True, False):
            pdl.LAUNCH_PDL = on
            with recorded_launches() as calls:
                call()
            result[f"{name}:{'on' if on else 'off'}"] = _check(calls, dependent)
    a = torch.zeros(16)
    with recorded_launches() as calls:
        _reads_first_kernel()[(1,)](a, a, a, USE_GDC=True)
    result["reads_first"] = _check(calls, {"x_ptr"})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
