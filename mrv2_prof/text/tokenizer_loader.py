"""``load_tokenizer`` and ``tokenizer_for``: from a file or a model spec to a ``TextTokenizer``.

A checkpoint directory gives its ``tokenizer.json`` (no ``tokenizer.json``: None); a GGUF file
(named ``.gguf`` or starting with the GGUF magic) gives the tokenizer in its metadata
(``gguf_tokenizer``). A random-weight preset has no tokenizer (None). Everything wrong with a
file is one ``TokenizerError`` line naming it.

No cache: the tokenizer is built from the GGUF's metadata in about 0.3 s (the key section read
alone, the ``tokenizer.json`` document handed to the library whole), against ~3 s for
``gguf.GGUFReader`` to parse the file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mrv2_prof.text.chat_template import ChatTemplate
from mrv2_prof.text.errors import TokenizerError
from mrv2_prof.text.gguf_metadata import MAGIC as GGUF_MAGIC
from mrv2_prof.text.gguf_metadata import read_gguf_metadata
from mrv2_prof.text.gguf_tokenizer import gguf_tokenizer_json, wanted_key
from mrv2_prof.text.hf_tokenizer import (
    NAMED,
    TOKENIZER_JSON,
    add_named_tokens,
    check_json,
    hf_settings,
    read_text,
)
from mrv2_prof.text.text_tokenizer import TextTokenizer


def load_tokenizer(path: str | Path) -> TextTokenizer | None:
    """The tokenizer of a checkpoint directory or a GGUF file; None for a directory without a
    ``tokenizer.json``."""
    path = Path(path)
    if path.is_dir():
        return _from_directory(path)
    if not path.exists():
        raise TokenizerError(f"{path}: no such file or directory")
    if path.is_file() and (path.suffix.lower() == ".gguf" or _starts_with(path, GGUF_MAGIC)):
        return _from_gguf(path)
    raise TokenizerError(f"{path}: neither a checkpoint directory nor a GGUF file")


def tokenizer_for(spec: Any) -> TextTokenizer | None:
    """The tokenizer of a ``ModelSpec``: a shipped preset's GGUF, a checkpoint path's, none for
    a random-weight preset."""
    from mrv2_prof.runner.model.presets import PRESETS
    from mrv2_prof.runner.model.shipped import SHIPPED, require_shipped

    if spec.path is not None:
        return load_tokenizer(spec.path)
    if spec.preset in SHIPPED:
        return load_tokenizer(require_shipped(spec.preset))
    if spec.preset in PRESETS:
        return None
    raise TokenizerError(f"model.preset: {spec.preset!r} is neither a preset nor a shipped model")


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _from_directory(directory: Path) -> TextTokenizer | None:
    from tokenizers import Tokenizer

    json_path = directory / TOKENIZER_JSON
    if not os.path.lexists(json_path):  # present: read (a FIFO or a directory is refused)
        return None
    settings = hf_settings(directory)
    backend = _backend(Tokenizer, json_path, read_text(json_path))
    add_named_tokens(backend, settings)
    special = {name: settings[name] for name in NAMED}
    template = settings["chat_template"]
    bos, eos = settings["bos_token"], settings["eos_token"]
    eos_id = backend.token_to_id(eos) if eos is not None else None
    is_bpe = type(backend.model).__name__ == "BPE"
    return TextTokenizer(
        backend,
        source=str(json_path),
        eos_token_ids=(eos_id,) if eos_id is not None else (),
        bos_token_id=backend.token_to_id(bos) if bos is not None else None,
        chat_template=(
            ChatTemplate(str(settings["template_source"]), template, special)
            if template is not None
            else None
        ),
        clean_up_spaces=bool(settings["clean_up_tokenization_spaces"]) and not is_bpe,
    )


def _from_gguf(path: Path) -> TextTokenizer:
    from tokenizers import Tokenizer

    meta = read_gguf_metadata(path, wanted_key)
    text, settings = gguf_tokenizer_json(path, meta)
    backend = _backend(Tokenizer, path, text)
    ids, tokens = settings["ids"], settings["tokens"]
    template = settings["chat_template"]
    return TextTokenizer(
        backend,
        source=str(path),
        eos_token_ids=(ids["eos_token"],) if ids["eos_token"] is not None else (),
        bos_token_id=ids["bos_token"],
        chat_template=(
            ChatTemplate(f"{path} (tokenizer.chat_template)", template, tokens)
            if template is not None
            else None
        ),
    )


def _backend(tokenizer_class: Any, path: Path, text: str) -> Any:
    try:
        return tokenizer_class.from_str(text)
    except Exception as exc:  # the library's parse errors are plain Exceptions
        check_json(path, text)  # a file that is not even JSON says so
        line = " ".join(str(exc).split())[:200]
        raise TokenizerError(
            f"{path}: not a tokenizer the tokenizers library reads: {line}"
        ) from None
