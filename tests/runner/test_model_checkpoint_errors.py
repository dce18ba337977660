"""Loader errors: a broken checkpoint (config, architecture, RoPE type, missing or misshapen
tensors) or a missing directory is one line naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from mrv2_prof.runner.model.loader import CheckpointError
from tests.runner.decoder_forward import load


def _edit_config(path: Path, **fields) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **fields}))


def _edit_tensors(path: Path, drop: str | None = None, reshape: str | None = None) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = tensors[reshape][:32].clone()
    save_file(tensors, file, metadata={"format": "pt"})


CHECKPOINT_ERRORS = {
    "missing-config": (
        lambda p: (p / "config.json").unlink(),
        ["config.json", "missing"],
    ),
    "invalid-json": (
        lambda p: (p / "config.json").write_text("{not json"),
        ["config.json", "invalid JSON"],
    ),
    "architecture": (
        lambda p: _edit_config(p, architectures=["MistralForCausalLM"]),
        ["config.json", "MistralForCausalLM", "LlamaForCausalLM, Qwen2ForCausalLM"],
    ),
    "rope-type": (
        lambda p: _edit_config(p, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
        ["config.json", "rope_parameters.rope_type", "yarn"],
    ),
    "no-safetensors": (
        lambda p: (p / "model.safetensors").unlink(),
        ["no *.safetensors"],
    ),
    "missing-tensor": (
        lambda p: _edit_tensors(p, drop="model.layers.1.mlp.up_proj.weight"),
        ["'model.layers.1.mlp.up_proj.weight' is missing"],
    ),
    "missing-lm-head": (
        lambda p: _edit_tensors(p, drop="lm_head.weight"),
        ["'lm_head.weight' is missing"],
    ),
    "shape": (
        lambda p: _edit_tensors(p, reshape="model.norm.weight"),
        ["model.safetensors", "'model.norm.weight'", "[32]", "expected [64]"],
    ),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_ERRORS))
def test_checkpoint_errors_name_the_file_and_field(make_hf_checkpoint, tmp_path, case):
    path = make_hf_checkpoint(tmp_path, "llama")
    break_it, expected = CHECKPOINT_ERRORS[case]
    break_it(path)
    with pytest.raises(CheckpointError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    for part in expected:
        assert part in message


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as info:
        load(tmp_path / "meta-llama/Llama-3.2-1B")
    assert str(tmp_path / "meta-llama/Llama-3.2-1B") in str(info.value)
