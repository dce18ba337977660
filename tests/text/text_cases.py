"""What the text tests share: the strings and conversations compared against transformers, and
transformers' tokenizer of a GGUF file (the independent reference)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest


def reference_tokenizer(path: Path) -> Any:
    """transformers' tokenizer of a GGUF file, as vLLM loads it."""
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def reference_chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """transformers' ``apply_chat_template(..., add_generation_prompt=True, tokenize=True)`` ids
    (a list, or a BatchEncoding's ``input_ids``, depending on the version)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if not isinstance(out, list) else out)


# Strings that take different paths through a byte-level BPE: code, accents, CJK, emoji (ZWJ
# sequences), whitespace runs and line ends, digit runs, contractions, control tokens written in
# the text (whole and cut), and the empty string.
TEXTS = [
    "Hello world",
    "  leading and trailing spaces  ",
    "def f(x):\n\treturn x ** 2  # square\n\n\nclass A:\n    pass\n",
    'for (int i = 0; i < n; ++i) { s += a[i]; }  // C\n{"k": [1, 2.5e-3, null]}',
    "naïve café Ωmega Ünïcödé z̷̢͎a̵l̶g̴o̸",
    "日本語のテキスト、中文字符。한국어 텍스트",
    "emoji 🤖🚀 family 👩‍👩‍👧 flag 🇫🇷 done",
    "tabs\t\tand\n\n\nnewlines   \n \r\n\r\nwindows",
    "digits 1234567890 3.14159 1e-10 0x1F 1,000,000",
    "I'm sure they've said we'll DON'T IT'S",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<repo_name>x<file_sep>y <|im_end <|im_start",
    "",
    " ",
    "\u00a0nbsp\u2009thin\u3000ideographic",
    "ＦＵＬＬ width ｶﾀｶﾅ",
    "a" * 300,
    "!!!???...,,,;;;:::",
    "Привет, мир! مرحبا بالعالم שלום",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [
        {"role": "user", "content": "Write a haiku about GPUs."},
        {
            "role": "assistant",
            "content": "Silicon rivers\nthousands of small hands at work\nheat rising at noon",
        },
        {"role": "user", "content": "Now one about 日本 🤖"},
    ],
    [
        {"role": "system", "content": "Answer in code.\n\n"},
        {"role": "user", "content": "def f(x):\n\treturn x"},
        {"role": "assistant", "content": "```python\nprint(1)\n```"},
        {"role": "user", "content": ""},
    ],
]
