"""Chat templates: a model's Jinja template rendered the way transformers renders it.

The environment is transformers' (``utils/chat_template_utils.py``): a sandbox that cannot change
the objects it is given (``ImmutableSandboxedEnvironment``), ``trim_blocks`` and ``lstrip_blocks``,
the ``loopcontrols`` extension, a ``{% generation %}`` block that renders its body, ``tojson``
without HTML escaping, and the globals ``raise_exception``, ``strftime_now``, ``dict`` and
``namespace``. A template is rendered with ``messages``, ``add_generation_prompt`` and the special
tokens' text (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``). Any error, at compile
time or while rendering, is a ``TokenizerError`` of one line naming the file."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from mrv2_prof.text.errors import TokenizerError


class ChatTemplate:
    """One compiled template and the special tokens' text it is rendered with."""

    def __init__(self, source: str, template: str, special_tokens: dict[str, str | None]) -> None:
        import jinja2

        self.source = source
        self.text = template
        self._special = {k: v for k, v in special_tokens.items() if v is not None}
        try:
            self._template = _environment().from_string(template)
        except jinja2.TemplateError as exc:
            what = _what(exc)
            raise TokenizerError(f"{source}: chat_template does not compile: {what}") from None

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The conversation as the model's prompt text."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TokenizerError(f"{self.source}: a conversation must be a list of message dicts")
        try:
            return self._template.render(
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._special,
            )
        except Exception as exc:  # a template is code from outside: any failure is its own
            raise TokenizerError(f"{self.source}: chat_template failed: {_what(exc)}") from None


def _what(exc: BaseException) -> str:
    """The error's text on one line, shortened."""
    line = " ".join(str(exc).split()) or type(exc).__name__
    return line if len(line) <= 200 else line[:197] + "..."


_ENVIRONMENT = None


def _environment():
    """The shared sandboxed environment (built once; templates compiled from it are independent)."""
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = _build_environment()
    return _ENVIRONMENT


def _build_environment():
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's tokens
        with it; rendering a prompt only needs its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class SafeNamespace(jinja2.utils.Namespace):
        """``namespace()`` refusing underscore names, as transformers' does."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                SafeNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            SafeNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with _")

    class SafeDict:
        """``dict(...)`` without the type itself (no attribute access to it)."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = SafeDict()
    env.globals["namespace"] = SafeNamespace
    return env
