"""The L2 prefetch's spans (``l2_prefetch.py``): which bytes, and that the programs cover them.

On the CPU the interpreter runs the prefetch loop with ``RECORD`` (each 16-byte unit a chunk
would read counted); the counts must be one inside every span and zero elsewhere, for any number
of programs. On the GPU (``-m gpu``) the prefetch itself: an attention launch with it equals the
one without it bit for bit (``test_attention_decode_rope.py`` and ``test_fused_model.py``).
"""

from __future__ import annotations

import pytest
import torch

from mrv2_prof.runner.model import l2_prefetch


def _counts(spans: tuple[int, ...], programs: int, chunk: int, units: int) -> torch.Tensor:
    record = torch.zeros(units, dtype=torch.int32)
    l2_prefetch.prefetch(spans, programs, torch.device("cpu"), record=record, chunk=chunk)
    return record


@pytest.mark.parametrize("programs", [1, 3, 8])
@pytest.mark.parametrize("chunk", [64, 256])
def test_the_programs_read_every_unit_of_the_spans_once_and_nothing_else(programs, chunk):
    # three spans at 16-byte units: [100, 100 + 37), [300, 300 + 5), [400, 400 + 129) (units)
    spans = (16 * 100, 16 * 37, 16 * 300, 16 * 5, 16 * 400, 16 * 129)
    got = _counts(spans, programs, chunk, 600)
    want = torch.zeros(600, dtype=torch.int32)
    for start, n in ((100, 37), (300, 5), (400, 129)):
        want[start : start + n] = 1
    assert torch.equal(got, want)


def test_empty_spans_read_nothing():
    got = _counts((16 * 10, 0, 0, 0, 16 * 50, 16 * 3), 4, 64, 100)
    want = torch.zeros(100, dtype=torch.int32)
    want[50:53] = 1
    assert torch.equal(got, want)


class _Weight:
    """What ``spans_for`` reads of a weight: its address, size, layout and device."""

    def __init__(self, ptr: int, numel: int, contiguous: bool = True, size: int = 2) -> None:
        self.ptr, self.n, self.contiguous, self.size = ptr, numel, contiguous, size
        self.device = torch.device("cuda", 0)

    def data_ptr(self) -> int:
        return self.ptr

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return self.size

    def is_contiguous(self) -> bool:
        return self.contiguous


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.setattr(l2_prefetch, "capable", lambda device: True)


def test_the_budget_takes_the_weights_in_order_in_16_byte_units(sm90):
    o, gate_up, down = _Weight(4096, 1000), _Weight(65536, 50_000), _Weight(1 << 20, 9)
    # o whole (2,000 bytes), then 3,000 - 2,000 = 1,000 bytes of gate/up (a multiple of 16: 992)
    assert l2_prefetch.spans_for([o, gate_up, down], 1, budget=3000) == (
        4096,
        2000,
        65536,
        992,
        0,
        0,
    )
    # a budget past all three: each whole (down's 18 bytes rounded down to 16)
    assert l2_prefetch.spans_for([o, gate_up, down], 1, budget=1 << 30) == (
        4096,
        2000,
        65536,
        100_000,
        1 << 20,
        16,
    )


def test_a_weight_it_cannot_read_whole_is_skipped_and_the_next_takes_its_share(sm90):
    odd, strided, down = _Weight(4100, 1000), _Weight(8192, 64, contiguous=False), _Weight(0, 64)
    assert l2_prefetch.spans_for([odd, strided, down], 1, budget=100) == (0, 96, 0, 0, 0, 0)


def test_off_for_a_wide_batch_a_zero_budget_and_below_sm_90(monkeypatch, sm90):
    w = [_Weight(4096, 1000)]
    wide = l2_prefetch.PREFETCH_MAX_REQS + 1
    assert l2_prefetch.spans_for(w, wide, budget=1 << 20) == l2_prefetch.NO_SPANS
    assert l2_prefetch.spans_for(w, 1, budget=0) == l2_prefetch.NO_SPANS
    monkeypatch.setattr(l2_prefetch, "PREFETCH_BYTES", 0)
    assert l2_prefetch.spans_for(w, 1) == l2_prefetch.NO_SPANS  # the module default: off
    monkeypatch.setattr(l2_prefetch, "capable", lambda device: False)
    assert l2_prefetch.spans_for(w, 1, budget=1 << 20) == l2_prefetch.NO_SPANS


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or not l2_prefetch.capable(torch.device("cuda")),
    reason="needs a GPU of compute capability 9.0 or more",
)
@pytest.mark.parametrize("preset", ["llama-1b", "qwen3-0.6b"])
@pytest.mark.parametrize(("num_reqs", "splits"), [(1, None), (1, 4), (4, None)])
def test_gpu_a_folded_layer_with_the_prefetch_is_the_layer_without_it(
    preset, num_reqs, splits, monkeypatch
):
    """bf16, a decode batch through a decoder layer with the fold (PDL on): with 24 MiB of its
    next weights read into L2 by the attention launch's extra row, the output and the KV cache
    are the ones without, bit for bit, in as many launches; the attention grid has one more row
    of programs."""
    from test_fused_model import device_kernels, paged_batch

    import mrv2_prof.runner.model.attention_decode_rope_triton as fold
    import mrv2_prof.runner.model.attention_split_kv_triton as split_kv
    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.runner.model import kv_cache_shape, pdl
    from mrv2_prof.runner.model.loader import load_model
    from mrv2_prof.runner.model.model_kernels import triton_model_kernels

    device = torch.device("cuda")
    monkeypatch.setattr(fold, "ROPE_IN_DECODE_ATTENTION", True)
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", splits)
    monkeypatch.setattr(pdl, "LAUNCH_PDL", True)
    model, args = load_model(ModelSpec(preset=preset), device, torch.bfloat16,
                             kernels=triton_model_kernels())  # fmt: skip
    shape = kv_cache_shape(args, 64 * num_reqs, 16)
    cache = torch.randn(shape, dtype=torch.bfloat16, device=device)
    meta, positions = paged_batch([(100 + 7 * i, 1) for i in range(num_reqs)], 16)
    x = torch.randn(num_reqs, args.hidden_size, device=device, dtype=torch.bfloat16)
    layer = model.model.layers[3]
    rope = model.model.rotary_emb.tables(positions, x.dtype)
    grids, kernel = [], fold._paged_decode_rope_kernel

    class Counted:  # the unsplit fold's kernel, its grids recorded
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(fold, "_paged_decode_rope_kernel", Counted())
    outs, caches, counts = {}, {}, {}
    with torch.no_grad():
        for budget in (0, 24 << 20):
            monkeypatch.setattr(l2_prefetch, "PREFETCH_BYTES", budget)
            c = cache.clone()
            outs[budget] = layer(x.clone(), rope, c, meta)
            caches[budget] = c
            xs, c2 = x.clone(), cache.clone()
            counts[budget] = len(device_kernels(lambda xs=xs, c2=c2: layer(xs, rope, c2, meta)))
    assert torch.equal(outs[24 << 20], outs[0])
    assert torch.equal(caches[24 << 20], caches[0])
    assert counts[24 << 20] == counts[0], counts
    if splits is None:  # the unsplit fold's grids: without, then with the extra row
        assert [g[0] for g in grids[:1]] == [num_reqs] and grids[-1][0] == num_reqs + 1, grids
