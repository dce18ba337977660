"""Small GGUF files written for the text tests with ``gguf.GGUFWriter``: a tokenizer's metadata
and no tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_gguf(path: Path, keys: dict[str, Any], *, arch: str = "llama", big_endian=False) -> Path:
    """A GGUF holding ``keys`` (str, bool, int -> uint32, float -> float32, lists; None: left
    out); transformers also wants the model's config keys (``LLAMA_CONFIG``) to load one."""
    import gguf

    from tests.runner.gguf_checkpoint import add_metadata

    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    keys = dict(keys)
    arch = keys.pop("general.architecture", arch)
    writer = gguf.GGUFWriter(str(path), arch, endianess=endian)
    add_metadata(writer, keys)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


LLAMA_CONFIG = {
    "llama.context_length": 2048,
    "llama.embedding_length": 64,
    "llama.block_count": 1,
    "llama.feed_forward_length": 128,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2,
    "llama.rope.freq_base": 10000.0,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
}


def small_vocabulary(meta: dict[str, Any], size: int) -> dict[str, Any]:
    """The first ``size`` tokens of a byte-level vocabulary and the merges among them (a smaller
    but consistent BPE: every merge's parts and result are kept tokens)."""
    tokens = meta["tokenizer.ggml.tokens"][:size]
    kept = set(tokens)
    merges = []
    for merge in meta["tokenizer.ggml.merges"]:
        a, b = merge.split(" ")
        if a in kept and b in kept and a + b in kept:
            merges.append(merge)
    types = meta["tokenizer.ggml.token_type"][:size]
    # tokens that only some splits can reach: digit runs (GPT-2 keeps a run whole, Llama 3 cuts
    # it in threes, Qwen 2 in ones) and a letter with its combining accent (whole only where
    # marks count as letters: Qwen 3.5); SmolLM2's own vocabulary has neither
    for merge in ("1 2", "12 3", "\u00cc \u0123", "a \u00cc\u0123"):
        a, b = merge.split(" ")
        if a + b not in kept:
            tokens, types, kept = [*tokens, a + b], [*types, 1], kept | {a + b}
        merges.append(merge)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": types,
    }


def sentencepiece_vocabulary(meta: dict[str, Any], size: int, tie_every: int) -> dict[str, Any]:
    """A SentencePiece-style vocabulary made from a byte-level one: ``<unk>``, ``<s>``,
    ``</s>``, the 256 ``<0xNN>`` byte pieces, then the first ``size`` ASCII tokens with ``Ġ``
    written ``▁``, scored by rank; ``tie_every`` ranks share a score, so merges recovered from the
    scores meet ties (broken by the parts' lengths and vocabulary order)."""
    pieces = []
    for token in meta["tokenizer.ggml.tokens"][17:]:
        piece = token.replace("\u0120", "\u2581")
        ascii_or_space = all(c == "\u2581" or 33 <= ord(c) < 127 for c in piece)
        if ascii_or_space and piece not in pieces:
            pieces.append(piece)
        if len(pieces) == size:
            break
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + [-float(i // tie_every) for i in range(len(pieces))],
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
