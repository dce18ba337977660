"""Qwen3 (per-head q/k RMSNorm, ``head_dim`` from the config) against Hugging Face transformers:
logits of one forward, and the engine's greedy tokens against ``generate``, on small random
checkpoints written as safetensors (GQA and MQA, tied and untied, with and without bias)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
from test_engine import generate

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


def hf_greedy(path: Path, prompts: dict[str, list[int]], new_tokens: int) -> dict[str, list[int]]:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = {}
    for rid, ids in prompts.items():
        x = torch.tensor([ids])
        y = hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        out[rid] = y[0, len(ids) :].tolist()
    assert len({tuple(t) for t in out.values()}) > 1  # the prompts lead somewhere different
    return out


def engine_greedy(path: Path, prompts, new_tokens: int, dtype=None, **runner) -> dict:
    """Greedy tokens through the engine, with chunked prefill over a paged cache of 4-token
    blocks (a 9-token budget splits the longest prompt)."""
    config = dict(
        device="cpu",
        max_num_reqs=8,
        max_num_seqs=4,
        max_num_batched_tokens=9,
        max_model_len=64,
        block_size=4,
        num_kv_blocks=64,
        kernels="torch",
        async_scheduling=False,
        uva=False,
        cudagraph_mode="none",
    )
    config.update(runner)
    engine = Engine(RunnerConfig(**config), ModelSpec(preset=None, path=str(path), dtype=dtype))
    reqs = generate(engine, prompts, SamplingParams(max_tokens=new_tokens))
    return engine, {rid: r.output_token_ids for rid, r in reqs.items()}


def prompts_for(seed: int, lens: list[int]) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {f"p{i}": [rng.randrange(256) for _ in range(n)] for i, n in enumerate(lens)}


@pytest.mark.parametrize("case", ["tied-gqa", "untied-gqa"])
def test_qwen3_engine_greedy_matches_generate(tmp_path, case):
    path = make_qwen3_checkpoint(tmp_path, *CASES[case])
    prompts = prompts_for(0, [1, 7, 19])
    _, got = engine_greedy(path, prompts, 16)
    assert got == hf_greedy(path, prompts, 16)


def test_qwen3_through_the_triton_kernels_in_the_interpreter(tmp_path, monkeypatch):
    """CPU, TRITON_INTERPRET=1: every Triton kernel forced in, the tokens are transformers'."""
    if torch.cuda.is_available():
        pytest.skip("the GPU version is the test below")
    import mrv2_prof.runner.worker.model_runner as model_runner
    from mrv2_prof.runner.worker.kernel_set import triton_kernels

    monkeypatch.setattr(model_runner, "resolve_kernels", lambda r, c: (triton_kernels(), None))
    path = make_qwen3_checkpoint(tmp_path, *CASES["untied-gqa"])
    prompts = prompts_for(1, [3, 11])
    engine, got = engine_greedy(path, prompts, 6, kernels="triton")
    assert engine.runner.kernels.name == "triton"
    assert got == hf_greedy(path, prompts, 6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", list(CASES))
def test_qwen3_on_cuda_with_triton_and_graphs_matches_generate_fp32(tmp_path, case):
    """fp32 on the GPU, Triton kernels, async scheduling, FULL and PIECEWISE graphs: the tokens of
    transformers' generate on the CPU."""
    path = make_qwen3_checkpoint(tmp_path, *CASES[case])
    prompts = prompts_for(2, [1, 7, 19, 30])
    engine, got = engine_greedy(
        path,
        prompts,
        24,
        dtype="float32",
        device="cuda",
        kernels="triton",
        async_scheduling=True,
        cudagraph_mode="full_and_piecewise",
    )
    assert sum(engine.runner.graphs.replays.values()) > 0
    assert got == hf_greedy(path, prompts, 24)
