"""The tokenizer and chat template a GGUF file carries in its metadata, built the way
transformers builds them (``integrations/gguf/gguf_tokenizer_mapping.py``), so ids match
``AutoTokenizer.from_pretrained(dir, gguf_file=name)``, which is how vLLM loads a GGUF's.

``tokenizer.ggml.model`` picks the builder: ``gpt2`` is byte-level BPE (``byte_level_bpe.py``,
the split regex by ``tokenizer.ggml.pre``), ``llama`` SentencePiece (``sentencepiece_bpe.py``;
not for the architectures transformers builds otherwise: Gemma's, Phi-3's). The special tokens
are the ``*_token_id`` keys; BOS/EOS go around a prompt as ``add_bos_token`` / ``add_eos_token``
say (absent: transformers' defaults, BOS for SentencePiece only). Anything else is one
``TokenizerError`` line naming the file and key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mrv2_prof.text.byte_level_bpe import PRE_TOKENIZERS, byte_level_document
from mrv2_prof.text.errors import TokenizerError
from mrv2_prof.text.sentencepiece_bpe import sentencepiece_document

KEYS = "tokenizer.ggml."
MODELS = ("gpt2", "llama")
# architectures whose SentencePiece tokenizer transformers builds with its own fixes
OWN_SENTENCEPIECE = ("gemma", "gemma2", "gemma3", "phi3")
SPECIAL_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def wanted_key(key: str) -> bool:
    """The metadata a tokenizer needs: ``tokenizer.*`` and the architecture."""
    return key.startswith("tokenizer.") or key == "general.architecture"


def gguf_tokenizer_json(path: Path, meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The ``tokenizer.json`` text of the file's tokenizer, and its settings (special token
    ids and text, BOS/EOS flags, chat template) as a small dict."""
    model = meta.get(KEYS + "model")
    if model is None:
        raise TokenizerError(f"{path}: GGUF has no tokenizer ({KEYS}model is missing)")
    if model not in MODELS:
        raise TokenizerError(
            f"{path}: {KEYS}model: {model!r} not supported; supported: 'gpt2' (byte-level BPE), "
            "'llama' (SentencePiece)"
        )
    pre = meta.get(KEYS + "pre", "default")
    supported = sorted(PRE_TOKENIZERS) if model == "gpt2" else ["default"]
    if pre not in supported:
        raise TokenizerError(
            f"{path}: {KEYS}pre: pre-tokenizer {pre!r} not supported for {model!r}; "
            f"supported: {', '.join(supported)}"
        )
    arch = meta.get("general.architecture")
    if model == "llama" and arch in OWN_SENTENCEPIECE:
        raise TokenizerError(
            f"{path}: general.architecture: {arch!r} SentencePiece tokenizers not supported"
        )
    tokens = _list_of(path, meta, "tokens", str)
    types = _list_of(path, meta, "token_type", int) if KEYS + "token_type" in meta else []
    _same_length(path, "token_type", types, tokens)
    settings = _settings(path, meta, tokens, add_bos_default=model == "llama")
    if model == "gpt2":
        merges = _list_of(path, meta, "merges", str)
        document = byte_level_document(tokens, merges, types, pre, settings)
    else:
        merges = _list_of(path, meta, "merges", str) if KEYS + "merges" in meta else None
        scores = _list_of(path, meta, "scores", float) if merges is None else []
        if merges is None:
            _same_length(path, "scores", scores, tokens)
        document = sentencepiece_document(tokens, scores, merges, types, settings)
    return json.dumps(document, ensure_ascii=False), settings


def _settings(
    path: Path, meta: dict[str, Any], tokens: list[str], *, add_bos_default: bool
) -> dict[str, Any]:
    ids = {name: _token_id(path, meta, name, len(tokens)) for name in SPECIAL_IDS}
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{path}: tokenizer.chat_template is not a string")
    return {
        "tokens": {name: (tokens[i] if i is not None else None) for name, i in ids.items()},
        "ids": ids,
        "chat_template": template,
        "add_bos_token": _flag(path, meta, "add_bos_token", add_bos_default),
        "add_eos_token": _flag(path, meta, "add_eos_token", False),
    }


def _list_of(path: Path, meta: dict[str, Any], name: str, kind: type) -> list:
    """A metadata array of ``kind`` (a GGUF array has one element type: the first tells)."""
    values = meta.get(KEYS + name)
    if not isinstance(values, list) or (values and not isinstance(values[0], kind)):
        raise TokenizerError(f"{path}: {KEYS}{name} is missing or not a list of {kind.__name__}")
    return values


def _same_length(path: Path, name: str, values: list, tokens: list) -> None:
    if values and len(values) != len(tokens):
        raise TokenizerError(
            f"{path}: {KEYS}{name}: {len(values)} entries for {len(tokens)} tokens"
        )


def _token_id(path: Path, meta: dict[str, Any], name: str, n_tokens: int) -> int | None:
    key = KEYS + SPECIAL_IDS[name]
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_tokens:
        raise TokenizerError(f"{path}: {key}: {value!r} is not a token id below {n_tokens}")
    return value


def _flag(path: Path, meta: dict[str, Any], name: str, default: bool) -> bool:
    value = meta.get(KEYS + name, default)
    if not isinstance(value, bool):
        raise TokenizerError(f"{path}: {KEYS}{name}: {value!r} is not a bool")
    return value
