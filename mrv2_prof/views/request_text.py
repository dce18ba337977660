"""A request's decoded text (``requests.prompt_text``, ``output_text``) made short enough to show.

Prompts and outputs are text from outside: every function here returns it on one line, its
control characters removed (``safe_text.plain``) and its whitespace runs made one space, cut
with "…" where it was shortened. ``head`` keeps the start (an output), ``tail`` the end (a
prompt: what the model answers is at its end), ``around`` a window about a character position
(where two outputs first differ). ``prompt_gist`` is the last user
message of a chat-templated prompt when the template is one of the common ones, else the prompt;
``asked`` the start of that message, else the end of the prompt.
"""

from __future__ import annotations

import re

from mrv2_prof.views.safe_text import plain

ELLIPSIS = "…"
# The user turns of the common chat templates: ChatML (SmolLM2, Qwen), Llama 3, Gemma, Phi-3,
# Llama 2 / Mistral; group 1 is the message.
_USER_TURNS = (
    re.compile(r"<\|im_start\|>user\s*\n(.*?)<\|im_end\|>", re.S),
    re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\s*(.*?)<\|eot_id\|>", re.S),
    re.compile(r"<start_of_turn>user\s*\n(.*?)<end_of_turn>", re.S),
    re.compile(r"<\|user\|>\s*(.*?)<\|end\|>", re.S),
    re.compile(r"\[INST\](.*?)\[/INST\]", re.S),
)


def clean(text: str, bound: int | None = None) -> str:
    """``text`` on one line: control characters removed, whitespace runs one space. With
    ``bound`` only about that many characters of each end are cleaned (a huge text costs no
    more than a short one); what lies between becomes one "…"."""
    if bound is not None and len(text) > 2 * bound:
        text = f"{text[:bound]} {ELLIPSIS} {text[-bound:]}"
    return " ".join(plain(text).split())


def head(text: str, limit: int) -> str:
    """The start of ``text``, at most ``limit`` characters, "…" at the end when cut."""
    text = clean(text, 2 * limit)
    return text if len(text) <= limit else text[: max(limit - 1, 0)].rstrip() + ELLIPSIS


def tail(text: str, limit: int) -> str:
    """The end of ``text``, at most ``limit`` characters, "…" at the start when cut."""
    text = clean(text, 2 * limit)
    return text if len(text) <= limit else ELLIPSIS + text[len(text) - max(limit - 1, 0) :].lstrip()


def around(text: str, pos: int, limit: int) -> str:
    """At most ``limit`` characters of ``text`` about character ``pos`` (a third before it),
    "…" where cut; the window is chosen in the raw text, then cleaned."""
    before = limit // 3
    start = max(0, min(pos - before, len(text) - limit))
    window = text[start : start + limit]
    shown = " ".join(plain(window).split())
    if start > 0:
        shown = ELLIPSIS + shown
    if start + limit < len(text):
        shown += ELLIPSIS
    return shown


def first_difference(a: str, b: str) -> int:
    """The first character position where ``a`` and ``b`` differ (the shorter's length when one
    is the other's start; the length when equal)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _last_user_message(prompt: str) -> str | None:
    for turn in _USER_TURNS:
        found = turn.findall(prompt)
        if found and found[-1].strip():
            return found[-1].strip()
    return None


def prompt_gist(prompt: str) -> str:
    """The last user message of a prompt in one of the common chat templates, else the prompt
    itself (a plain prompt, or a template not recognised)."""
    message = _last_user_message(prompt)
    return prompt if message is None else message


def asked(prompt: str, limit: int) -> str:
    """What a prompt asks in at most ``limit`` characters: the start of its last user message
    (a chat template), else the end of the prompt (where the model goes on from)."""
    message = _last_user_message(prompt)
    return tail(prompt, limit) if message is None else head(message, limit)
