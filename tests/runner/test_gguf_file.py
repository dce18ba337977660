"""A GGUF file's header and the model it describes: the header as the ``gguf`` package's own
reader sees it, ``ModelArgs`` as the Hugging Face config the file was written from says, the
tensor names as the ``gguf`` package maps them; and every kind of bad file refused in one line
naming the file (and the tensor or key), before any tensor is loaded."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model.args import CheckpointError
from mrv2_prof.runner.model.checkpoint_args import (
    expected_tensors,
    model_args_for,
    read_model_args,
)
from mrv2_prof.runner.model.gguf_file import ArrayInfo, read_header
from mrv2_prof.runner.model.gguf_model import checked_tensors, gguf_name, model_args
from mrv2_prof.runner.model.loader import load_model
from tests.runner.gguf_checkpoint import metadata_value, patch, tensor_record
from tests.test_bad_input_cli import RUN, RUNNER, Case, check_case

Q = GGMLQuantizationType
MIXED = {  # a type of each kind the writer can make, on the llama fixture's tensors
    "token_embd.weight": Q.Q8_0,
    "output.weight": Q.Q4_1,
    "blk.0.attn_q.weight": Q.Q4_0,
    "blk.0.attn_k.weight": Q.Q5_0,
    "blk.0.ffn_up.weight": Q.Q5_1,
    "blk.1.ffn_down.weight": Q.F16,
    "blk.1.attn_v.weight": Q.BF16,
}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, Path]:
    """Hugging Face checkpoints of each architecture (llama untied, qwen2 tied, qwen3 with a
    head_dim that is not hidden / heads), made once for the module."""
    from test_qwen3 import make_qwen3_checkpoint

    from tests.runner.gguf_checkpoint import hf_checkpoint_maker

    tmp = tmp_path_factory.mktemp("hf")
    make = hf_checkpoint_maker()
    return {
        "llama": make(tmp, "llama", False, 2),
        "qwen2": make(tmp, "qwen2", True, 2),
        "qwen3": make_qwen3_checkpoint(tmp / "qwen3", False, 2, True),
    }


@pytest.fixture
def llama_gguf(hf_dirs, tmp_path) -> Path:
    """A fresh llama GGUF (types MIXED) for a test to damage."""
    from tests.runner.gguf_checkpoint import write_gguf

    return write_gguf(hf_dirs["llama"], tmp_path / "llama.gguf", types=MIXED)


def gguf_path(hf_dirs, tmp_path, arch="llama", **kwargs) -> Path:
    from tests.runner.gguf_checkpoint import write_gguf

    return write_gguf(hf_dirs[arch], tmp_path / f"{arch}.gguf", **kwargs)


def refused(path: Path) -> str:
    """The one-line error for ``path``, from the preflight check and from the loader alike."""
    with pytest.raises(CheckpointError) as preflight:
        model_args_for(ModelSpec(preset=None, path=str(path)))
    with pytest.raises(CheckpointError) as load:
        load_model(ModelSpec(preset=None, path=str(path)), torch.device("cpu"), torch.float32)
    message = str(preflight.value)
    assert str(load.value) == message
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message


def test_header_equals_the_gguf_packages_reader(llama_gguf):
    header = read_header(llama_gguf)
    reader = gguf.GGUFReader(llama_gguf)
    assert list(header.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        info = header.tensors[t.name]
        assert info.qtype == t.tensor_type and info.shape == tuple(reversed(t.shape.tolist()))
        assert (info.offset, info.nbytes) == (t.data_offset, t.n_bytes)
        data = np.fromfile(llama_gguf, np.uint8, info.nbytes, offset=info.offset)
        assert np.array_equal(data, t.data.reshape(-1).view(np.uint8))
    assert [k for k in header.metadata] == [k for k in reader.fields if not k.startswith("GGUF.")]
    for key, value in header.metadata.items():
        assert value == reader.fields[key].contents(), key


def test_shipped_header_equals_the_gguf_packages_reader():
    from mrv2_prof.runner.model.shipped import require_shipped

    path = require_shipped("smollm2-135m")
    header = read_header(path)
    reader = gguf.GGUFReader(path)
    assert [(t.name, t.data_offset, t.n_bytes, int(t.tensor_type)) for t in reader.tensors] == [
        (t.name, t.offset, t.nbytes, t.qtype) for t in header.tensors.values()
    ]
    tokens = header.metadata["tokenizer.ggml.tokens"]
    assert tokens == ArrayInfo(
        gguf.GGUFValueType.STRING, len(reader.fields["tokenizer.ggml.tokens"].data)
    )
    assert (
        header.metadata["tokenizer.chat_template"]
        == reader.fields["tokenizer.chat_template"].contents()
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_model_args_equal_the_hf_configs(hf_dirs, tmp_path, arch):
    path = gguf_path(hf_dirs, tmp_path, arch)
    args = model_args_for(ModelSpec(preset=None, path=str(path)))
    expected = read_model_args(hf_dirs[arch])
    # GGUF stores the epsilon as float32
    assert args.rms_norm_eps == pytest.approx(expected.rms_norm_eps, rel=1e-7)
    assert replace(args, rms_norm_eps=expected.rms_norm_eps) == expected
    assert args.tie_word_embeddings == (arch == "qwen2")
    assert args.attention_bias == (arch != "llama")


def test_vocabulary_from_the_token_list(hf_dirs, tmp_path):
    path = gguf_path(hf_dirs, tmp_path, token_list=True)
    assert "llama.vocab_size" not in read_header(path).metadata
    assert model_args_for(ModelSpec(preset=None, path=str(path))).vocab_size == 256


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tensor_names_are_the_gguf_packages(hf_dirs, arch):
    arches = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}
    args = read_model_args(hf_dirs[arch])
    names = gguf.get_tensor_name_map(arches.get(arch, gguf.MODEL_ARCH.QWEN3), 2)
    for hf_name in expected_tensors(replace(args, tie_word_embeddings=False)):
        base, suffix = hf_name.rsplit(".", 1)
        assert gguf_name(hf_name) == f"{names.get_name(base)}.{suffix}"


def test_checked_tensors_names_the_mixed_types(llama_gguf):
    header = read_header(llama_gguf)
    found = checked_tensors(header, expected_tensors(model_args(header)))
    types = {info.name: info.qtype for info in found.values()}
    assert all(types[name] == qtype for name, qtype in MIXED.items())
    assert types["blk.1.attn_norm.weight"] == Q.F32


# --- bad files --------------------------------------------------------------------------------


def test_empty_and_foreign_files(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert "0 bytes, shorter than a GGUF header" in refused(empty)
    foreign = tmp_path / "model.gguf"
    foreign.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}" + bytes(64))
    assert "not a valid GGUF file (magic" in refused(foreign)
    missing = tmp_path / "none.gguf"
    assert refused(missing) == f"{missing}: GGUF file does not exist"


@pytest.mark.parametrize("keep", [0.5, 0.99, 1200])
def test_truncated(llama_gguf, keep):
    size = llama_gguf.stat().st_size
    with llama_gguf.open("r+b") as f:
        f.truncate(int(size * keep) if keep < 1 else keep)
    message = refused(llama_gguf)
    assert "not a valid GGUF file" in message
    assert "past the end" in message or "truncated" in message


def test_lying_counts(llama_gguf):
    header = read_header(llama_gguf)
    tensors, keys = len(header.tensors), len(header.metadata)
    patch(llama_gguf, 8, "Q", 10**15)  # tensor_count
    assert "tensor_count 1,000,000,000,000,000 cannot fit in" in refused(llama_gguf)
    patch(llama_gguf, 8, "Q", tensors + 1)  # the padding and data read as one more record
    assert "not a valid GGUF file" in refused(llama_gguf)
    patch(llama_gguf, 8, "Q", tensors)
    patch(llama_gguf, 16, "Q", keys + 1)  # the first tensor record read as a key
    assert "not a valid GGUF file" in refused(llama_gguf)
    patch(llama_gguf, 16, "Q", 2**40)
    assert "kv_count 1,099,511,627,776 cannot fit in" in refused(llama_gguf)


def test_lying_offsets(llama_gguf, tmp_path):
    record = tensor_record(llama_gguf, "blk.0.ffn_down.weight")
    size = llama_gguf.stat().st_size
    patch(llama_gguf, record["offset"], "Q", size)
    assert "tensor 'blk.0.ffn_down.weight' lies past the end of the file" in refused(llama_gguf)
    patch(llama_gguf, record["offset"], "Q", 7)
    assert "tensor 'blk.0.ffn_down.weight' has offset 7, not a multiple of 32" in refused(
        llama_gguf
    )
    patch(llama_gguf, record["offset"], "Q", 0)  # where the first tensor lies
    assert "overlap" in refused(llama_gguf)


def test_unknown_architecture(llama_gguf):
    patch(llama_gguf, metadata_value(llama_gguf, "general.architecture") + 8, "5s", b"gpt2x")
    message = refused(llama_gguf)
    assert message.endswith(
        "key 'general.architecture' is 'gpt2x', not a supported architecture "
        "(supported: llama, qwen2, qwen3)"
    )


def test_unsupported_quantisation(llama_gguf):
    # IQ4_NL has Q4_0's block geometry (32 values in 18 bytes), so only the type is wrong
    patch(llama_gguf, tensor_record(llama_gguf, "blk.0.attn_q.weight")["type"], "I", 20)
    message = refused(llama_gguf)
    assert message.endswith(
        "tensor 'blk.0.attn_q.weight': type IQ4_NL is not supported (supported: F32, F16, "
        "BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"
    )
    patch(llama_gguf, tensor_record(llama_gguf, "blk.0.attn_q.weight")["type"], "I", 12)
    assert "has shape [64, 64] in type Q4_K" in refused(llama_gguf)  # rows of 64 < 256


def test_missing_tensor_and_wrong_shape(hf_dirs, tmp_path):
    path = gguf_path(hf_dirs, tmp_path, drop=("blk.1.ffn_down.weight", "output_norm.weight"))
    assert refused(path).endswith("tensor 'blk.1.ffn_down.weight' is missing (and 1 more)")
    path = gguf_path(hf_dirs, tmp_path)
    patch(path, tensor_record(path, "blk.0.attn_norm.weight")["dims"], "Q", 32)
    assert refused(path).endswith("tensor 'blk.0.attn_norm.weight' has shape [32], expected [64]")


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"llama.block_count": None}, "key 'llama.block_count' is missing"),
        ({"llama.block_count": 10**6}, "key 'llama.block_count' is 1,000,000, more layers than"),
        ({"llama.rope.scaling.type": "linear"}, "key 'llama.rope.scaling.type' = 'linear'"),
        ({"llama.rope.scaling.factor": 4.0}, "key 'llama.rope.scaling.factor' = 4.0"),
        ({"llama.expert_count": 8}, "key 'llama.expert_count' = 8 (mixture of experts)"),
        ({"llama.rope.dimension_count": 8}, "'llama.rope.dimension_count' != head dim 16"),
        ({"llama.attention.head_count_kv": 3}, "head_count 4 is not a multiple of head_count_kv"),
        ({"tokenizer.ggml.eos_token_id": 256}, "'tokenizer.ggml.eos_token_id' must be a token"),
        ({"llama.context_length": 0.5}, "key 'llama.context_length' must be an integer >= 1"),
        ({"llama.vocab_size": None}, "key 'llama.vocab_size' is missing"),
    ],
)
def test_metadata_it_cannot_represent(hf_dirs, tmp_path, edit, expected):
    message = refused(gguf_path(hf_dirs, tmp_path, metadata=edit))
    assert expected in message, message


def test_rope_frequency_factors_are_refused(hf_dirs, tmp_path):
    rope_freqs = {"rope_freqs.weight": np.ones(8, dtype=np.float32)}
    message = refused(gguf_path(hf_dirs, tmp_path, extra_tensors=rope_freqs))
    assert "tensor 'rope_freqs.weight' (per-dimension RoPE frequency factors" in message


def test_unknown_value_type(llama_gguf):
    patch(llama_gguf, metadata_value(llama_gguf, "llama.block_count") - 4, "I", 99)
    assert "key 'llama.block_count' has an unknown value type 99" in refused(llama_gguf)


def test_damaged_headers_are_one_line_or_valid(llama_gguf, tmp_path):
    """Bytes of the header overwritten at random (seeded): each file either reads as a valid
    model or is refused in one line naming it; nothing else escapes."""
    data = bytearray(llama_gguf.read_bytes())
    header_end = min(t.offset for t in read_header(llama_gguf).tensors.values())
    rng = random.Random(0)
    damaged = tmp_path / "damaged.gguf"
    outcomes = {"valid": 0, "refused": 0}
    for _ in range(300):
        copy = bytearray(data)
        for _ in range(rng.choice([1, 2, 8])):
            copy[rng.randrange(header_end)] = rng.randrange(256)
        damaged.write_bytes(copy)
        try:
            model_args_for(ModelSpec(preset=None, path=str(damaged)))
            outcomes["valid"] += 1
        except CheckpointError as exc:
            assert str(exc).startswith(f"{damaged}: ") and "\n" not in str(exc)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100 and outcomes["valid"] > 0, outcomes


def test_the_cli_refuses_a_bad_gguf_before_the_run(
    make_hf_checkpoint, make_gguf_checkpoint, tmp_path, base_db
):
    hf = make_hf_checkpoint(tmp_path / "src", "llama")
    path = make_gguf_checkpoint(hf, "m", drop=("blk.0.ffn_up.weight",))
    case = Case(RUN, [f"{path}: tensor 'blk.0.ffn_up.weight' is missing"],
                {"s.yaml": f"name: g\nmodel: {{path: {path}}}\n" + RUNNER})  # fmt: skip
    check_case(case, tmp_path, base_db)
