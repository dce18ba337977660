"""The tokenizer of a Hugging Face checkpoint directory: ``tokenizer.json`` through the
``tokenizers`` library, with what ``tokenizer_config.json`` adds the way transformers (5.x)
adds it: the named special tokens (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``,
extra special tokens) made special added tokens. Whether a prompt gets a BOS or EOS is
``tokenizer.json``'s post-processor alone: transformers drops the config's ``add_bos_token`` /
``add_eos_token`` when there is a ``tokenizer.json``, and so does this. The chat template is
``chat_template.jinja`` when the directory has one, else the config's ``chat_template`` (a
string, or a list of named templates: the one named ``default``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mrv2_prof.inputs.input_file import InputError, check_regular_file
from mrv2_prof.text.errors import TokenizerError

TOKENIZER_JSON = "tokenizer.json"
CONFIG_JSON = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
MAX_BYTES = 256 << 20  # the largest tokenizer.json read (Gemma's are ~35 MB)
NAMED = ("bos_token", "eos_token", "unk_token", "pad_token")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; anything else is one line naming the file."""
    return check_json(path, read_text(path))


def check_json(path: Path, text: str) -> dict[str, Any]:
    """``text`` (read from ``path``) as a JSON object, else one line naming the file."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: not a JSON object")
    return value


def read_text(path: Path) -> str:
    """A tokenizer file: a regular file (a FIFO or a device is refused, never opened, so it cannot
    block), UTF-8, at most ``MAX_BYTES``."""
    try:
        check_regular_file(path, "tokenizer file")
    except InputError as exc:
        raise TokenizerError(str(exc)) from None
    try:
        if path.stat().st_size > MAX_BYTES:
            raise TokenizerError(f"{path}: larger than {MAX_BYTES >> 20} MiB")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise TokenizerError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read: {exc.strerror or exc}") from None


def token_text(path: Path, key: str, value: Any) -> str | None:
    """A special token as the config writes it: a string, or an ``AddedToken`` dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"{path}: {key}: {value!r:.80} is not a token")


def hf_settings(directory: Path) -> dict[str, Any]:
    """What the directory's ``tokenizer_config.json`` and template file say (all optional)."""
    config_path = directory / CONFIG_JSON
    config = read_json(config_path) if os.path.lexists(config_path) else {}
    settings: dict[str, Any] = {
        name: token_text(config_path, name, config.get(name)) for name in NAMED
    }
    extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    if isinstance(extra, dict):  # v5 writes a dict of named extras
        extra = list(extra.values())
    if not isinstance(extra, list):
        raise TokenizerError(f"{config_path}: additional_special_tokens is not a list")
    settings["extra"] = [token_text(config_path, "additional_special_tokens", t) for t in extra]
    for flag in ("clean_up_tokenization_spaces",):
        if flag in config and not isinstance(config[flag], bool):
            raise TokenizerError(f"{config_path}: {flag}: {config[flag]!r} is not a bool")
        settings[flag] = config.get(flag)
    template_path = directory / TEMPLATE_FILE
    if os.path.lexists(template_path):  # present: read (a FIFO is refused, not skipped)
        settings["chat_template"] = read_text(template_path)
        settings["template_source"] = template_path
    else:
        settings["chat_template"] = _config_template(config_path, config.get("chat_template"))
        settings["template_source"] = config_path
    return settings


def _config_template(path: Path, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise TokenizerError(f"{path}: chat_template is neither a string nor a list with 'default'")


def add_named_tokens(backend: Any, settings: dict[str, Any]) -> None:
    """Make the config's named special tokens special added tokens (matched whole, skipped when
    decoding without special tokens), as transformers does on load."""
    from tokenizers import AddedToken

    added = {token.content for token in backend.get_added_tokens_decoder().values()}
    wanted = [settings[name] for name in NAMED] + settings["extra"]
    new = [t for t in dict.fromkeys(wanted) if t is not None and t not in added]
    if new:
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in new])
