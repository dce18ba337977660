"""What Triton's software pipeliner makes of decode attention's walk of the keys, on a CPU host.

The decode kernels walk a request's keys a tile at a time (``attention_decode_triton.
attend_key_range``): the tile's block-table entries, then its K and V rows through them, then
two dots and the online softmax. At decode sizes the walk is a chain of memory round trips, so
how many tiles' loads Triton keeps in flight while a tile is reduced decides its length. This
compiles the walk (the shared function, in a small kernel around it) for sm_90 at each number of
pipeline stages, through to the PTX (Triton's own ptxas checks it: no GPU needed), and reads the
main loop's asynchronous copies back from it:

* ``groups / tile``: the ``cp.async`` groups the loop commits an iteration (the next tiles'
  block-table entries, K and V);
* ``loop wait``: the ``cp.async.wait_group N`` at the loop's head: N groups stay in flight
  while the tile is reduced (0: every load issued so far has landed);
* ``tiles in flight``: 1 + N / groups, the tiles whose K and V are loading or loaded while one
  is reduced;
* ``shared KiB``: the kernel's shared memory (the copies' buffers).

    python benchmarks/walk_schedule.py --head-dims 64 128 --stages 3 4 5 6

The numbers are Triton's choice on this host's Triton version; ``attention_triton.
DECODE_STAGES`` is chosen by them (and by ``decode_roofline.py``'s ``+dsN`` on a GPU).
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import asdict, dataclass

import triton
import triton.language as tl
from bench_io import write_results

from mrv2_prof.runner.model.attention_decode_triton import attend_key_range


@triton.jit
def _walk(
    out_ptr, q_ptr, block_row, k_cache_ptr, v_cache_ptr, kv_end, cache_stride_block,
    cache_stride_slot, qk_scale, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One program's walk of ``[0, kv_end)`` for ``BLOCK_M`` query rows, as the kernels call it."""
    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + rows[:, None] * HEAD_DIM + dims[None, :])
    q_pos = tl.zeros([BLOCK_M], tl.int32) + kv_end - 1
    acc, m_i, l_i = attend_key_range(
        q, q_pos, 0, kv_end, block_row, k_cache_ptr, v_cache_ptr, 0, cache_stride_block,
        cache_stride_slot, qk_scale, BLOCK_M, HEAD_DIM, BLOCK_SIZE, BLOCK_N, "tf32",
    )  # fmt: skip
    tl.store(out_ptr + rows[:, None] * HEAD_DIM + dims[None, :], acc / l_i[:, None])


SIGNATURE = {
    "out_ptr": "*bf16", "q_ptr": "*bf16", "block_row": "*i32", "k_cache_ptr": "*bf16",
    "v_cache_ptr": "*bf16", "kv_end": "i32", "cache_stride_block": "i32",
    "cache_stride_slot": "i32", "qk_scale": "fp32", "BLOCK_M": "constexpr",
    "HEAD_DIM": "constexpr", "BLOCK_SIZE": "constexpr", "BLOCK_N": "constexpr",
}  # fmt: skip
# Pointers and strides divisible by 16, as the kernels' arguments are specialised at launch
# (without it the gathers compile to 2-byte loads and nothing is pipelined).
ALIGNED = (0, 1, 2, 3, 4, 6, 7)


@dataclass(frozen=True)
class Schedule:
    groups_per_tile: int  # cp.async groups the main loop commits an iteration
    loop_wait: int  # N of the cp.async.wait_group at the loop's head
    shared_bytes: int

    @property
    def tiles_in_flight(self) -> int:
        """Tiles loading or loaded while one is reduced (1: the next waits for this one)."""
        return 1 + (self.loop_wait // self.groups_per_tile if self.groups_per_tile else 0)


def loop_schedule(ptx: str) -> tuple[int, int]:
    """``(groups committed, wait depth)`` of the PTX's main loop: the body between a label and
    the branch back to it that commits the most ``cp.async`` groups; ``(0, 0)`` if none does."""
    lines = ptx.splitlines()
    label = re.compile(r"(\$L__\w+):")
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := label.match(line))}
    best = (0, 0)
    for i, line in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if not m or labels.get(m.group(1), i) >= i:
            continue  # not a branch back
        body = lines[labels[m.group(1)] : i]
        groups = sum("cp.async.commit_group" in b for b in body)
        waits = [int(w.group(1)) for b in body if (w := re.search(r"wait_group\s+(\d+)", b))]
        if groups > best[0]:
            best = (groups, waits[0] if waits else 0)
    return best


def compile_walk(head_dim: int, block_n: int, stages: int, warps: int = 4, block_size: int = 16):
    """The walk compiled for sm_90: its ``Schedule``."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(
        _walk,
        SIGNATURE,
        constexprs={
            "BLOCK_M": 16,
            "HEAD_DIM": head_dim,
            "BLOCK_SIZE": block_size,
            "BLOCK_N": block_n,
        },  # fmt: skip
        attrs={(i,): [["tt.divisibility", 16]] for i in ALIGNED},
    )
    options = {"num_warps": warps, "num_stages": stages}
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    groups, wait = loop_schedule(kernel.asm["ptx"])
    return Schedule(groups, wait, kernel.metadata.shared)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--keys", type=int, default=128, help="keys a tile (DECODE_KEYS: 128)")
    ap.add_argument("--stages", type=int, nargs="+", default=[3, 4, 5, 6])
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("walk_schedule: compiles for sm_90; unset TRITON_INTERPRET")
    print(f"triton {triton.__version__}, sm_90, {args.keys} keys a tile, {args.warps} warps\n")
    print("| head_dim | stages | groups / tile | loop wait | tiles in flight | shared KiB |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    results = []
    for head_dim in args.head_dims:
        for stages in args.stages:
            s = compile_walk(head_dim, args.keys, stages, args.warps)
            print(
                f"| {head_dim} | {stages} | {s.groups_per_tile} | {s.loop_wait} | "
                f"{s.tiles_in_flight} | {s.shared_bytes / 1024:.1f} |"
            )
            row = {"head_dim": head_dim, "stages": stages, **asdict(s)}
            results.append({**row, "tiles_in_flight": s.tiles_in_flight})
    meta = {"target": "sm_90", "keys": args.keys, "warps": args.warps}
    write_results(args.out, meta, results)


if __name__ == "__main__":
    main()
