"""SentencePiece GGUFs (``tokenizer.ggml.model: llama``, as Llama 2 and Mistral files are) against
transformers' tokenizer of the same file: merges recovered from the scores (with ties), the
prepended ``▁``, byte fallback for characters outside the vocabulary, BOS by default, control and
user-defined tokens, decoding; and merges given by the file."""

from __future__ import annotations

import pytest
from gguf_files import LLAMA_CONFIG, sentencepiece_vocabulary, write_gguf
from text_cases import CONVERSATIONS, TEXTS, reference_chat_ids, reference_tokenizer

from mrv2_prof.text import load_tokenizer
from mrv2_prof.text.gguf_metadata import read_gguf_metadata
from mrv2_prof.text.sentencepiece_bpe import recovered_merges

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)
SP_TEXTS = TEXTS + ["<think>the</s>x<s>", "Hello World", " two  spaces", "\u2581already"]


@pytest.fixture(scope="module")
def smollm_meta(smollm_gguf):
    return read_gguf_metadata(smollm_gguf, lambda key: key.startswith("tokenizer."))


@pytest.mark.parametrize(
    ("case", "tie_every", "flags", "file_merges"),
    [
        ("bos_by_default", 5, {}, False),
        (
            "eos_not_bos",
            1,
            {"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True},
            False,
        ),
        ("merges_in_the_file", 3, {"tokenizer.ggml.add_bos_token": True}, True),
    ],
)
def test_sentencepiece_equals_transformers(
    tmp_path, smollm_meta, case, tie_every, flags, file_merges
):
    keys = {**sentencepiece_vocabulary(smollm_meta, 2500, tie_every), **LLAMA_CONFIG, **flags}
    keys["tokenizer.ggml.tokens"] = [*keys["tokenizer.ggml.tokens"], "<think>"]
    keys["tokenizer.ggml.scores"] = [*keys["tokenizer.ggml.scores"], 0.0]
    keys["tokenizer.ggml.token_type"] = [*keys["tokenizer.ggml.token_type"], 4]
    keys["tokenizer.chat_template"] = TEMPLATE
    if file_merges:  # some merges, in an order of their own: the file's are used as given
        tokens = set(keys["tokenizer.ggml.tokens"])
        keys["tokenizer.ggml.merges"] = [
            m.replace("\u0120", "\u2581")
            for m in smollm_meta["tokenizer.ggml.merges"][:3000]
            if set(m.replace("\u0120", "\u2581").split(" ")) <= tokens
            and m.replace("\u0120", "\u2581").replace(" ", "") in tokens
        ]
    path = write_gguf(tmp_path / f"{case}.gguf", keys)
    ours, reference = load_tokenizer(path), reference_tokenizer(path)

    got = ours.encode_batch(SP_TEXTS)
    want = [reference(text)["input_ids"] for text in SP_TEXTS]
    assert {t: g for t, g, w in zip(SP_TEXTS, got, want, strict=True) if g != w} == {}
    bos = flags.get("tokenizer.ggml.add_bos_token", True)
    assert (got[0][0] == 1) == bos and (got[0][-1] == 2) == (case == "eos_not_bos")
    assert ours.encode_chat_batch(CONVERSATIONS) == [
        reference_chat_ids(reference, m) for m in CONVERSATIONS
    ]
    for skip in (True, False):
        assert ours.decode_batch(got, skip_special_tokens=skip) == [
            reference.decode(row, skip_special_tokens=skip) for row in got
        ]
    assert ours.vocab_size == len(reference)
    assert ours.eos_token_ids == (2,) and ours.bos_token_id == 1


def test_recovered_merges_by_hand():
    """Best score first; ties go to the longer left part, then the longer right part, then keep
    the scores' order."""
    vocab = {t: i for i, t in enumerate(["a", "b", "c", "ab", "bc", "abc", "ca"])}
    scores = {"a": 0.0, "b": 0.0, "c": 0.0, "ab": -1.0, "bc": -1.0, "abc": -1.0, "ca": -3.0}
    want = [["ab", "c"], ["a", "bc"], ["a", "b"], ["b", "c"], ["c", "a"]]
    assert recovered_merges(vocab, scores) == want
    generate_merges = pytest.importorskip("transformers.tokenization_utils_base").generate_merges
    assert [list(m) for m in generate_merges(vocab, scores)] == want
