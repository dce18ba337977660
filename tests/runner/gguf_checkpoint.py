"""A Hugging Face safetensors checkpoint written as a GGUF file, the way llama.cpp's converter
writes one: the ``gguf`` package's writer, its own tensor-name map (``get_tensor_name_map``, not
the loader's table), its quantizers, and the converter's q/k row permutation for ``llama``.

Tests build small GGUF checkpoints with it (conftest's ``make_gguf_checkpoint``) and damage
them with ``tensor_record`` / ``metadata_value`` (where a field lies in the file).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType
from safetensors.numpy import load_file

Q = GGMLQuantizationType
_ARCH = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's ``LlamaModel.permute`` (rows of q or k, per head)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(
    hf_dir: Path,
    out: Path,
    weight_type: GGMLQuantizationType = Q.F32,
    types: dict[str, GGMLQuantizationType] | None = None,
    token_list: bool = False,
    metadata: dict[str, Any] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    drop: tuple[str, ...] = (),
) -> Path:
    """``hf_dir`` (``config.json`` + safetensors) as the GGUF ``out``: matrices in
    ``weight_type`` (``types``: by GGUF name), vectors in F32. ``token_list``: the vocabulary
    size as a token list instead of ``{arch}.vocab_size``; ``metadata``: more keys (a value of
    None drops a key the writer would add); ``drop``: GGUF tensor names left out."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = cfg["model_type"]
    n_layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 1e4))
    state: dict[str, np.ndarray] = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        state.update(load_file(str(file)))
    names = gguf.get_tensor_name_map(_ARCH[arch], n_layers)
    writer = gguf.GGUFWriter(str(out), arch)
    metadata = dict(metadata or {})
    keys: dict[str, Any] = {
        f"{arch}.block_count": n_layers,
        f"{arch}.context_length": cfg["max_position_embeddings"],
        f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.feed_forward_length": cfg["intermediate_size"],
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv_heads,
        f"{arch}.rope.dimension_count": head_dim,
        f"{arch}.rope.freq_base": float(theta),
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        f"{arch}.vocab_size": None if token_list else cfg["vocab_size"],
    }
    if head_dim != cfg["hidden_size"] // heads:
        keys[f"{arch}.attention.key_length"] = head_dim
        keys[f"{arch}.attention.value_length"] = head_dim
    for key in ("eos_token_id", "bos_token_id"):
        if isinstance(cfg.get(key), int):
            keys[f"tokenizer.ggml.{key}"] = cfg[key]
    keys.update(metadata)
    add_metadata(writer, keys)
    if token_list:
        writer.add_token_list([f"<t{i}>" for i in range(cfg["vocab_size"])])
    for hf_name, value in state.items():
        base, suffix = hf_name.rsplit(".", 1)
        name = f"{names.get_name(base)}.{suffix}"
        if name in drop:
            continue
        value = value.astype(np.float32)
        if arch == "llama" and ".attn_q." in name:
            value = permute(value, heads)
        elif arch == "llama" and ".attn_k." in name:
            value = permute(value, kv_heads)
        qtype = (types or {}).get(name, weight_type if value.ndim == 2 else Q.F32)
        writer.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    for name, value in (extra_tensors or {}).items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def tensor_record(path: Path, name: str) -> dict[str, int]:
    """Byte positions of tensor ``name``'s info record in the file, found with the ``gguf``
    package's own reader: ``dims`` (its first dim), ``type`` and ``offset``."""
    reader = gguf.GGUFReader(path)
    tensor = next(t for t in reader.tensors if t.name == name)
    start = tensor.field.offset
    name_len = 8 + len(name.encode())
    n_dims = len(tensor.shape)
    dims = start + name_len + 4
    return {"dims": dims, "type": dims + 8 * n_dims, "offset": dims + 8 * n_dims + 4}


def metadata_value(path: Path, key: str) -> int:
    """Byte position of metadata ``key``'s value (after its type) in the file."""
    reader = gguf.GGUFReader(path)
    field = reader.fields[key]
    return field.offset + 8 + len(key.encode()) + 4


def patch(path: Path, position: int, fmt: str, value: Any) -> None:
    """Overwrite the little-endian ``fmt`` value at ``position`` of ``path``."""
    with path.open("r+b") as f:
        f.seek(position)
        f.write(struct.pack("<" + fmt, value))


def hf_checkpoint_maker():
    """The tests' ``make_hf_checkpoint`` function for module-scoped fixtures, loaded from
    tests/conftest.py by path (``from conftest import`` finds whichever conftest came first)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "conftest.py"
    spec = importlib.util.spec_from_file_location("mrv2_tests_root_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_hf_checkpoint.__wrapped__()


def add_metadata(writer: gguf.GGUFWriter, keys: dict[str, Any]) -> None:
    """Each key with the GGUF type its Python value implies (None: the key left out; ints as
    uint32, floats as float32, token scores as a float array)."""
    for key, value in keys.items():
        if value is None:
            continue
        if key == "tokenizer.ggml.scores":
            writer.add_array(key, [float(v) for v in value])
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
