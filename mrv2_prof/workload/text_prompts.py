"""Text prompts: a trace line's ``prompt`` or chat ``messages`` and a dataset's prompts, checked
for shape and then tokenized all at once with the model's tokenizer.

A plain prompt is tokenized as vLLM tokenizes a completion prompt (the tokenizer's default
special tokens); chat messages go through the model's chat template with the generation prompt
and are tokenized without adding special tokens (what vLLM's chat endpoint sends). Every text
of a workload is tokenized in one batch call per kind, never one call per line. What the model
is (its tokenizer, whether its weights are random, how errors name it) is a ``TextModel``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mrv2_prof.inputs.finite_numbers import shown_number
from mrv2_prof.scenario import ScenarioError
from mrv2_prof.views.safe_text import plain

if TYPE_CHECKING:
    from mrv2_prof.text import TextTokenizer

CHAT_ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = ("role", "content")
SHIPPED_TEXT_MODEL = "smollm2-135m"  # the real model named when a text workload has none

Prompt = str | list[dict[str, str]]  # plain text, or chat messages


class TextError(ValueError):
    """A text that cannot become a prompt: ``index`` is its position in the batch."""

    def __init__(self, index: int, problem: str) -> None:
        self.index, self.problem = index, problem
        super().__init__(problem)


@dataclass(frozen=True)
class TextModel:
    """What a text workload needs of the model: its tokenizer (None without one), whether its
    weights are random (``ignore_eos`` unset then means true), and how errors name it."""

    tokenizer: TextTokenizer | None
    random_weights: bool
    name: str

    @classmethod
    def of(cls, tokenizer: TextTokenizer | None, model: Any = None) -> TextModel:
        """``model`` is the run's ``ModelSpec`` (its ``preset`` and ``path`` are read), or None
        for a model known only by its tokenizer: then random weights when it has none."""
        preset, path = getattr(model, "preset", None), getattr(model, "path", None)
        if preset is not None:
            name = f"model.preset: {preset}"
        elif path is not None:
            name = f"model.path: {path}"
        else:
            name = "the model"
        random_weights = tokenizer is None and path is None
        return cls(tokenizer, random_weights, name)

    def missing_tokenizer(self, chat: bool = False) -> str | None:
        """Why this model cannot tokenize a text (or chat) workload, else None."""
        if self.tokenizer is None:
            what = "random weights and no tokenizer" if self.random_weights else "no tokenizer"
            return (
                f"{self.name} has {what}; a text workload needs one: use "
                f"model.preset: {SHIPPED_TEXT_MODEL} or a checkpoint with a tokenizer"
            )
        if chat and not self.tokenizer.has_chat_template:
            return f"the tokenizer of {self.name} has no chat template to render messages with"
        return None


def model_tokenizer(model: Any, section: Any, source: str) -> TextTokenizer | None:
    """The tokenizer of ``model`` (a ``ModelSpec``: ``mrv2_prof.text.tokenizer_for``), None for
    a random-weight preset. An unreadable tokenizer is a ``ScenarioError`` when ``section`` (the
    workload) reads a file that may hold text, a trace or a dataset; otherwise the workload has
    no text and goes without it."""
    from mrv2_prof.text import TokenizerError, tokenizer_for

    try:
        return tokenizer_for(model)
    except TokenizerError as exc:
        if section.trace is None and section.dataset is None:
            return None
        field = "model.path" if getattr(model, "path", None) is not None else "model.preset"
        raise ScenarioError(source, field, str(exc)) from None


def shown_json(value: Any) -> str:
    """A value from a JSON input as JSON, cut to 40 characters (a long list or string is cut
    before dumping); for error messages about traces and datasets."""
    if isinstance(value, list) and len(value) > 8:
        value = value[:8]
    if isinstance(value, str) and len(value) > 40:
        value = value[:40]
    text = plain(json.dumps(value))
    return text if len(text) <= 40 else text[:37] + "..."


def messages_problem(value: Any) -> tuple[str, str] | None:
    """``(key, problem)`` of chat messages that are not a non-empty list of ``{role, content}``
    with a known role and string content (``key`` is e.g. ``messages[2].role``), else None."""
    if not isinstance(value, list) or not value:
        return "messages", f"must be a non-empty list of {{role, content}}, got {shown_json(value)}"
    for i, message in enumerate(value):
        key = f"messages[{i}]"
        if not isinstance(message, dict):
            return key, f"must be an object with role and content, got {shown_json(message)}"
        for name in message:
            if name not in MESSAGE_KEYS:
                return f"{key}.{name}", "unknown key (a message has role and content)"
        for name in MESSAGE_KEYS:
            if name not in message:
                return f"{key}.{name}", "required"
        role, content = message["role"], message["content"]
        if role not in CHAT_ROLES:
            return f"{key}.role", f"must be one of {', '.join(CHAT_ROLES)}, got {shown_json(role)}"
        if not isinstance(content, str):
            return f"{key}.content", f"must be a string, got {shown_json(content)}"
    return None


def ids_problem(value: Any, vocab_size: int) -> str | None:
    """The problem of ``stop_token_ids`` that are not a list of ids in the vocabulary."""
    if not isinstance(value, (list, tuple)) or not all(type(v) is int for v in value):
        return f"must be a list of integers, got {shown_json(value)}"
    bad = next((t for t in value if not 0 <= t < vocab_size), None)
    if bad is not None:
        return f"token id {shown_number(bad, False)} outside the vocabulary [0, {vocab_size})"
    return None


def tokenize(model: TextModel, prompts: Sequence[Prompt], vocab_size: int) -> list[list[int]]:
    """The token ids of every prompt, in order: the plain ones in one ``encode_batch``, the
    chat ones in one ``encode_chat_batch``. A prompt that cannot be tokenized, gives no
    tokens or gives an id outside the model's vocabulary is a ``TextError`` with its index."""
    from mrv2_prof.text import TokenizerError

    tok = model.tokenizer
    assert tok is not None, "check missing_tokenizer() first"
    out: list[list[int]] = [[] for _ in prompts]
    plain_at = [i for i, p in enumerate(prompts) if isinstance(p, str)]
    chat_at = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
    for at, encode in ((plain_at, tok.encode_batch), (chat_at, tok.encode_chat_batch)):
        if not at:
            continue
        batch = [prompts[i] for i in at]
        try:
            encoded = encode(batch)
        except TokenizerError:  # which one: each alone (only on this error path)
            for i, prompt in zip(at, batch, strict=True):
                try:
                    encode([prompt])
                except TokenizerError as exc:
                    raise TextError(i, plain(exc, limit=200)) from None
            raise
        for i, ids in zip(at, encoded, strict=True):
            out[i] = ids
    for i, ids in enumerate(out):
        if not ids:
            raise TextError(i, "gives no tokens")
        top = max(ids)
        if top >= vocab_size:
            raise TextError(
                i,
                f"token id {top} of the tokenizer is outside the model's vocabulary "
                f"[0, {vocab_size})",
            )
    return out
