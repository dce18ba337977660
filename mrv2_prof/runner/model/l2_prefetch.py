"""The next projections' weights read into L2 while batch-1 decode attention runs.

At a small decode batch the folded decode attention reads little (llama-1b at batch 1: ~0.3 MB of
KV a layer) and takes 5-8 µs a layer for its dependent chain (the RoPE prologue, the KV write,
two key tiles, the output): HBM idles while it runs, and the GEMVs after it (o, gate/up, down)
then stream their weights at the bandwidth they can draw. Here the attention launch takes one more
row of programs (``req == num_reqs``, the grid's axis 0), which wait for the kernel before it
(the QKV projection, under programmatic dependent launch) so that they take no bandwidth from it,
then issue ``cp.async.bulk.prefetch.L2`` (sm_90: the copy engine reads the bytes into L2; no
register, no shared memory and no thread waits for it) over the layer's o weight and as much of
its gate/up and down weights as ``PREFETCH_BYTES`` allows, in that order, and exit. The GEMVs
then find those bytes in L2.

A prefetch changes no value (the attention programs are the same programs; the weights are only
read), so the references are the kernels' own without it: the GPU tests compare outputs and an
engine's tokens bit for bit with and without it. ``_prefetch_kernel`` issues the same spans alone
(``benchmarks/l2_prefetch.py``); with ``RECORD`` it counts each 16-byte unit it would read
instead (the interpreter runs that), so the tests check that the programs cover every byte of
the spans once and none past them.

``spans_for`` decides from host ints only (the same for every batch of a CUDA-graph key): on while
``PREFETCH_BYTES`` > 0 (module switch, off until ``benchmarks/decode_roofline.py --variant
...+pfN`` measures it), on a GPU of compute capability 9.0 or more, for a batch of at most
``PREFETCH_MAX_REQS`` requests. Read at each call, so it must be set before a CUDA graph is
captured.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

PREFETCH_BYTES = 0  # bytes of the next weights read into L2 during attention; 0: off
PREFETCH_MAX_REQS = 8  # the largest decode batch that prefetches (attention latency-bound)
CHUNK = 16384  # bytes a prefetch instruction reads
LANES = 128  # chunks a program issues at once (one per thread at 4 warps)
NO_SPANS = (0, 0, 0, 0, 0, 0)
MAX_SPANS = 3

_ASM = tl.constexpr(
    "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
    "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }"
)


def capable(device: torch.device) -> bool:
    """Whether ``device`` has the bulk L2 prefetch (sm_90 or later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def spans_for(
    weights: Sequence[torch.Tensor], num_reqs: int, budget: int | None = None
) -> tuple[int, ...]:
    """(address, bytes) x ``MAX_SPANS``, flat: the first ``budget`` bytes (default
    ``PREFETCH_BYTES``) of ``weights`` in order (contiguous ones at 16-byte aligned addresses;
    at most ``MAX_SPANS``), each a multiple of 16 bytes, unused spans (0, 0); ``NO_SPANS`` where
    prefetching is off for this batch (host ints only)."""
    left = PREFETCH_BYTES if budget is None else budget
    if left <= 0 or num_reqs > PREFETCH_MAX_REQS or not weights:
        return NO_SPANS
    if not capable(weights[0].device):
        return NO_SPANS
    spans: list[int] = []
    for w in weights:
        if len(spans) == 2 * MAX_SPANS or left < 16:
            break
        if not w.is_contiguous() or w.data_ptr() % 16:
            continue
        n = min(w.numel() * w.element_size(), left) // 16 * 16
        spans += [w.data_ptr(), n]
        left -= n
    spans += [0, 0] * (MAX_SPANS - len(spans) // 2)
    return tuple(spans)  # type: ignore[return-value]


@triton.jit
def _prefetch_span(addr, nbytes, part, parts, record_ptr, CHUNK: tl.constexpr,
                   LANES: tl.constexpr, RECORD: tl.constexpr):  # fmt: skip
    """Program ``part`` of ``parts``: its chunks of ``[addr, addr + nbytes)``, LANES at a time."""
    lanes = tl.arange(0, LANES).to(tl.int64) * CHUNK
    for base in range(part * LANES * CHUNK, nbytes, parts * LANES * CHUNK):
        off = base + lanes
        size = tl.minimum(nbytes - off, CHUNK).to(tl.int32)  # <= 0 past the span: nothing
        if RECORD:  # each 16-byte unit the chunk covers counted at (addr + offset) // 16
            units = tl.arange(0, CHUNK // 16).to(tl.int64)
            at = (addr + off)[:, None] // 16 + units[None, :]
            tl.atomic_add(record_ptr + at, 1, mask=units[None, :] * 16 < size[:, None])
        else:
            done = tl.inline_asm_elementwise(
                _ASM, "=r,l,r", [addr + off, size], dtype=tl.int32, is_pure=False, pack=1
            )
            tl.store(record_ptr + lanes, done, mask=done != 0)  # never: keeps the asm


@triton.jit
def prefetch_l2(a0, n0, a1, n1, a2, n2, part, parts, record_ptr, CHUNK: tl.constexpr,
                LANES: tl.constexpr, RECORD: tl.constexpr = False):  # fmt: skip
    """Program ``part`` of ``parts``: its share of the three spans read into L2."""
    _prefetch_span(a0, n0, part, parts, record_ptr, CHUNK, LANES, RECORD)
    _prefetch_span(a1, n1, part, parts, record_ptr, CHUNK, LANES, RECORD)
    _prefetch_span(a2, n2, part, parts, record_ptr, CHUNK, LANES, RECORD)


@triton.jit
def prefetch_row(a0, n0, a1, n1, a2, n2, part, parts, record_ptr, CHUNK: tl.constexpr,
                 LANES: tl.constexpr, USE_GDC: tl.constexpr):  # fmt: skip
    """Program ``part`` of an attention launch's extra row (``parts`` programs): after the PDL
    wait (until the QKV projection is done the bandwidth is its), its share of the spans."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    prefetch_l2(a0, n0, a1, n1, a2, n2, part, parts, record_ptr, CHUNK, LANES)


def grid_rows(spans: tuple[int, ...]) -> int:
    """The rows an attention launch's grid gains for ``spans`` (host ints): one where they hold
    bytes."""
    return int(any(spans[1::2]))


def launch_consts(spans: tuple[int, ...]) -> dict:
    """The folded attention kernels' prefetch constexprs for ``spans``."""
    return dict(PREFETCH=bool(grid_rows(spans)), PF_CHUNK=CHUNK, PF_LANES=LANES)


SPAN_ARGS = ["pf_a0", "pf_n0", "pf_a1", "pf_n1", "pf_a2", "pf_n2"]  # never specialized


@triton.jit(do_not_specialize=SPAN_ARGS)
def _prefetch_kernel(pf_a0, pf_n0, pf_a1, pf_n1, pf_a2, pf_n2, record_ptr, CHUNK: tl.constexpr,
                     LANES: tl.constexpr, RECORD: tl.constexpr):  # fmt: skip
    prefetch_l2(pf_a0, pf_n0, pf_a1, pf_n1, pf_a2, pf_n2, tl.program_id(0), tl.num_programs(0),
                record_ptr, CHUNK, LANES, RECORD)  # fmt: skip


def prefetch(spans: tuple[int, ...], programs: int, device: torch.device,
             record: torch.Tensor | None = None, chunk: int = CHUNK) -> None:  # fmt: skip
    """``spans`` read into L2 by a launch of ``programs`` programs alone (the benchmark's; the
    model's prefetch rides in the attention launch). With ``record`` (int32, one per 16 bytes
    of the address space from 0: the tests' small spans) the units are counted instead."""
    sink = record if record is not None else torch.empty(LANES, dtype=torch.int32, device=device)
    _prefetch_kernel[(programs,)](
        *spans, sink, CHUNK=chunk, LANES=LANES, RECORD=record is not None, num_warps=4
    )
