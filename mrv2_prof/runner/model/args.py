"""The architecture of a Llama-style decoder (Llama, Qwen2, Qwen3): ``ModelArgs`` from a preset or
a Hugging Face ``config.json`` (and back to one), and the KV-cache geometry it implies."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI's parent process reads configs without loading torch
    import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_MODEL_TYPES = dict(zip(("llama", "qwen2", "qwen3"), SUPPORTED_ARCHITECTURES, strict=True))
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# Upper limits of the sizes a config declares, each well above every released model's (Llama 3.1
# 405B: 126 layers, hidden 16,384, intermediate 53,248, 128 heads; vocabularies up to 262,144;
# 10M-token contexts). Checks before a run build tables of these sizes: a config past them is
# refused at once instead of taking minutes and all memory to find its tensors are not there.
MAX_SIZES = {
    "vocab_size": 1 << 22,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 1 << 10,
    "num_attention_heads": 1 << 10,
    "num_key_value_heads": 1 << 10,
    "head_dim": 1 << 11,
    "max_position_embeddings": 1 << 24,
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the one-line message names the file and the problem."""


@dataclass(frozen=True)
class ModelArgs:
    """Architecture of a Llama-style decoder, from a preset or a Hugging Face ``config.json``."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, float] | None = None  # llama3: factor, low/high_freq_factor, original_*
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v bias (always on in Qwen2); Llama's and Qwen3's also o_proj
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias and self.architecture != "Qwen2ForCausalLM"

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm of q and k before RoPE (Qwen3's ``q_norm`` / ``k_norm``)."""
        return self.architecture == "Qwen3ForCausalLM"

    @property
    def model_type(self) -> str:
        return next(t for t, a in _MODEL_TYPES.items() if a == self.architecture)

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], source: str) -> ModelArgs:
        """Parse a Hugging Face ``config.json`` dict; ``source`` names the file in errors."""

        def need(key: str) -> Any:
            if cfg.get(key) is None:
                raise CheckpointError(f"{source}: field {key!r} is missing")
            return _size(cfg, key, source)

        def optional(key: str, default: int) -> int:
            return default if cfg.get(key) is None else _size(cfg, key, source)

        arch = _architecture(cfg, source)
        if cfg.get("hidden_act", "silu") != "silu":
            raise CheckpointError(
                f"{source}: hidden_act {_shown(cfg['hidden_act'])} is not supported"
            )
        if cfg.get("mlp_bias"):
            raise CheckpointError(f"{source}: mlp_bias=true is not supported")
        if cfg.get("use_sliding_window"):
            raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
        hidden, heads = need("hidden_size"), need("num_attention_heads")
        vocab = need("vocab_size")
        kv_heads = optional("num_key_value_heads", heads)
        if heads % kv_heads:
            raise CheckpointError(
                f"{source}: num_attention_heads {heads} is not a multiple of "
                f"num_key_value_heads {kv_heads}"
            )
        if cfg.get("head_dim") is None and hidden % heads:
            raise CheckpointError(
                f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads "
                f"{heads} (and there is no head_dim)"
            )
        max_pos = optional("max_position_embeddings", 4096)
        theta, scaling = _parse_rope(cfg, source, max_pos)
        eos = token_ids_in(cfg, "eos_token_id", vocab, source)
        bos = token_ids_in(cfg, "bos_token_id", vocab, source)
        return cls(
            architecture=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=need("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=optional("head_dim", hidden // heads),
            rms_norm_eps=_positive_float(cfg, "rms_norm_eps", 1e-6, source),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=_flag(cfg, "tie_word_embeddings", source),
            attention_bias=arch == "Qwen2ForCausalLM" or _flag(cfg, "attention_bias", source),
            max_position_embeddings=max_pos,
            eos_token_ids=eos,
            bos_token_id=bos[0] if bos else None,
        )

    def to_hf_config(self) -> dict[str, Any]:
        """A Hugging Face ``config.json`` dict of this architecture (``from_hf_config`` reads it
        back equal); the rope fields are the legacy ones, which transformers 4 and 5 both read."""
        eos = list(self.eos_token_ids)
        scaling = self.rope_scaling and {"rope_type": "llama3", **self.rope_scaling}
        return {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": False,
            "use_sliding_window": False,
            "max_position_embeddings": self.max_position_embeddings,
            "eos_token_id": (eos[0] if len(eos) == 1 else eos) if eos else None,
            "bos_token_id": self.bos_token_id,
        }


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _positive_int(cfg: dict[str, Any], key: str, source: str) -> int:
    """``cfg[key]`` when it is an integer >= 1 (``true`` and ``"512"`` are not)."""
    value = cfg[key]
    if type(value) is not int or value < 1:
        raise CheckpointError(
            f"{source}: field {key!r} must be an integer >= 1, got {_shown(value)}"
        )
    return value


def _size(cfg: dict[str, Any], key: str, source: str) -> int:
    """``cfg[key]``, a positive integer, within its ``MAX_SIZES`` limit."""
    value = _positive_int(cfg, key, source)
    limit = MAX_SIZES.get(key)
    if limit is not None and value > limit:
        raise CheckpointError(
            f"{source}: field {key!r} is {value:,}, over the limit of {limit:,} "
            "(no supported model is that large)"
        )
    return value


def check_sizes(args: ModelArgs, source: str) -> None:
    """Every size of ``args`` within its ``MAX_SIZES`` limit (for a GGUF file's header, whose
    keys map onto these fields)."""
    for key, limit in MAX_SIZES.items():
        value = getattr(args, key)
        if value > limit:
            raise CheckpointError(
                f"{source}: {key} is {value:,}, over the limit of {limit:,} "
                "(no supported model is that large)"
            )


def _architecture(cfg: dict[str, Any], source: str) -> str:
    """The one supported architecture ``architectures`` (or ``model_type``) names."""
    archs = cfg.get("architectures")
    if not archs:
        model_type = cfg.get("model_type", "")
        archs = [_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else model_type]
    arch = archs[0] if isinstance(archs, list) else archs
    if not isinstance(arch, str) or arch not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"{source}: architecture {_shown(arch)} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return arch


def _positive_float(cfg: dict[str, Any], key: str, default: float, source: str) -> float:
    value = cfg.get(key)
    if value is None:
        return default
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise CheckpointError(
            f"{source}: field {key!r} must be a finite number > 0, got {_shown(value)}"
        )
    return float(value)


def _flag(cfg: dict[str, Any], key: str, source: str) -> bool:
    value = cfg.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise CheckpointError(f"{source}: field {key!r} must be true or false, got {_shown(value)}")
    return value


def token_ids_in(cfg: dict[str, Any], key: str, vocab_size: int, source: str) -> tuple[int, ...]:
    """A token id field (an int, a list of them or null), every id inside the vocabulary."""
    value = cfg.get(key)
    items = value if isinstance(value, list) else [] if value is None else [value]
    for item in items:
        if type(item) is not int or not 0 <= item < vocab_size:
            raise CheckpointError(
                f"{source}: field {key!r} must hold token ids in [0, {vocab_size}), "
                f"got {_shown(value)}"
            )
    return tuple(items)


def token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    """A config's ``eos_token_id`` (an int, a list or null) as a tuple."""
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


def _parse_rope(cfg: dict[str, Any], source: str, max_pos: int) -> tuple[float, dict | None]:
    """Theta and llama3 scaling from ``rope_parameters`` (transformers 5) or ``rope_scaling``."""
    for key in ("rope_scaling", "rope_parameters"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise CheckpointError(
                f"{source}: field {key!r} must be an object or null, got {_shown(cfg[key])}"
            )
    params = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    field = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    if any(isinstance(v, dict) for v in params.values()):
        raise CheckpointError(f"{source}: per-layer {field} is not supported")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if type(theta) not in (int, float) or not math.isfinite(theta) or theta <= 0:
        raise CheckpointError(
            f"{source}: rope_theta must be a finite number > 0, got {_shown(theta)}"
        )
    theta = float(theta)
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"{source}: {field}.partial_rotary_factor != 1 is not supported")
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise CheckpointError(
            f"{source}: {field}.rope_type {_shown(rope_type)} is not supported (supported: llama3)"
        )
    params.setdefault("original_max_position_embeddings", max_pos)
    for key in _LLAMA3_KEYS:
        if key not in params:
            raise CheckpointError(f"{source}: {field}.{key} is missing for llama3 scaling")
        value = params[key]
        if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
            raise CheckpointError(
                f"{source}: {field}.{key} must be a finite number > 0, got {_shown(value)}"
            )
    return theta, {key: params[key] for key in _LLAMA3_KEYS}


def kv_cache_shape(args: ModelArgs, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """Shape of one layer's paged KV cache: [2 (k, v), num_blocks, block_size, kvh, d]."""
    return (2, num_blocks, block_size, args.num_key_value_heads, args.head_dim)


def kv_cache_bytes_per_block(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block id costs summed over all layers (a block id addresses every layer)."""
    per_layer = 2 * block_size * args.num_key_value_heads * args.head_dim * dtype.itemsize
    return per_layer * args.num_hidden_layers


def weight_count(args: ModelArgs) -> int:
    """The number of weights a model of ``args`` loads, by arithmetic on its shapes (what
    ``checkpoint_args.expected_tensors`` lists, without building a model or loading torch)."""
    h, d = args.hidden_size, args.head_dim
    q, kv = args.num_attention_heads * d, args.num_key_value_heads * d
    attention = h * q + 2 * h * kv + q * h
    if args.attention_bias:
        attention += q + 2 * kv + (h if args.o_proj_bias else 0)
    if args.qk_norm:
        attention += 2 * d
    layer = attention + 3 * h * args.intermediate_size + 2 * h
    head = 0 if args.tie_word_embeddings else args.vocab_size * h
    return args.vocab_size * h + args.num_hidden_layers * layer + h + head
