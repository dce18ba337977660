"""A checkpoint directory's tokenizer (``tokenizer.json``, ``tokenizer_config.json``, a
``chat_template.jinja``) against transformers' ``AutoTokenizer.from_pretrained`` of the same
directory: as saved by transformers, with the template in the config and the BOS/EOS flags
stated there (which transformers 5 ignores when there is a ``tokenizer.json``: the BOS is the
post-processor's business), and with a ``tokenizer.json`` whose own post-processor adds a BOS."""

from __future__ import annotations

import json
import warnings

import pytest
from text_cases import CONVERSATIONS, TEXTS, reference_chat_ids

from mrv2_prof.text import load_tokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, reference):
    directory = tmp_path_factory.mktemp("saved")
    reference.save_pretrained(directory)
    return directory


def _copy(saved, target):
    target.mkdir()
    for item in saved.iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    return target


def _config_template_and_flags(directory):
    """The template moved into tokenizer_config.json, BOS and EOS asked for there (ignored)."""
    template_file = directory / "chat_template.jinja"
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.update(chat_template=template_file.read_text(), add_bos_token=True, add_eos_token=True)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    template_file.unlink()


def _post_processor_with_bos(directory):
    """tokenizer.json's own post-processor puts the BOS first (as Llama 3's does); the config
    says nothing of it."""
    document = json.loads((directory / "tokenizer.json").read_text())
    document["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}
        },
    }
    (directory / "tokenizer.json").write_text(json.dumps(document))


@pytest.mark.parametrize(
    ("variant", "edit", "first", "last"),
    [
        ("as_saved", None, None, None),
        ("config_template_and_flags", _config_template_and_flags, None, None),
        ("post_processor_with_bos", _post_processor_with_bos, 1, None),
    ],
)
def test_directory_equals_transformers(saved, tmp_path, variant, edit, first, last):
    directory = _copy(saved, tmp_path / variant)
    if edit is not None:
        edit(directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    ours = load_tokenizer(directory)

    got = ours.encode_batch(TEXTS)
    assert got == [reference(text)["input_ids"] for text in TEXTS]
    assert (got[0][0] == 1) == (first == 1) and (got[0][-1] == 2) == (last == 2)
    assert ours.encode_chat_batch(CONVERSATIONS) == [
        reference_chat_ids(reference, messages) for messages in CONVERSATIONS
    ]
    for skip in (True, False):
        assert ours.decode_batch(got, skip_special_tokens=skip) == [
            reference.decode(row, skip_special_tokens=skip) for row in got
        ]
    assert ours.source == str(directory / "tokenizer.json")
    assert ours.vocab_size == len(reference)
    assert ours.eos_token_ids == (reference.eos_token_id,)
    assert ours.bos_token_id == reference.bos_token_id
    assert ours.has_chat_template


def test_named_templates_use_the_default(saved, tmp_path, ours):
    directory = _copy(saved, tmp_path / "named")
    _config_template_and_flags(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "TOOLS {{ messages | length }}"},
        {"name": "default", "template": config["chat_template"]},
    ]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(directory)
    assert tokenizer.render_chat(CONVERSATIONS[2]) == ours.render_chat(CONVERSATIONS[2])


def test_a_directory_without_tokenizer_json_has_no_tokenizer(saved, tmp_path):
    directory = _copy(saved, tmp_path / "weights_only")
    (directory / "tokenizer.json").unlink()
    assert load_tokenizer(directory) is None


def test_no_template_means_no_chat(saved, tmp_path):
    directory = _copy(saved, tmp_path / "plain")
    (directory / "chat_template.jinja").unlink()
    tokenizer = load_tokenizer(directory)
    assert not tokenizer.has_chat_template and tokenizer.encode_batch(["hi"]) == [[6004]]
