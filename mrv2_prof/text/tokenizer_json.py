"""Pieces of a ``tokenizer.json`` document shared by the GGUF tokenizers: the added tokens, as
transformers adds them to a tokenizer it builds from a GGUF, and the BOS/EOS post-processor
(transformers' ``update_post_processor``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
NAMED = ("bos_token", "eos_token", "unk_token", "pad_token")


def added_tokens(
    vocab: dict[str, int],
    tokens: list[str],
    types: list[int],
    named: dict[str, str | None],
    control_ok: Callable[[str], bool],
) -> list[dict[str, Any]]:
    """The added tokens, in transformers' order: the control tokens (``control_ok`` of them)
    special, the user-defined ones plain, then the named special tokens not added yet; each by
    its text, so its id is the vocabulary's for that text (matched whole in the input)."""
    added: dict[str, dict[str, Any]] = {}
    for token, kind in zip(tokens, types, strict=False):
        if kind == CONTROL and control_ok(token):
            added.setdefault(token, added_token(vocab[token], token, special=True))
    for token, kind in zip(tokens, types, strict=False):
        if kind == USER_DEFINED and token in vocab:
            added.setdefault(token, added_token(vocab[token], token, special=False))
    for name in NAMED:
        token = named[name]
        if token is not None and token in vocab:
            added.setdefault(token, added_token(vocab[token], token, special=True))
    return sorted(added.values(), key=lambda entry: entry["id"])


def added_token(index: int, token: str, *, special: bool) -> dict[str, Any]:
    return {
        "id": index,
        "content": token,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def post_processor(settings: dict[str, Any]) -> dict[str, Any]:
    """BOS before and EOS after a prompt, as ``add_bos_token`` / ``add_eos_token`` say."""
    bos, eos = settings["tokens"]["bos_token"], settings["tokens"]["eos_token"]
    add_bos = settings["add_bos_token"] and bos is not None
    add_eos = settings["add_eos_token"] and eos is not None
    specials: dict[str, Any] = {}

    def piece(token: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    def seq(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    def one(name: str, type_id: int) -> list[dict[str, Any]]:
        return (
            ([piece(bos, type_id)] if add_bos else [])
            + [seq(name, type_id)]
            + ([piece(eos, type_id)] if add_eos else [])
        )

    for flag, name in ((add_bos, "bos_token"), (add_eos, "eos_token")):
        if flag:
            token = settings["tokens"][name]
            specials[token] = {"id": token, "ids": [settings["ids"][name]], "tokens": [token]}
    return {
        "type": "TemplateProcessing",
        "single": one("A", 0),
        "pair": one("A", 0) + one("B", 1),
        "special_tokens": specials,
    }
