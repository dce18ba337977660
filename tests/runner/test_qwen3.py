"""Qwen3 (per-head q/k RMSNorm, ``head_dim`` from the config) against Hugging Face transformers:
logits of one forward, and the engine's greedy tokens against ``generate``, on small random
checkpoints written as safetensors (GQA and MQA, tied and untied, with and without bias)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.loader import load_model

CPU = torch.device("cpu")
ATOL_HF = 1e-4  # float32, ours vs transformers (different op order in attention)
HIDDEN, HEADS, HEAD_DIM = 64, 4, 32  # head_dim != hidden / heads, as in the real Qwen3 models
CASES = {  # tied, kv heads, attention_bias
    "tied-gqa": (True, 2, False),
    "untied-gqa": (False, 2, False),
    "untied-mqa-bias": (False, 1, True),
}


def make_qwen3_checkpoint(tmp_dir: Path, tied: bool, num_kv_heads: int, bias: bool) -> Path:
    """A random transformers Qwen3 model saved to ``tmp_dir``; norm weights (q_norm and k_norm
    included) and biases are perturbed away from HF's ones and zeros so that each one counts."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=256,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=num_kv_heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=512,
        rope_theta=1e6,
        attention_bias=bias,
        tie_word_embeddings=tied,
        eos_token_id=None,
        bos_token_id=None,
        initializer_range=0.08,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.Qwen3ForCausalLM(config).to(torch.float32)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(".bias"):
                    param.normal_(0.0, 0.08)
                elif name.endswith("norm.weight"):
                    param.add_(torch.randn_like(param), alpha=0.3)
    out = tmp_dir / f"qwen3-{'tied' if tied else 'untied'}-kv{num_kv_heads}-bias{int(bias)}"
    model.save_pretrained(out, safe_serialization=True)
    return out


def one_shot_logits(model, ids: torch.Tensor) -> torch.Tensor:
    n = len(ids)
    qsl = torch.tensor([0, n], dtype=torch.int32)
    meta = AttentionMetadata(
        num_reqs=1,
        num_tokens=n,
        query_start_loc=qsl,
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_table=torch.zeros((1, 1), dtype=torch.int32),
        slot_mapping=torch.zeros(n, dtype=torch.int64),
        query_start_loc_np=qsl.numpy(),
        seq_lens_np=qsl[1:].numpy(),
        block_size=16,
    )
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(n), None, meta))


@pytest.mark.parametrize("case", list(CASES))
def test_qwen3_logits_match_hf(tmp_path, case):
    import transformers

    tied, kv_heads, bias = CASES[case]
    path = make_qwen3_checkpoint(tmp_path, tied, kv_heads, bias)
    model, args = load_model(ModelSpec(preset=None, path=str(path)), CPU, torch.float32)
    assert args.architecture == "Qwen3ForCausalLM" and args.head_dim == HEAD_DIM
    assert args.qk_norm and args.tie_word_embeddings == tied and args.o_proj_bias == bias
    attn = model.model.layers[1].self_attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (HEAD_DIM,)
    assert (attn.o_proj.bias is not None) == bias and hasattr(model, "lm_head") != tied
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = torch.randint(0, 256, (13,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(input_ids=ids[None]).logits[0].float()
    ours = one_shot_logits(model, ids)
    torch.testing.assert_close(ours, expected, atol=ATOL_HF, rtol=0)
    # q/k norm is live: without it the logits move well past the tolerance
    attn.q_norm.weight.data.fill_(1.0)
    assert (one_shot_logits(model, ids) - expected).abs().max() > 100 * ATOL_HF


@pytest.mark.parametrize("case", ["tied-gqa", "untied-gqa"])
def test_qwen3_engine_greedy_matches_generate(tmp_path, case):
    """Token for token, under chunked prefill over a paged cache of 4-token blocks."""
    import transformers

    tied, kv_heads, bias = CASES[case]
    path = make_qwen3_checkpoint(tmp_path, tied, kv_heads, bias)
    rng = random.Random(0)
    prompts = {f"p{i}": [rng.randrange(256) for _ in range(n)] for i, n in enumerate([1, 7, 19])}
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = {}
    for rid, ids in prompts.items():
        x = torch.tensor([ids])
        y = hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        expected[rid] = y[0, len(ids) :].tolist()
    config = RunnerConfig(
        device="cpu",
        max_num_reqs=8,
        max_num_seqs=4,
        max_num_batched_tokens=9,
        max_model_len=64,
        block_size=4,
        num_kv_blocks=64,
    )
    engine = Engine(config, ModelSpec(preset=None, path=str(path)))
    reqs = engine.generate(prompts, SamplingParams(max_tokens=16))
    assert {rid: r.output_token_ids for rid, r in reqs.items()} == expected
    assert len({tuple(t) for t in expected.values()}) > 1  # the prompts lead somewhere different
