"""The per-op constants of the per-kernel roofline (runner/model/step_cost.py ``ops``) against
counts worked by hand for llama-tiny."""

from __future__ import annotations

import torch

from mrv2_prof.analysis.kernel_roofline import op_bytes_flops
from mrv2_prof.runner.model.decoder import LlamaForCausalLM
from mrv2_prof.runner.model.presets import PRESETS
from mrv2_prof.runner.model.step_cost import step_cost

# llama-tiny: hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads, head dim 16, vocab 512;
# bf16 weights and cache (2 bytes). K and V of one token in one layer: 2 x 2 heads x 16 x 2 = 128.
LLAMA_TINY_OPS = {
    "qkv": {"weight_bytes": 2 * (64 + 32 + 32) * 64, "flops_per_token": 2 * 128 * 64},
    "o": {"weight_bytes": 2 * 64 * 64, "flops_per_token": 2 * 64 * 64},
    "gate_up": {"weight_bytes": 2 * 256 * 64, "flops_per_token": 2 * 256 * 64},
    "down": {"weight_bytes": 2 * 64 * 128, "flops_per_token": 2 * 64 * 128},
    "attention": {"bytes_per_context": 128, "flops_per_pair": 4 * 4 * 16},
    "lm_head": {"weight_bytes": 2 * 512 * 64, "bytes_per_row": 2 * 512,
                "flops_per_row": 2 * 512 * 64},
    "norm": {"weight_bytes": 2 * 64, "bytes_per_token": 2 * 2 * 64},
    "add_norm": {"weight_bytes": 2 * 64, "bytes_per_token": 4 * 2 * 64},
    # q (64) and k (32) read and written, v (32) read, then K and V written to the cache (128)
    "qk_rope": {"weight_bytes": 0, "bytes_per_token": 2 * (2 * (64 + 32) + 32) + 128},
    "kv_write": {"bytes_per_token": 2 * 2 * 32 + 128},
    "silu_mul": {"bytes_per_token": 2 * 3 * 128},
    # the batch-1 MLP in one launch: gate/up, down and the post-attention norm's weight
    "mlp": {"weight_bytes": 2 * 256 * 64 + 2 * 64 * 128 + 2 * 64,
            "flops_per_token": 2 * 256 * 64 + 2 * 64 * 128},
}  # fmt: skip


def test_op_cost_of_llama_tiny_is_the_hand_count():
    args = PRESETS["llama-tiny"]
    model = LlamaForCausalLM(args).to(torch.bfloat16)
    cost = step_cost(model, args, kv_bytes_per_token=2 * 2 * 2 * 16 * 2)
    assert cost["layers"] == 2
    assert cost["ops"] == LLAMA_TINY_OPS
    # the projections of the layers and the LM head are the step's weights (norms aside)
    gemms = sum(cost["ops"][op]["weight_bytes"] for op in ("qkv", "o", "gate_up", "down"))
    norms = 2 * (2 * 2 * 64 + 64)
    assert 2 * gemms + cost["ops"]["lm_head"]["weight_bytes"] + norms == cost["weight_bytes"]


def test_an_ops_bytes_and_flops_at_a_steps_counts():
    # a decode step: 3 tokens, 3 logits rows, 300 context tokens, 300 query-key pairs
    counts = (3, 3, 300, 300)
    assert op_bytes_flops(LLAMA_TINY_OPS["qkv"], counts) == (16_384, 3 * 16_384)
    assert op_bytes_flops(LLAMA_TINY_OPS["attention"], counts) == (128 * 300, 256 * 300)
    assert op_bytes_flops(LLAMA_TINY_OPS["lm_head"], counts) == (65_536 + 3 * 1_024, 3 * 65_536)
    assert op_bytes_flops(LLAMA_TINY_OPS["add_norm"], counts) == (128 + 3 * 512, 0)
