"""The Triton sampler against the torch reference ``sampler.sample`` at real sizes on CUDA
(``gpu`` tests): the llama-1b vocabulary, up to 256 rows, bfloat16 logits, a CUDA graph's
capture, many launches of the one-launch reduction. The small checks: ``test_sampler_triton.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker.gumbel_argmax_triton import gumbel_argmax
from mrv2_prof.runner.worker.sampler import gumbel_noise, sample, uniform_noise
from mrv2_prof.runner.worker.sampler_triton import sample_triton
from tests.runner.sampler_triton_cases import (
    MODES,
    assert_same_output,
    check_against_reference,
    check_permutation_invariance,
    gumbel_noise_triton,
    meta_for,
    mode_flags,
    mode_params,
    random_logits,
    uniform_noise_triton,
)

# --------------------------------------------------------------------------------------------
# GPU, real sizes

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
VOCAB_1B = 128256  # the llama-1b preset's vocabulary


@pytest.mark.gpu
@needs_cuda
def test_cuda_noise_bit_exact_at_real_size():
    rng = np.random.default_rng(20)
    num_rows = 256
    seeds = torch.from_numpy(rng.integers(-(2**63), 2**63, num_rows, dtype=np.int64)).cuda()
    positions = torch.from_numpy(rng.integers(0, 2**40, num_rows)).cuda()
    assert torch.equal(
        uniform_noise_triton(seeds, positions, VOCAB_1B), uniform_noise(seeds, positions, VOCAB_1B)
    )
    got = gumbel_noise_triton(seeds, positions, VOCAB_1B)
    want = gumbel_noise(seeds, positions, VOCAB_1B)
    ulps = (got.view(torch.int32) - want.view(torch.int32)).abs()
    assert torch.equal(got, want), f"{int((ulps > 0).sum())} values differ, max {int(ulps.max())}"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_rows", [1, 37, 256])
@pytest.mark.parametrize("mode", MODES)
def test_cuda_tokens_equal_the_reference_at_real_size(mode: str, num_rows: int, dtype):
    rng = np.random.default_rng(MODES.index(mode) * 1000 + num_rows)
    logits = random_logits(rng, num_rows, VOCAB_1B).to(dtype)
    params = mode_params(rng, mode, num_rows, VOCAB_1B)
    params["top_k"] = np.where(params["top_k"] > 0, rng.choice([1, 50, 1000], num_rows), 0)
    positions = rng.integers(0, 2**20, num_rows)
    check_against_reference(logits, meta_for(params, positions, 20, **mode_flags(mode)))
    check_against_reference(logits, meta_for(params, positions))


@pytest.mark.gpu
@needs_cuda
def test_cuda_ties_and_batch_order_at_real_size():
    rng = np.random.default_rng(21)
    num_rows = 64
    values = rng.integers(0, 3, (num_rows, VOCAB_1B)).astype(np.float32)
    values[:8] = 1.0
    logits = torch.from_numpy(values).cuda().to(torch.bfloat16)
    for mode in ("greedy", "top_k", "mixed"):
        params = mode_params(rng, mode, num_rows, VOCAB_1B)
        check_against_reference(logits, meta_for(params, range(num_rows), **mode_flags(mode)))
    logits = random_logits(rng, num_rows, VOCAB_1B)
    params = mode_params(rng, "mixed", num_rows, VOCAB_1B)
    check_permutation_invariance(logits, params, rng.integers(0, 4096, num_rows))


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_capture_replays_without_host_sync():
    """The whole sampler (thresholds, kernels, logprobs) captures into a CUDA graph, which fails
    on any host synchronisation, and a replay on new logits gives the eager tokens."""
    rng = np.random.default_rng(22)
    num_rows = 32
    params = mode_params(rng, "mixed", num_rows, VOCAB_1B)
    meta = meta_for(params, rng.integers(0, 4096, num_rows), max_num_logprobs=5)
    static_logits = random_logits(rng, num_rows, VOCAB_1B)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sample_triton(static_logits, meta)  # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = sample_triton(static_logits, meta)
    new_logits = random_logits(rng, num_rows, VOCAB_1B)
    static_logits.copy_(new_logits)
    graph.replay()
    assert_same_output(static_out, sample(new_logits, meta))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("num_rows", [1, 3, 64, 256])
def test_cuda_one_launch_reduction_equals_the_two_launch_form(num_rows: int):
    """At the real vocabulary, over many launches (the last-split handoff is a cross-program
    protocol: a missing fence would show as a wrong token or logsumexp on some launch)."""
    rng = np.random.default_rng(23)
    params = mode_params(rng, "mixed", num_rows, VOCAB_1B)
    meta = meta_for(params, rng.integers(0, 4096, num_rows))
    for step in range(20):
        logits = random_logits(rng, num_rows, VOCAB_1B).to(torch.bfloat16)
        got = gumbel_argmax(logits, meta, with_lse=step % 2 == 1)
        want = gumbel_argmax(logits, meta, with_lse=step % 2 == 1, fused=False)
        assert torch.equal(got[0], want[0]), step
        if step % 2:
            assert torch.equal(got[1], want[1]), step
    from mrv2_prof.runner.worker.gumbel_argmax_triton import WORKSPACE

    assert not WORKSPACE.buffers(logits.device)[-1].any()  # the counters
