"""The shipped SmolLM2 GGUF's tokenizer against transformers' tokenizer of the same file: ids,
chat prompts, decoding and the special token ids."""

from __future__ import annotations

import pytest
from text_cases import CONVERSATIONS, TEXTS, reference_chat_ids

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.text import TextTokenizer, tokenizer_for


def test_prompt_ids_equal_transformers(ours, reference):
    got = ours.encode_batch(TEXTS)
    want = [reference(text)["input_ids"] for text in TEXTS]
    assert {t: g for t, g, w in zip(TEXTS, got, want, strict=True) if g != w} == {}
    # the control tokens written in the text stay whole (a check that the strings exercise them)
    assert got[TEXTS.index("<|im_start|>user\nhi<|im_end|>\n<|endoftext|>")][0] == 1


def test_chat_ids_equal_transformers(ours, reference):
    got = ours.encode_chat_batch(CONVERSATIONS)
    want = [reference_chat_ids(reference, messages) for messages in CONVERSATIONS]
    assert got == want


def test_rendered_chat_equals_transformers(ours, reference):
    for messages in CONVERSATIONS:
        want = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert ours.render_chat(messages) == want
    # SmolLM2's template writes its default system prompt when the conversation has none
    assert "You are a helpful AI assistant" in ours.render_chat(CONVERSATIONS[0])
    assert "You are a helpful AI assistant" not in ours.render_chat(CONVERSATIONS[1])


@pytest.mark.parametrize("skip", [True, False])
def test_decode_equals_transformers(ours, reference, skip):
    rows = ours.encode_batch(TEXTS) + ours.encode_chat_batch(CONVERSATIONS)
    rows.append([0, 1, 2, 3, 16, 17, 49151])  # every control token of the vocabulary's head
    got = ours.decode_batch(rows, skip_special_tokens=skip)
    want = [reference.decode(row, skip_special_tokens=skip) for row in rows]
    assert got == want


def test_decode_round_trips_plain_text(ours):
    plain = [t for t in TEXTS if "<" not in t]
    assert ours.decode_batch(ours.encode_batch(plain)) == plain


def test_special_ids_and_sizes_equal_transformers(ours, reference, smollm_gguf):
    assert isinstance(ours, TextTokenizer)
    assert ours.source == str(smollm_gguf)
    assert ours.vocab_size == len(reference) == 49152
    assert ours.eos_token_ids == (reference.eos_token_id,) == (2,)
    assert ours.bos_token_id == reference.bos_token_id == 1
    assert ours.has_chat_template and ours.chat_template == reference.chat_template


def test_tokenizer_for_a_spec(smollm_gguf, ours):
    shipped = tokenizer_for(ModelSpec(preset="smollm2-135m"))
    assert shipped.source == str(smollm_gguf)
    assert shipped.encode_batch(TEXTS[:4]) == ours.encode_batch(TEXTS[:4])
    assert tokenizer_for(ModelSpec(preset="llama-tiny")) is None  # random weights: no text
    by_path = tokenizer_for(ModelSpec(preset=None, path=str(smollm_gguf)))
    assert by_path.encode_batch(TEXTS[:4]) == ours.encode_batch(TEXTS[:4])
