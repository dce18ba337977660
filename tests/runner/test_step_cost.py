"""The roofline's per-step constants (runner/model/step_cost.py) and a step's attention extent
(SchedulerOutput.attention_extent), against counts worked by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.core.scheduler_output import (
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)
from mrv2_prof.runner.model.decoder import LlamaForCausalLM
from mrv2_prof.runner.model.presets import PRESETS
from mrv2_prof.runner.model.step_cost import step_cost

# llama-tiny: hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads, head dim 16, vocab 512.
# A layer's matrices: q 64x64, k 64x32, v 64x32, o 64x64, gate/up 64x128 each, down 128x64.
LAYER = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128  # 36,864
TABLE = 512 * 64  # the embedding table (and an untied lm head)
NORMS = 2 * 2 * 64 + 64  # two per layer and the final one


def test_step_cost_of_llama_tiny_untied_is_the_hand_count():
    args = PRESETS["llama-tiny"]
    assert not args.tie_word_embeddings
    model = LlamaForCausalLM(args).to(torch.bfloat16)
    cost = step_cost(model, args, kv_bytes_per_token=2 * 2 * 2 * 16 * 2)
    # every weight but the embedding table (the step reads only its tokens' rows), 2 bytes each
    assert cost["weight_bytes"] == 2 * (2 * LAYER + TABLE + NORMS)
    assert cost["embed_row_bytes"] == 64 * 2
    assert cost["kv_bytes_per_token"] == 256  # K and V, 2 layers, 2 heads of 16, bf16
    assert cost["logits_bytes_per_row"] == 512 * 2
    assert cost["matmul_flops_per_token"] == 2 * 2 * LAYER
    assert cost["lm_head_flops_per_row"] == 2 * TABLE
    assert cost["attn_flops_per_pair"] == 4 * 2 * 4 * 16


def test_step_cost_of_a_tied_model_reads_the_table_whole_once():
    args = replace(PRESETS["llama-tiny"], tie_word_embeddings=True)
    model = LlamaForCausalLM(args)  # float32
    cost = step_cost(model, args, kv_bytes_per_token=0)
    assert cost["weight_bytes"] == 4 * (2 * LAYER + TABLE + NORMS)
    assert cost["embed_row_bytes"] == 0
    assert cost["matmul_flops_per_token"] == 2 * 2 * LAYER


def _new(rid: str, tokens: int, computed: int) -> NewRequestData:
    return NewRequestData(rid, list(range(tokens)), SamplingParams(), [], computed, tokens)


def test_attention_extent_of_a_decode_step_is_the_context_sum():
    cached = CachedRequestData(["a", "b"], np.array([10, 20], dtype=np.int64), {})
    so = SchedulerOutput([], cached, {"a": 1, "b": 1}, 2, set())
    assert so.attention_extent() == (11 + 21, 11 + 21)


def test_attention_extent_of_a_mixed_step_counts_causal_pairs():
    # "p": a new request, 3 cached by the prefix cache, 4 scheduled: pairs 4*3 + (1+2+3+4) = 22,
    # context 7. "d": decoding with 5 computed and 1 drafted token verified (2 scheduled):
    # pairs 2*5 + (1+2) = 13, context 7. "c": a list of computed counts, one decode: 9 + 1.
    cached = CachedRequestData(["d", "c"], [5, 9], {})
    so = SchedulerOutput([_new("p", 7, 3)], cached, {"d": 2, "c": 1, "p": 4}, 7, set())
    assert so.attention_extent() == (7 + 7 + 10, 22 + 13 + 10)
