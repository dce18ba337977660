"""A request's decoded text shortened for a view: one line, no control characters, "…" at cuts,
and a chat-templated prompt shown by its last user message."""

from __future__ import annotations

import pytest

from mrv2_prof.views.request_text import (
    around,
    asked,
    clean,
    first_difference,
    head,
    prompt_gist,
    tail,
)


@pytest.mark.parametrize(
    "prompt",
    [
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nfirst<|im_end|>\n"
        "<|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\nWhy is the sky blue?<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nfirst<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhy is the sky blue?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<bos><start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n",
        "<|user|>\nWhy is the sky blue?<|end|>\n<|assistant|>\n",
        "<s>[INST] first [/INST] ok</s>[INST] Why is the sky blue? [/INST]",
    ],
    ids=["chatml", "llama3", "gemma", "phi3", "llama2"],
)
def test_the_gist_of_a_templated_prompt_is_its_last_user_message(prompt: str) -> None:
    assert prompt_gist(prompt) == "Why is the sky blue?"


def test_a_plain_prompt_is_its_own_gist() -> None:
    assert prompt_gist("Once upon a time") == "Once upon a time"
    assert prompt_gist("<|im_start|>user\n  <|im_end|>") == "<|im_start|>user\n  <|im_end|>"


def test_clean_puts_text_on_one_line_without_control_characters() -> None:
    assert clean("a\tb\n\nc \x1b[31mred\x07 \u202eevil") == "a b c [31mred evil"
    assert clean("x" * 50 + "y" * 50, bound=10) == "x" * 10 + " … " + "y" * 10


def test_head_and_tail_cut_with_an_ellipsis() -> None:
    assert head("hello world", 20) == "hello world"
    assert head("hello world", 8) == "hello w…"
    assert tail("hello world", 8) == "…o world"
    assert head("one two three", 9) == "one two…"  # no space left before the mark
    assert tail("one two three", 7) == "…three"


def test_around_shows_a_window_about_a_position() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    # 30 characters from 10 before position 50, cut on both sides
    assert around(text, 50, 30) == "…" + text[40:70] + "…"
    assert around(text, 3, 30) == text[:30] + "…"  # near the start: from the start
    assert around(text, 99, 30) == "…" + text[70:]  # near the end: up to the end
    assert around("short", 2, 30) == "short"


def test_first_difference() -> None:
    assert first_difference("The answer is 42", "The answer is 43") == 15
    assert first_difference("abc", "abcdef") == 3
    assert first_difference("same", "same") == 4


def test_asked_is_the_start_of_the_user_message_else_the_end_of_the_prompt() -> None:
    chat = "<|im_start|>user\nWhy is the sky blue today?<|im_end|>\n<|im_start|>assistant\n"
    assert asked(chat, 12) == "Why is the…"
    assert asked("Once upon a time there was", 12) == "…e there was"
