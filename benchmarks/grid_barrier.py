"""What a grid-wide barrier inside one persistent kernel costs against a kernel boundary in a
CUDA graph, on one GPU: the question behind "a persistent kernel over a layer's ops" (issue 39).

A decoder layer at batch 1 is a chain of dependent phases (QKV, attention, o, gate/up, down),
today one kernel each, chained by programmatic dependent launch (PDL). A persistent kernel would
run the phases in one launch with a barrier across its programs between them. Both sides here
run ``PHASES`` phases over ``P`` programs, in one CUDA graph per side (``graph_timing.py``):

* ``persistent``: one kernel per layer; after each phase every program arrives on a counter
  (``atomic_add``, release) and spins until all ``P`` have (acquire): cooperative groups'
  ``grid.sync`` written in Triton. The last program out resets the counters for the next launch.
* ``kernels``: one launch per phase, with or without PDL (``gdc_wait`` first, then
  ``gdc_launch_dependents``, as the model's kernels do).

With ``work`` each phase is a GEMV of its own 1024 x 1024 bf16 weight (2 MiB; 64 layers' worth,
1 GiB in all, so every phase reads HBM) over ``P`` programs; without, the phases are empty and the
figure is the barrier or the boundary alone. µs per phase: the graph's replay time (median of 7)
over the phases. Each phase reads the same input and writes the same output (the phases are
fully ordered either way, by the barrier or by the wait). Before timing, both sides' GEMVs are
checked against torch (the last phase's ``W x``) and the counters found reset.

    python benchmarks/grid_barrier.py
    python benchmarks/grid_barrier.py --cpu-smoke   # one program in Triton's interpreter
"""

from __future__ import annotations

import os
import sys

if "--cpu-smoke" in sys.argv:  # before triton is imported: it reads this at decoration time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from graph_timing import graph_time_us  # noqa: E402

K = 1024  # a phase's reduction length and its weight's rows: 2 MiB of bf16
PHASES = 8
LAYERS = 64


@triton.jit
def _phase(w_ptr, x_ptr, out_ptr, n, P, pid, BN: tl.constexpr, BK: tl.constexpr):
    """out = W x over ``P`` programs, ``BN`` rows a tile."""
    for t in range(pid, tl.cdiv(n, BN), P):
        rows = t * BN + tl.arange(0, BN)
        ks = tl.arange(0, BK)
        w = tl.load(w_ptr + rows[:, None] * BK + ks[None, :], mask=(rows < n)[:, None], other=0.0)
        x = tl.load(x_ptr + ks, cache_modifier=".cg")
        y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < n)


@triton.jit
def _grid_barrier(counter_ptr, target):
    """Every program's stores before it visible to every program after it."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    while tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _persistent(w_ptr, x_ptr, out_ptr, counter_ptr, exit_ptr, n, PHASES: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, WORK: tl.constexpr,
                USE_GDC: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    for ph in tl.static_range(PHASES):
        if WORK:
            _phase(w_ptr + ph * n * BK, x_ptr, out_ptr, n, P, pid, BN, BK)
        _grid_barrier(counter_ptr, (ph + 1) * P)
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if tl.atomic_add(exit_ptr, 1, sem="acq_rel", scope="gpu") == P - 1:  # the last one out
        tl.store(counter_ptr, 0)
        tl.store(exit_ptr, 0)


@triton.jit
def _one_phase(w_ptr, x_ptr, out_ptr, n, BN: tl.constexpr, BK: tl.constexpr,
               WORK: tl.constexpr, USE_GDC: tl.constexpr):  # fmt: skip
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if WORK:
        _phase(w_ptr, x_ptr, out_ptr, n, tl.num_programs(0), tl.program_id(0), BN, BK)


def check(p: int, dev: torch.device, k: int) -> None:
    """Both sides' last phase equals torch's ``W x`` (bf16 rounding), over ``p`` programs, and
    the persistent kernel leaves its counters at zero."""
    counter, exits = (torch.zeros(1, dtype=torch.int32, device=dev) for _ in range(2))
    gen = torch.Generator(dev).manual_seed(0)
    x = torch.randn(k, device=dev, generator=gen).to(torch.bfloat16)
    w = torch.randn(PHASES * k * k, device=dev, generator=gen).to(torch.bfloat16)
    want = w[-k * k :].view(k, k).float() @ x.float()
    consts = dict(BN=4, BK=k, WORK=True, USE_GDC=False)
    for side in ("persistent", "kernels"):
        out = torch.full((k,), float("nan"), device=dev, dtype=torch.bfloat16)
        if side == "persistent":
            _persistent[(p,)](w, x, out, counter, exits, k, PHASES=PHASES, **consts)
        else:
            for ph in range(PHASES):
                _one_phase[(p,)](w[ph * k * k :], x, out, k, **consts)
        torch.testing.assert_close(out.float(), want, atol=0.1, rtol=2e-2)
    assert counter.item() == 0 and exits.item() == 0, "a barrier left its counter"
    print(f"grid_barrier: both sides match torch's W x over {p} program(s), counters reset")


def main() -> None:
    if "--cpu-smoke" in sys.argv:  # one program: the interpreter runs programs one at a time
        check(1, torch.device("cpu"), 64)
        return
    if not torch.cuda.is_available():
        sys.exit("grid_barrier benchmark: needs a CUDA device (or --cpu-smoke)")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, {sms} SMs, torch {torch.__version__}, triton "
          f"{triton.__version__}; {PHASES} phases a layer, {LAYERS} layers a graph")  # fmt: skip
    check(sms, dev, K)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    exits = torch.zeros(1, dtype=torch.int32, device=dev)
    x = torch.randn(K, device=dev, dtype=torch.bfloat16)
    out = torch.empty(K, device=dev, dtype=torch.bfloat16)
    weights = [torch.randn(PHASES * K * K, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    print("| phases | programs | PDL | persistent + barrier µs / phase | a kernel a phase µs |")
    print("| --- | ---: | --- | ---: | ---: |")
    for work in (False, True):
        for p in (sms, sms // 2, 32):
            for pdl in (False, True):
                bufs = (x, out, counter, exits, weights)
                t_persistent, t_kernels = time_sides(p, pdl, work, *bufs)
                kind = "GEMV 2 MiB" if work else "empty"
                print(f"| {kind} | {p} | {'on' if pdl else 'off'} | {t_persistent:.2f} "
                      f"| {t_kernels:.2f} |")  # fmt: skip


def time_sides(p: int, pdl: bool, work: bool, x, out, counter, exits, weights):
    """(persistent µs a phase, kernels µs a phase) for ``p`` programs."""
    opts = {"launch_pdl": True} if pdl else {}
    consts = dict(BN=4, BK=K, WORK=work, USE_GDC=pdl, **opts)
    persistent = [
        lambda w=w: _persistent[(p,)](w, x, out, counter, exits, K, PHASES=PHASES, **consts)
        for w in weights
    ]
    kernels = [
        lambda w=w, ph=ph: _one_phase[(p,)](w[ph * K * K :], x, out, K, **consts)
        for w in weights
        for ph in range(PHASES)
    ]
    t_persistent = graph_time_us(persistent) / PHASES
    t_kernels = graph_time_us(kernels)
    torch.cuda.synchronize()
    assert counter.item() == 0 and exits.item() == 0, "a barrier left its counter"
    return t_persistent, t_kernels


if __name__ == "__main__":
    main()
