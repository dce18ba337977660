"""Chat templates render as transformers renders them (``render_jinja_template``): block
trimming, loop controls, ``namespace``, ``tojson``, ``dict``, ``{% generation %}``, the special
tokens' text; ``raise_exception``, ``strftime_now`` and the sandbox behave as there."""

from __future__ import annotations

from datetime import datetime

import pytest

from mrv2_prof.text import TokenizerError
from mrv2_prof.text.chat_template import ChatTemplate

transformers_chat = pytest.importorskip("transformers.utils.chat_template_utils")

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}

TEMPLATES = {
    "blocks": (
        "{{ bos_token }}\n{% for m in messages %}\n    {% if m.role == 'system' %}\n"
        "[SYS] {{ m.content | trim }}\n    {% else %}\n"
        "<{{ m.role }}>{{ m.content }}{{ eos_token }}\n"
        "    {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}<assistant>{% endif %}"
    ),
    "loop_controls_and_namespace": (
        "{% set ns = namespace(n=0, last='') %}{% for m in messages %}"
        "{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}{% set ns.last = m.content %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}{{ loop.index }}:{{ m.content }};"
        "{% endfor %}n={{ ns.n }} last={{ ns.last }}"
    ),
    "tojson_and_dict": (
        "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}|"
        "{{ dict(a=1, b='日本') | tojson(sort_keys=True) }}|{{ tools is none }}"
    ),
    "generation_block": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "A:{{ m.content }}{% endgeneration %}{% else %}U:{{ m.content }}{% endif %}\n"
        "{% endfor %}{{ unk_token }}{{ pad_token is defined }}"
    ),
}

MESSAGES = [
    {"role": "system", "content": "  Be brief & <exact>.  "},
    {"role": "user", "content": 'Héllo "quoted" 🤖'},
    {"role": "assistant", "content": "Hi!\n"},
    {"role": "user", "content": "again"},
    {"role": "user", "content": "and again"},
]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_render_equals_transformers(name):
    template = TEMPLATES[name]
    got = ChatTemplate("t.jinja", template, SPECIAL).render(MESSAGES)
    rendered, _ = transformers_chat.render_jinja_template(
        conversations=[MESSAGES],
        chat_template=template,
        add_generation_prompt=True,
        **{k: v for k, v in SPECIAL.items() if v is not None},
    )
    assert got == rendered[0]
    assert got  # the templates render something


def test_strftime_now_and_raise_exception():
    template = ChatTemplate(
        "t.jinja",
        "{% if messages | length > 1 %}{{ raise_exception('one message only, got ' ~ "
        "messages | length) }}{% endif %}{{ strftime_now('%Y') }}",
        SPECIAL,
    )
    assert template.render(MESSAGES[:1]) == datetime.now().strftime("%Y")
    with pytest.raises(TokenizerError) as err:
        template.render(MESSAGES)
    assert str(err.value) == "t.jinja: chat_template failed: one message only, got 5"


@pytest.mark.parametrize(
    "body",
    [
        "{{ messages.append(1) }}",  # the sandbox does not let a template change its input
        "{{ messages.__class__.__mro__ }}",
        "{% set ns = namespace(_x=1) %}",
        "{{ 1 / 0 }}",
    ],
)
def test_what_the_sandbox_refuses_is_one_line(body):
    with pytest.raises(TokenizerError) as err:
        ChatTemplate("t.jinja", body, SPECIAL).render(MESSAGES)
    message = str(err.value)
    assert message.startswith("t.jinja: chat_template failed: ") and "\n" not in message
