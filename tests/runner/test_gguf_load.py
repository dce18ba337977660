"""GGUF checkpoints through the loader: the same logits as Hugging Face transformers loading the
same file (it dequantizes and un-permutes with its own code), and as our loader on the
safetensors checkpoint the file was written from; for each architecture (llama, qwen2, qwen3),
in each type the writer makes, and in the run's dtype."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from test_engine import generate, make_engine

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.model.gguf_file import read_header
from mrv2_prof.runner.model.loader import load_model
from tests.runner.decoder_forward import ATOL_HF, hf_logits, one_shot_logits, prompt
from tests.runner.gguf_checkpoint import permute, write_gguf

Q = GGMLQuantizationType
CPU = torch.device("cpu")
QUANTIZED = {  # every type the writer can make, on the llama fixture's matrices
    "token_embd.weight": Q.Q8_0,
    "output.weight": Q.Q4_1,
    "blk.0.attn_q.weight": Q.Q4_0,
    "blk.0.attn_k.weight": Q.Q4_1,
    "blk.0.attn_v.weight": Q.Q5_0,
    "blk.0.attn_output.weight": Q.Q5_1,
    "blk.1.attn_q.weight": Q.Q8_0,
    "blk.1.attn_k.weight": Q.F16,
    "blk.1.ffn_down.weight": Q.BF16,
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, Path]:
    from test_qwen3 import make_qwen3_checkpoint

    from tests.runner.gguf_checkpoint import hf_checkpoint_maker

    tmp = tmp_path_factory.mktemp("hf")
    make = hf_checkpoint_maker()
    return {
        "llama": make(tmp, "llama", False, 2, eos_token_id=None),
        "llama-tied-mha": make(tmp, "llama", True, 4),
        "qwen2": make(tmp, "qwen2", False, 1),
        "qwen3": make_qwen3_checkpoint(tmp / "qwen3", True, 2, False),
    }


def gguf_file(hf_dir: Path, name: str, **kwargs) -> Path:
    """The GGUF in a folder of its own (transformers reads a folder and a file name)."""
    folder = hf_dir.parent / f"gguf-{name}"
    folder.mkdir(exist_ok=True)
    return write_gguf(hf_dir, folder / f"{name}.gguf", **kwargs)


def load(path: Path, dtype: torch.dtype = torch.float32):
    return load_model(ModelSpec(preset=None, path=str(path)), CPU, dtype)


def hf_gguf(path: Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=dtype, attn_implementation="eager"
    )
    return model.eval()


def hf_gguf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_gguf(path)(input_ids=ids[None]).logits[0].float()


@pytest.mark.parametrize("name", ["llama", "llama-tied-mha", "qwen2"])
def test_quantized_logits_match_transformers_on_the_same_file(hf_dirs, name):
    weight_type = Q.Q4_0 if name == "qwen2" else Q.Q8_0
    path = gguf_file(hf_dirs[name], f"{name}-q", weight_type=weight_type, types=QUANTIZED)
    model, args = load(path)
    ids = prompt(13)
    ours = one_shot_logits(model, ids)
    torch.testing.assert_close(ours, hf_gguf_logits(path, ids), atol=ATOL_HF, rtol=0)
    # quantization moved the weights: the logits are not the safetensors checkpoint's
    assert (ours - one_shot_logits(load(hf_dirs[name])[0], ids)).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["llama", "llama-tied-mha", "qwen2", "qwen3"])
def test_float32_file_gives_the_safetensors_checkpoints_logits(hf_dirs, name):
    """F32 tensors hold the checkpoint's exact values, so our model from the GGUF is our model
    from the safetensors (same logits bit for bit), which matches transformers on them."""
    path = gguf_file(hf_dirs[name], f"{name}-f32")
    model, args = load(path)
    reference, reference_args = load(hf_dirs[name])
    assert args.tie_word_embeddings == reference_args.tie_word_embeddings
    ids = prompt(11)
    ours = one_shot_logits(model, ids)
    assert torch.equal(ours, one_shot_logits(reference, ids))
    torch.testing.assert_close(ours, hf_logits(hf_dirs[name], ids), atol=ATOL_HF, rtol=0)


def test_llama_q_and_k_rows_are_unpermuted(hf_dirs):
    """The file holds q/k rows in llama.cpp's order (checked against the converter's permute of
    the source); the loaded weights are back in the checkpoint's."""
    from safetensors.numpy import load_file

    path = gguf_file(hf_dirs["llama"], "llama-perm", types={"blk.0.attn_k.weight": Q.Q8_0})
    source = load_file(str(next(hf_dirs["llama"].glob("*.safetensors"))))
    header = read_header(path)
    q = header.tensors["blk.0.attn_q.weight"]
    stored = np.fromfile(path, np.float32, q.nbytes // 4, offset=q.offset).reshape(q.shape)
    hf_q = source["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(stored, hf_q) and np.array_equal(stored, permute(hf_q, 4))
    model, _ = load(path)
    state = model.state_dict()
    assert torch.equal(state["model.layers.0.self_attn.q_proj.weight"], torch.from_numpy(hf_q))
    # a quantized k: the converter's permutation of what we loaded is what the file holds
    k = header.tensors["blk.0.attn_k.weight"]
    raw = np.fromfile(path, np.uint8, k.nbytes, offset=k.offset).reshape(k.shape[0], -1)
    loaded = state["model.layers.0.self_attn.k_proj.weight"].numpy()
    assert np.array_equal(permute(loaded, 2), gguf_dequantize(raw, Q.Q8_0))


def test_weights_are_dequantized_into_the_runs_dtype(hf_dirs):
    path = gguf_file(hf_dirs["qwen2"], "qwen2-bf16", weight_type=Q.Q4_1)
    fp32, _ = load(path)
    bf16, _ = load(path, torch.bfloat16)
    for (name, a), (_, b) in zip(fp32.state_dict().items(), bf16.state_dict().items(), strict=True):
        assert b.dtype == torch.bfloat16 and torch.equal(b, a.to(torch.bfloat16)), name


def test_special_ids_come_from_the_metadata(hf_dirs):
    path = gguf_file(hf_dirs["llama-tied-mha"], "ids", metadata={"tokenizer.ggml.eos_token_id": 7})
    _, args = load(path)
    assert args.eos_token_ids == (7,) and args.bos_token_id == 1  # bos from the source config
    path = gguf_file(hf_dirs["llama"], "no-ids", metadata={"tokenizer.ggml.bos_token_id": None})
    _, args = load(path)
    assert args.eos_token_ids == () and args.bos_token_id is None


def test_engine_greedy_tokens_match_transformers_on_the_same_file(hf_dirs):
    """End to end through the engine (chunked prefill, batched decode) on a quantized file."""
    path = gguf_file(hf_dirs["llama"], "llama-engine", weight_type=Q.Q4_1, types=QUANTIZED)
    rng = np.random.default_rng(0)
    prompts = {f"p{i}": rng.integers(0, 256, n).tolist() for i, n in enumerate([3, 9, 17])}
    engine = make_engine(path, max_num_batched_tokens=8)
    requests = generate(engine, prompts, SamplingParams(max_tokens=12))
    hf = hf_gguf(path)
    for rid, ids in prompts.items():
        x = torch.tensor([ids])
        y = hf.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
            pad_token_id=0,
        )  # fmt: skip
        assert requests[rid].output_token_ids == y[0, len(ids) :].tolist(), rid
