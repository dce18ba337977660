"""The architecture a model spec names, read and checked without loading any weights: a preset's
``ModelArgs``, a Hugging Face directory's ``config.json`` (with ``generation_config.json``) and its
safetensors headers, a GGUF file's header. The checks before a run and the loader share it.

Torch loads only where a checkpoint's tensors are checked (``expected_tensors`` builds a one-layer
model on ``meta``): a run of a preset checks its scenario in the CLI's process without torch,
which only the runner process needs.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mrv2_prof.inputs.input_file import InputError, check_regular_file, read_bytes
from mrv2_prof.runner.config import ConfigError, ModelSpec
from mrv2_prof.runner.model.args import CheckpointError, ModelArgs, check_sizes, token_ids_in
from mrv2_prof.runner.model.checkpoint_tensors import check_tensors
from mrv2_prof.runner.model.presets import PRESETS
from mrv2_prof.runner.model.shipped import SHIPPED, require_shipped

if TYPE_CHECKING:
    from mrv2_prof.runner.model.gguf_file import TensorInfo

MAX_CONFIG_BYTES = 16 << 20  # config.json, generation_config.json


def preset_names() -> list[str]:
    """Every name ``model.preset`` takes: the random-weight presets, then the shipped models."""
    return sorted(PRESETS) + sorted(SHIPPED)


def is_gguf(path: str | Path) -> bool:
    """Whether ``model.path`` names a GGUF file (``*.gguf``, or anything but a directory: a
    FIFO or a device there is refused as the GGUF file it would be)."""
    p = Path(path)
    return p.suffix.lower() == ".gguf" or (os.path.lexists(p) and not p.is_dir())


def model_args_for(spec: ModelSpec) -> ModelArgs:
    """The architecture ``spec`` names, read without loading weights (for checks before a run):
    a checkpoint's config and tensor headers are checked as the loader will read them."""
    if spec.preset in SHIPPED:
        return checked_gguf(require_shipped(spec.preset))[0]
    if spec.preset is not None:
        if spec.preset not in PRESETS:
            name = repr(spec.preset)[:60]
            raise ConfigError(f"model.preset: {name} is not one of {preset_names()}")
        return PRESETS[spec.preset]
    if is_gguf(spec.path):
        return checked_gguf(spec.path)[0]
    return checked_checkpoint(Path(spec.path))[0]


def checked_checkpoint(directory: Path) -> tuple[ModelArgs, list[Path]]:
    """The model a Hugging Face directory holds and its ``*.safetensors`` files, the config and
    every file's header checked (a regular file each, never opened if not)."""
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: checkpoint directory does not exist")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors files")
    args = read_model_args(directory)
    check_tensors(directory, files, expected_tensors(args), args.num_hidden_layers)
    return args, files


_LAYER0 = "model.layers.0."


def expected_tensors(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """The checkpoint tensors (name -> shape) a model of ``args`` loads, in state-dict order:
    a one-layer model built on ``meta``, its layer's tensors repeated for every layer (the
    layers are alike), so the cost does not grow with a model's layer count. Builds a model, so
    torch loads here (only when a checkpoint is checked)."""
    import torch

    from mrv2_prof.runner.model.decoder import LlamaForCausalLM
    from mrv2_prof.runner.model.model_kernels import TORCH_MODEL_KERNELS

    with torch.device("meta"):
        model = LlamaForCausalLM(replace(args, num_hidden_layers=1), TORCH_MODEL_KERNELS)
    before: dict[str, tuple[int, ...]] = {}
    layer: dict[str, tuple[int, ...]] = {}
    after: dict[str, tuple[int, ...]] = {}
    for name, t in model.state_dict().items():
        if name.startswith(_LAYER0):
            layer[name.removeprefix(_LAYER0)] = tuple(t.shape)
        else:
            (after if layer else before)[name] = tuple(t.shape)
    out = before
    for i in range(args.num_hidden_layers):
        out.update((f"model.layers.{i}.{suffix}", shape) for suffix, shape in layer.items())
    out.update(after)
    return out


def checked_gguf(path: str | Path) -> tuple[ModelArgs, dict[str, TensorInfo]]:
    """The model a GGUF file holds and its tensor for each state-dict name, all checked (the
    tensor checks need torch's dtypes, loaded here)."""
    from mrv2_prof.runner.model.gguf_file import read_header
    from mrv2_prof.runner.model.gguf_model import checked_tensors, model_args

    if os.path.lexists(path):  # a FIFO or a device: named, never opened
        _regular(Path(path), "GGUF file")
    header = read_header(path)
    args = model_args(header)
    check_sizes(args, str(path))
    return args, checked_tensors(header, expected_tensors(args))


def _regular(path: Path, what: str) -> None:
    try:
        check_regular_file(path, what)
    except InputError as exc:
        raise CheckpointError(str(exc)) from None


def read_model_args(directory: Path) -> ModelArgs:
    """``ModelArgs`` from ``config.json``, with eos ids from ``generation_config.json`` if any."""
    config_path = directory / "config.json"
    if not os.path.lexists(config_path):
        raise CheckpointError(f"{config_path}: config.json is missing")
    args = ModelArgs.from_hf_config(read_json(config_path, "config"), str(config_path))
    generation_path = directory / "generation_config.json"
    if os.path.lexists(generation_path):  # read when present: a FIFO is refused, not skipped
        generation = read_json(generation_path, "generation config")
        source, vocab = str(generation_path), args.vocab_size
        eos = token_ids_in(generation, "eos_token_id", vocab, source)
        bos = token_ids_in(generation, "bos_token_id", vocab, source)
        bos_id = bos[0] if bos else args.bos_token_id
        args = replace(args, eos_token_ids=eos or args.eos_token_ids, bos_token_id=bos_id)
    return args


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A checkpoint's small JSON file: a regular file (never a FIFO or a device, which are
    refused before they are opened) of at most ``MAX_CONFIG_BYTES``."""
    try:
        raw = read_bytes(path, f"checkpoint's {what}", MAX_CONFIG_BYTES)
    except InputError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        message = " ".join(str(exc).split())[:200]
        raise CheckpointError(f"{path}: invalid JSON ({message})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
