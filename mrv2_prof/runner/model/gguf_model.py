"""What model a GGUF checkpoint holds: its ``ModelArgs``, which of its tensors are which of the
decoder's parameters, and the q/k row order to undo.

``model_args`` maps the metadata of the architectures the runner has (``llama``, ``qwen2``,
``qwen3``: ``{arch}.block_count``, ``embedding_length``, ``attention.head_count`` and the rest,
the tokenizer's EOS/BOS ids) to ``ModelArgs`` and refuses, in one line, what the decoder cannot
represent (RoPE scaling, a ``rope_freqs`` tensor, experts, a sliding window, partial RoPE).
``checked_tensors`` finds the file's tensor for each Hugging Face state-dict name (``gguf_name``:
``token_embd``, ``blk.N.attn_q``, ...; no ``output`` means tied embeddings) and checks its shape
and type. llama.cpp's converter stores a ``llama`` model's q/k projection rows permuted for its
interleaved RoPE; ``unpermute_qk`` puts them back after dequantization (Qwen2 and Qwen3 are
stored as they are).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from mrv2_prof.runner.model.args import CheckpointError, ModelArgs
from mrv2_prof.runner.model.gguf_dequant import unsupported
from mrv2_prof.runner.model.gguf_file import ArrayInfo, GGUFHeader, TensorInfo

ARCHITECTURES = {  # general.architecture -> ModelArgs.architecture
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
LAYER_TENSORS = 9  # a layer's two norms and seven projections, at the least


def model_args(header: GGUFHeader) -> ModelArgs:
    """``ModelArgs`` from the metadata (``{arch}.*`` hyperparameters, the tokenizer's special
    ids); the embeddings are tied when the file has no ``output.weight``."""
    meta, tensors, path = header.metadata, header.tensors, header.path

    def fail(problem: str) -> CheckpointError:
        return CheckpointError(f"{path}: {problem}")

    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        shown = repr(arch)[:60] if arch is not None else "missing"
        raise fail(
            f"key 'general.architecture' is {shown}, not a supported architecture "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )

    def count(name: str, default: int | None = None) -> int:
        key = f"{arch}.{name}"
        value = meta.get(key, default)
        if isinstance(value, tuple) and value and len(set(value)) == 1:  # per layer, all equal
            value = value[0]
        if value is None:
            raise fail(f"key {key!r} is missing")
        if type(value) is not int or value < 1:
            raise fail(f"key {key!r} must be an integer >= 1, got {repr(value)[:40]}")
        return value

    def positive(name: str, default: float | None) -> float:
        key = f"{arch}.{name}"
        value = meta.get(key, default)
        if value is None:
            raise fail(f"key {key!r} is missing")
        if type(value) not in (int, float) or not 0 < value < float("inf"):
            raise fail(f"key {key!r} must be a finite number > 0, got {repr(value)[:40]}")
        return float(value)

    hidden, heads = count("embedding_length"), count("attention.head_count")
    kv_heads = count("attention.head_count_kv", heads)
    if heads % kv_heads:
        raise fail(f"{arch}.attention.head_count {heads} is not a multiple of head_count_kv")
    if f"{arch}.attention.key_length" not in meta and hidden % heads:
        raise fail(f"{arch}.embedding_length {hidden} is not a multiple of the head count")
    head_dim = count("attention.key_length", hidden // heads)
    if count("attention.value_length", head_dim) != head_dim:
        raise fail(f"key '{arch}.attention.value_length' differs from key_length")
    if count("rope.dimension_count", head_dim) != head_dim:
        raise fail(f"key '{arch}.rope.dimension_count' != head dim {head_dim} (partial RoPE)")
    layers = count("block_count")
    if layers * LAYER_TENSORS > len(tensors):  # before a model of that many layers is built
        raise fail(
            f"key '{arch}.block_count' is {layers:,}, more layers than its {len(tensors)} "
            "tensors hold"
        )
    refused = _unsupported_features(meta, tensors, arch)
    if refused:
        raise fail(f"{refused} is not supported")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = count("vocab_size", tokens.length if isinstance(tokens, ArrayInfo) else None)

    def token(key: str) -> tuple[int, ...]:
        value = meta.get(key)
        if value is None:
            return ()
        if type(value) is not int or not 0 <= value < vocab:
            raise fail(f"key {key!r} must be a token id in [0, {vocab}), got {repr(value)[:40]}")
        return (value,)

    architecture = ARCHITECTURES[arch]
    return ModelArgs(
        architecture=architecture,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=count("feed_forward_length"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=positive("attention.layer_norm_rms_epsilon", None),
        rope_theta=positive("rope.freq_base", 10000.0),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in tensors,
        max_position_embeddings=count("context_length"),
        eos_token_ids=token("tokenizer.ggml.eos_token_id"),
        bos_token_id=(token("tokenizer.ggml.bos_token_id") or (None,))[0],
    )


def _unsupported_features(meta: dict[str, Any], tensors: dict[str, TensorInfo], arch: str) -> str:
    """What of the file the decoder cannot represent, as the subject of a sentence, or ''."""
    if "rope_freqs.weight" in tensors:
        return "tensor 'rope_freqs.weight' (per-dimension RoPE frequency factors, llama3 scaling)"
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        return f"key '{arch}.rope.scaling.type' = {repr(scaling)[:40]} (RoPE scaling)"
    factor = meta.get(f"{arch}.rope.scaling.factor", 1.0)
    if factor not in (0.0, 1.0):
        return f"key '{arch}.rope.scaling.factor' = {repr(factor)[:40]} (RoPE scaling)"
    for name, what in (("expert_count", "mixture of experts"), ("attention.sliding_window", "")):
        value = meta.get(f"{arch}.{name}")
        if value not in (None, 0):
            return f"key '{arch}.{name}' = {repr(value)[:40]}" + (f" ({what})" if what else "")
    return ""


_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LAYER_PARAM = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


def gguf_name(hf_name: str) -> str:
    """The GGUF tensor name of a Hugging Face state-dict name (``model.layers.3.mlp.up_proj
    .weight`` -> ``blk.3.ffn_up.weight``)."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    match = _LAYER_PARAM.fullmatch(hf_name)
    if match is None or match[2] not in _LAYER_NAMES:
        raise KeyError(hf_name)
    return f"blk.{match[1]}.{_LAYER_NAMES[match[2]]}.{match[3]}"


def checked_tensors(
    header: GGUFHeader, expected: dict[str, tuple[int, ...]]
) -> dict[str, TensorInfo]:
    """The file's tensor for each expected state-dict name (name -> shape), present, of that
    shape and of a type we dequantize; other tensors in the file are ignored."""
    found = {name: header.tensors.get(gguf_name(name)) for name in expected}
    missing = [gguf_name(name) for name, info in found.items() if info is None]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{header.path}: tensor {missing[0]!r} is missing{more}")
    for name, info in found.items():
        if info.shape != expected[name]:
            raise CheckpointError(
                f"{header.path}: tensor {info.name!r} has shape {list(info.shape)}, "
                f"expected {list(expected[name])}"
            )
        why = unsupported(info.qtype)
        if why:
            raise CheckpointError(f"{header.path}: tensor {info.name!r}: {why}")
    return found  # type: ignore[return-value]  (no None left)


def unpermute_qk(hf_name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    """A ``llama`` file's q/k projection (weight or bias) rows back in Hugging Face's order:
    llama.cpp's converter interleaves each head's two RoPE halves; other tensors as they are."""
    if args.architecture != "LlamaForCausalLM":
        return tensor
    if ".self_attn.q_proj." in hf_name:
        heads = args.num_attention_heads
    elif ".self_attn.k_proj." in hf_name:
        heads = args.num_key_value_heads
    else:
        return tensor
    rows = tensor.shape[0]
    split = tensor.reshape(heads, rows // heads // 2, 2, *tensor.shape[1:])
    return split.transpose(1, 2).reshape(tensor.shape)
