"""Each supported ``tokenizer.ggml.pre`` (the split before the merges) and the BOS/EOS flags,
on small GGUFs cut from the SmolLM2 vocabulary, against transformers' tokenizer of the same
file. Digit runs, contractions, letters after punctuation and line ends split differently under
GPT-2's, Llama 3's and Qwen 2's regexes, so a wrong regex changes the ids."""

from __future__ import annotations

import pytest
from gguf_files import LLAMA_CONFIG, small_vocabulary, write_gguf
from text_cases import CONVERSATIONS, TEXTS, reference_chat_ids, reference_tokenizer

from mrv2_prof.text import load_tokenizer
from mrv2_prof.text.gguf_metadata import read_gguf_metadata

SPLIT_TEXTS = TEXTS + [
    "12345678 1234567 123 4 56 1212 123123",
    "cafe\u0301 a\u0301a\u0301 \u00e1",  # decomposed and composed accents
    "fast castle past-AST",  # 'ast' is made a user-defined token below: matched whole
    "x.Hello,World!?(abc)\n\n\n  \n def",
]
USER_DEFINED_ID = 500  # 'ast'


@pytest.fixture(scope="module")
def small(smollm_gguf):
    meta = read_gguf_metadata(smollm_gguf, lambda key: key.startswith("tokenizer."))
    keys = small_vocabulary(meta, 3000)
    keys["tokenizer.chat_template"] = meta["tokenizer.chat_template"]
    return keys


CASES = [
    # pre, add_bos_token, add_eos_token
    ("llama-bpe", True, False),
    ("qwen2", False, True),
    ("gpt2", False, False),
    ("smollm", True, True),
    (None, False, False),  # no tokenizer.ggml.pre: llama.cpp's and transformers' default
    ("qwen35", False, False),
]


@pytest.mark.parametrize(("pre", "add_bos", "add_eos"), CASES)
def test_split_and_flags_equal_transformers(tmp_path, small, pre, add_bos, add_eos):
    keys = dict(small, **LLAMA_CONFIG)
    if pre is not None:
        keys["tokenizer.ggml.pre"] = pre
    types = list(keys["tokenizer.ggml.token_type"])
    types[USER_DEFINED_ID] = 4
    keys.update(
        {
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.padding_token_id": 2,
            "tokenizer.ggml.add_bos_token": add_bos,
            "tokenizer.ggml.add_eos_token": add_eos,
        }
    )
    path = write_gguf(tmp_path / f"{pre}.gguf", keys)
    ours, reference = load_tokenizer(path), reference_tokenizer(path)

    got = ours.encode_batch(SPLIT_TEXTS)
    want = [reference(text)["input_ids"] for text in SPLIT_TEXTS]
    assert {t: g for t, g, w in zip(SPLIT_TEXTS, got, want, strict=True) if g != w} == {}
    assert (got[0][0] == 1) == add_bos and (got[0][-1] == 2) == add_eos
    assert USER_DEFINED_ID in got[SPLIT_TEXTS.index("fast castle past-AST")]

    chats = ours.encode_chat_batch(CONVERSATIONS)
    assert chats == [reference_chat_ids(reference, m) for m in CONVERSATIONS]
    for skip in (True, False):
        assert ours.decode_batch(got, skip_special_tokens=skip) == [
            reference.decode(row, skip_special_tokens=skip) for row in got
        ]
    assert ours.vocab_size == len(reference) == len(small["tokenizer.ggml.tokens"])


def test_the_splits_differ(tmp_path, small):
    """Calibration: the regexes above do give different ids on these strings."""
    ids = {}
    for pre in ("gpt2", "llama-bpe", "qwen2", "qwen35"):
        keys = dict(small, **{"tokenizer.ggml.pre": pre})
        ids[pre] = load_tokenizer(write_gguf(tmp_path / f"{pre}.gguf", keys)).encode_batch(
            SPLIT_TEXTS
        )
    distinct = {repr(rows) for rows in ids.values()}
    assert len(distinct) == 4
