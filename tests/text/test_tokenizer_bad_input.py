"""Bad tokenizer files are one ``TokenizerError`` line naming the file (and the key): GGUFs with
an unsupported tokenizer model or pre-tokenizer, without a tokenizer, with a bad special id or a
broken template; directories whose tokenizer.json or config is not JSON or not a tokenizer, or
whose template does not compile or fails when rendered."""

from __future__ import annotations

import concurrent.futures
import os

import pytest
from gguf_files import LLAMA_CONFIG, write_gguf

from mrv2_prof.text import TokenizerError, load_tokenizer
from mrv2_prof.text.byte_level_bpe import byte_alphabet

BYTES = list(byte_alphabet().values())  # a byte-level vocabulary of the 256 bytes, no merges
GOOD = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "gpt2",
    "tokenizer.ggml.tokens": [*BYTES, "he", "<|end|>"],
    "tokenizer.ggml.token_type": [1] * 257 + [3],
    "tokenizer.ggml.merges": ["h e"],
    "tokenizer.ggml.eos_token_id": 257,
    **LLAMA_CONFIG,
}


def _error(path) -> str:
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_good_small_gguf_loads(tmp_path):
    """Calibration: the files below differ from this one in the one key each names."""
    tokenizer = load_tokenizer(write_gguf(tmp_path / "good.gguf", GOOD))
    assert tokenizer.encode_batch(["he<|end|>h"]) == [[256, 257, BYTES.index("h")]]
    assert tokenizer.eos_token_ids == (257,) and not tokenizer.has_chat_template


@pytest.mark.parametrize(
    ("change", "key", "says"),
    [
        ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model", "'bert' not supported"),
        ({"tokenizer.ggml.model": "t5"}, "tokenizer.ggml.model", "'t5' not supported"),
        ({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.pre", "'gpt2' not supported for"),
        (
            {
                "tokenizer.ggml.model": "llama",
                "tokenizer.ggml.pre": "default",
                "general.architecture": "gemma",
            },
            "general.architecture",
            "'gemma' SentencePiece tokenizers not supported",
        ),
        (
            {
                "tokenizer.ggml.model": "llama",
                "tokenizer.ggml.pre": "default",
                "tokenizer.ggml.merges": None,
            },
            "tokenizer.ggml.scores",
            "missing",
        ),
        ({"tokenizer.ggml.pre": "starcoder"}, "tokenizer.ggml.pre", "'starcoder' not supported"),
        ({"tokenizer.ggml.eos_token_id": 9999}, "tokenizer.ggml.eos_token_id", "9999"),
        ({"tokenizer.ggml.add_bos_token": 1}, "tokenizer.ggml.add_bos_token", "not a bool"),
        ({"tokenizer.ggml.token_type": [1, 1]}, "tokenizer.ggml.token_type", "2 entries"),
        ({"tokenizer.ggml.merges": ["h e x"]}, "", "tokenizers library"),
        ({"tokenizer.chat_template": "{% for m in messages %}"}, "chat_template", "compile"),
    ],
)
def test_a_bad_gguf_is_one_line(tmp_path, change, key, says):
    path = write_gguf(tmp_path / "bad.gguf", {**GOOD, **change})
    message = _error(path)
    assert key in message and says in message


def test_a_gguf_without_a_tokenizer(tmp_path):
    path = write_gguf(tmp_path / "weights.gguf", LLAMA_CONFIG)
    assert "tokenizer.ggml.model is missing" in _error(path)


def test_missing_and_odd_paths(tmp_path):
    assert "no such file" in _error(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("hi")
    assert "neither a checkpoint directory nor a GGUF" in _error(tmp_path / "notes.txt")
    (tmp_path / "fake.gguf").write_text("hi")
    assert "not a GGUF file" in _error(tmp_path / "fake.gguf")


def test_a_gguf_is_known_by_its_magic(tmp_path):
    path = write_gguf(tmp_path / "model.bin", GOOD)
    assert load_tokenizer(path).eos_token_ids == (257,)


def test_an_unknown_preset_is_one_line():
    from mrv2_prof.runner.config import ModelSpec
    from mrv2_prof.text import tokenizer_for

    with pytest.raises(TokenizerError, match=r"^model.preset: 'no-such' is neither a preset"):
        tokenizer_for(ModelSpec(preset="no-such"))


@pytest.fixture
def checkpoint(tmp_path, saved_tokenizer_files):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    for name, data in saved_tokenizer_files.items():
        (directory / name).write_bytes(data)
    return directory


@pytest.fixture(scope="module")
def saved_tokenizer_files(tmp_path_factory, reference):
    directory = tmp_path_factory.mktemp("saved")
    reference.save_pretrained(directory)
    return {item.name: item.read_bytes() for item in directory.iterdir()}


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("tokenizer.json", '{"version": "1.0", "model": ', "not valid JSON (line 1"),
        ("tokenizer.json", '{"a": 1}', "tokenizers library"),
        ("tokenizer.json", "[1, 2]", "not a JSON object"),
        ("tokenizer_config.json", "{bos_token: 1}", "not valid JSON"),
        ("tokenizer_config.json", '{"bos_token": 5}', "bos_token"),
        ("chat_template.jinja", "{% if messages %}{{ messages[0]", "does not compile"),
    ],
)
def test_a_bad_directory_is_one_line(checkpoint, name, text, says):
    (checkpoint / name).write_text(text)
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(checkpoint)
    message = str(err.value)
    assert "\n" not in message and str(checkpoint / name) in message and says in message


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_tokenizer_file_that_is_not_a_regular_file_is_refused_not_skipped(checkpoint, name, kind):
    """A FIFO would block the read forever, and skipping it would load another tokenizer than
    the checkpoint's: both are one line naming the file, at once."""
    path = checkpoint / name
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    done = concurrent.futures.ThreadPoolExecutor(1).submit(load_tokenizer, checkpoint)
    with pytest.raises(TokenizerError) as err:
        done.result(timeout=20)  # a blocked open would hang here, not fail
    message = str(err.value)
    assert "\n" not in message and str(path) in message, message
    assert ("FIFO" in message) if kind == "fifo" else ("directory" in message), message


def test_a_template_failing_when_rendered_is_one_line(checkpoint):
    (checkpoint / "chat_template.jinja").write_text(
        "{% if messages[0].role != 'system' %}{{ raise_exception('needs a system turn') }}"
        "{% endif %}{{ messages[0].content }}"
    )
    tokenizer = load_tokenizer(checkpoint)
    assert tokenizer.render_chat([{"role": "system", "content": "ok"}]) == "ok"
    with pytest.raises(TokenizerError) as err:
        tokenizer.encode_chat_batch([[{"role": "user", "content": "hi"}]])
    assert str(err.value) == (
        f"{checkpoint / 'chat_template.jinja'}: chat_template failed: needs a system turn"
    )


def test_chat_without_a_template_is_one_line(checkpoint):
    (checkpoint / "chat_template.jinja").unlink()
    tokenizer = load_tokenizer(checkpoint)
    with pytest.raises(TokenizerError) as err:
        tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert str(err.value) == f"{checkpoint / 'tokenizer.json'}: the tokenizer has no chat_template"
