"""A GGUF's SentencePiece vocabulary (``tokenizer.ggml.model: llama``: Llama 2, Mistral,
TinyLlama) as a ``tokenizer.json`` document, the way transformers builds it (``LlamaTokenizer``
from the file's tokens and merges).

A SentencePiece GGUF usually has no merges: they are recovered from the vocabulary and the
scores as transformers' ``generate_merges`` does (every split of a token into two tokens, best
score first). Spaces become ``▁`` with one prepended to the text (``Metaspace``, scheme
``first``), unknown characters fall back to the ``<0xNN>`` byte tokens, and decoding undoes both
and strips the one leading space. Control tokens are special added tokens."""

from __future__ import annotations

from typing import Any

from mrv2_prof.text.tokenizer_json import added_tokens, post_processor


def recovered_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[list[str]]:
    """transformers' ``generate_merges(vocab, scores)``: each token's splits into two tokens, in
    the vocabulary's order of their parts, then all of them by score (best first), ties by the
    parts' lengths (longer first)."""
    merges = []
    for merge, score in scores.items():
        local = []
        for index in range(1, len(merge)):
            left, right = merge[:index], merge[index:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [[left, right] for left, right, _ in merges]


def sentencepiece_document(
    tokens: list[str],
    scores: list[float],
    merges: list[str] | list[list[str]] | None,
    types: list[int],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The ``tokenizer.json`` document (``merges`` None: recovered from the scores)."""
    vocab = {token: index for index, token in enumerate(tokens)}
    if merges is None:
        merges = recovered_merges(vocab, dict(zip(tokens, scores, strict=True)))
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens(vocab, tokens, types, settings["tokens"], lambda _: True),
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Metaspace",
            "replacement": "\u2581",
            "prepend_scheme": "first",
            "split": False,
        },
        "post_processor": post_processor(settings),
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
