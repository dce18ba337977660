"""The folded decode attention with its first token out of the loop's dependent chain
(``attention_rope_early_triton.EARLY_FIRST_TOKEN``): the fold's own tests, against the same torch
references, with the switch on (the interpreter on the CPU; real sizes and a model's decode with
``-m gpu``); ``test_pdl_order`` checks its PDL rules (``*_early`` cases)."""

from __future__ import annotations

import pytest

from mrv2_prof.runner.model import attention_rope_early_triton as early
from tests.runner import test_attention_decode_rope as fold_tests


@pytest.fixture(autouse=True)
def early_first_token(monkeypatch):
    monkeypatch.setattr(early, "EARLY_FIRST_TOKEN", True)


def test_the_switch_reaches_the_kernels():
    """Not vacuous: both folded kernels are launched with ``EARLY`` from the switch."""
    import torch

    from mrv2_prof.runner.model.attention_decode_rope_triton import rope_launch_args

    args, _, _, _ = fold_tests._case([(5, 1)], 1, 2, 32, 16, torch.float32, norm=False)
    q, k, v, cos, sin, positions, qw, kw, eps, cache, meta, scale = args
    consts = rope_launch_args(torch.empty_like(q), q, k, v, cos, sin, positions, qw, kw, eps,
                              cache, meta, scale)[1]  # fmt: skip
    assert consts["EARLY"] is True


# the fold's tests, collected here again under the fixture above
test_fold_matches_rope_then_write_then_attention = (
    fold_tests.test_fold_matches_rope_then_write_then_attention
)
test_a_request_with_two_tokens_beside_padding = (
    fold_tests.test_a_request_with_two_tokens_beside_padding
)
test_contexts_around_the_first_key_tile = fold_tests.test_contexts_around_the_first_key_tile
test_a_token_without_a_slot_writes_nothing = fold_tests.test_a_token_without_a_slot_writes_nothing
test_split_fold_matches_rope_then_write_then_attention = (
    fold_tests.test_split_fold_matches_rope_then_write_then_attention
)
test_split_fold_with_two_tokens_beside_padding = (
    fold_tests.test_split_fold_with_two_tokens_beside_padding
)
test_gpu_fold_at_real_sizes = fold_tests.test_gpu_fold_at_real_sizes
test_a_model_with_the_fold_decodes_as_without = (
    fold_tests.test_a_model_with_the_fold_decodes_as_without
)
