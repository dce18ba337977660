"""A GGUF's byte-level BPE (``tokenizer.ggml.model: gpt2``) as a ``tokenizer.json`` document,
the way transformers builds it (``GPT2Tokenizer`` from the file's tokens and merges, then the
split regex ``tokenizer.ggml.pre`` names).

The vocabulary and merges are the file's (a token outside GPT-2's byte alphabet spelled in it),
the decoder ``ByteLevel``; control tokens spelled in the alphabet are special added tokens. The
split before the merges: Llama 3's, Qwen 2's and Qwen 3.5's regexes for those vocabularies, GPT-2's
own byte-level split for ``gpt2``, ``default`` and ``smollm`` (transformers has no regex of its
own for SmolLM, so its GPT-2 tokenizer's split applies); anything else is refused."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from mrv2_prof.text.tokenizer_json import added_tokens, post_processor

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2 = None  # GPT-2's own byte-level split (ByteLevel with its built-in regex)

# tokenizer.ggml.pre -> the split regex transformers uses for it
PRE_TOKENIZERS: dict[str, str | None] = {
    "default": _GPT2,
    "gpt2": _GPT2,
    "smollm": _GPT2,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "qwen35": _QWEN35_SPLIT,
}


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (``bytes_to_unicode``)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def byte_level_document(
    tokens: list[str], merges: list[str], types: list[int], pre: str, settings: dict[str, Any]
) -> dict[str, Any]:
    """The ``tokenizer.json`` document (``pre`` one of ``PRE_TOKENIZERS``)."""
    spelling = byte_alphabet()
    spelled = set(spelling.values()).issuperset
    vocab = {
        (token if spelled(token) else "".join(spelling[b] for b in token.encode("utf-8"))): index
        for index, token in enumerate(tokens)
    }
    split = PRE_TOKENIZERS[pre]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    if split is None:
        pre_tokenizer = {**byte_level, "use_regex": True}
    else:
        pre_tokenizer = {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": split},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {**byte_level, "use_regex": False},
            ],
        }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens(vocab, tokens, types, settings["tokens"], spelled),
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(settings),
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,  # "a b" strings, as the library's older format has them
        },
    }
