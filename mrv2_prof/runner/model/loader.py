"""Builds the model from a preset (random weights by seed), a local Hugging Face directory or a
GGUF file (a shipped model's, ``model.preset: smollm2-135m``, or ``model.path: x.gguf``).

Corresponds to MRV2's model loading step. The model is built on the ``meta`` device, so no memory
is spent on weights that are overwritten. A preset's weights are then allocated on the target
device in the target dtype and drawn there (no host copy, no float32 copy); checkpoint tensors
are read straight onto the device and assigned by name. Only local directories are read: there
are no hub downloads. The per-layer ops are a ``ModelKernels`` bundle (torch references or fused
Triton kernels); the merged QKV and gate/up weights are concatenated from the checkpoint's
tensors as they are loaded (``merged_linear.py``). A GGUF file's header is read and checked
first (``gguf_file.py``, ``gguf_model.py``), then each tensor's bytes are copied to the device and
dequantized there to the run's dtype (``gguf_dequant.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from mrv2_prof.input_file import InputError, check_regular_file, read_bytes
from mrv2_prof.runner.config import ConfigError, ModelSpec
from mrv2_prof.runner.model.args import CheckpointError, ModelArgs, check_sizes, token_ids_in
from mrv2_prof.runner.model.checkpoint_tensors import check_tensors
from mrv2_prof.runner.model.decoder import LlamaForCausalLM
from mrv2_prof.runner.model.gguf_dequant import dequantize
from mrv2_prof.runner.model.gguf_file import TensorInfo, read_header
from mrv2_prof.runner.model.gguf_model import checked_tensors, model_args, unpermute_qk
from mrv2_prof.runner.model.model_kernels import (
    TORCH_MODEL_KERNELS,
    Attend,
    ModelKernels,
    WriteKV,
)
from mrv2_prof.runner.model.presets import PRESETS
from mrv2_prof.runner.model.shipped import SHIPPED, require_shipped

__all__ = ["CheckpointError", "load_gguf", "load_model", "load_preset", "load_hf_checkpoint"]

INIT_STD = 0.02
MAX_CONFIG_BYTES = 16 << 20  # config.json, generation_config.json


def load_model(
    spec: ModelSpec,
    device: torch.device,
    dtype: torch.dtype,
    *,
    kernels: ModelKernels | None = None,
    write_kv: WriteKV | None = None,
    attend: Attend | None = None,
) -> tuple[LlamaForCausalLM, ModelArgs]:
    """The model described by ``spec`` on ``device`` in ``dtype``, in eval mode.

    ``kernels`` is the per-layer op bundle (the torch references when not given; the runner passes
    its kernel set's); ``write_kv``/``attend`` replace its attention ops.
    """
    kernels = (kernels or TORCH_MODEL_KERNELS).with_attention(write_kv, attend)
    if spec.preset in SHIPPED:
        model = load_gguf(require_shipped(spec.preset), device, dtype, kernels=kernels)
    elif spec.preset is not None:
        model = load_preset(spec.preset, spec.seed, device, dtype, kernels=kernels)
    elif is_gguf(spec.path):
        model = load_gguf(spec.path, device, dtype, kernels=kernels)
    else:
        model = load_hf_checkpoint(spec.path, device, dtype, kernels=kernels)
    return model.eval().requires_grad_(False), model.args


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
        return _checked_gguf(require_shipped(spec.preset))[0]
    if spec.preset is not None:
        if spec.preset not in PRESETS:
            name = repr(spec.preset)[:60]
            raise ConfigError(f"model.preset: {name} is not one of {preset_names()}")
        return PRESETS[spec.preset]
    if is_gguf(spec.path):
        return _checked_gguf(spec.path)[0]
    return _checked_checkpoint(Path(spec.path))[0]


def _checked_checkpoint(directory: Path) -> tuple[ModelArgs, list[Path]]:
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
    layers are alike), so the cost does not grow with a model's layer count."""
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


def load_preset(
    name: str,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    *,
    kernels: ModelKernels = TORCH_MODEL_KERNELS,
) -> LlamaForCausalLM:
    """A preset architecture with weights drawn deterministically from ``seed`` on ``device``."""
    if name not in PRESETS:
        raise ConfigError(f"model.preset: {name!r} is not one of {sorted(PRESETS)}")
    with torch.device("meta"):
        model = LlamaForCausalLM(PRESETS[name], kernels)
    model = model.to(dtype).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("norm.weight"):
                param.fill_(1.0)
            elif param_name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, INIT_STD, generator=generator)
    model.init_buffers()
    return model


def load_hf_checkpoint(
    path: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    *,
    kernels: ModelKernels = TORCH_MODEL_KERNELS,
) -> LlamaForCausalLM:
    """A Llama/Qwen2/Qwen3 model from ``config.json`` and every ``*.safetensors`` file in
    ``path``, read onto ``device``."""
    directory = Path(path)
    args, files = _checked_checkpoint(directory)
    with torch.device("meta"):
        model = LlamaForCausalLM(args, kernels)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    state = _read_tensors(directory, files, expected, dtype, device)
    model.load_state_dict(state, strict=True, assign=True)
    model.init_buffers()
    return model


def load_gguf(
    path: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    *,
    kernels: ModelKernels = TORCH_MODEL_KERNELS,
) -> LlamaForCausalLM:
    """A Llama/Qwen2/Qwen3 model from a GGUF file: its header checked, then every tensor's bytes
    read in file order, copied to ``device`` and dequantized there to ``dtype`` (a ``llama``
    file's q/k rows put back in Hugging Face's order)."""
    args, tensors = _checked_gguf(path)
    with torch.device("meta"):
        model = LlamaForCausalLM(args, kernels)
    state: dict[str, torch.Tensor] = {}
    try:
        with Path(path).open("rb") as f:
            for name, info in sorted(tensors.items(), key=lambda item: item[1].offset):
                raw = torch.empty(info.nbytes, dtype=torch.uint8)
                f.seek(info.offset)
                if f.readinto(raw.numpy()) != info.nbytes:
                    raise CheckpointError(f"{path}: tensor {info.name!r} is cut short")
                values = dequantize(raw.to(device), info.qtype, info.shape, dtype)
                state[name] = unpermute_qk(name, values, args)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None
    model.load_state_dict(state, strict=True, assign=True)
    model.init_buffers()
    return model


def _checked_gguf(path: str | Path) -> tuple[ModelArgs, dict[str, TensorInfo]]:
    """The model a GGUF file holds and its tensor for each state-dict name, all checked."""
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
    args = ModelArgs.from_hf_config(_read_json(config_path, "config"), str(config_path))
    generation_path = directory / "generation_config.json"
    if os.path.lexists(generation_path):  # read when present: a FIFO is refused, not skipped
        generation = _read_json(generation_path, "generation config")
        source, vocab = str(generation_path), args.vocab_size
        eos = token_ids_in(generation, "eos_token_id", vocab, source)
        bos = token_ids_in(generation, "bos_token_id", vocab, source)
        bos_id = bos[0] if bos else args.bos_token_id
        args = replace(args, eos_token_ids=eos or args.eos_token_ids, bos_token_id=bos_id)
    return args


def _read_json(path: Path, what: str) -> dict[str, Any]:
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


def _read_tensors(
    directory: Path,
    files: list[Path],
    expected: dict[str, tuple[int, ...]],
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Every expected tensor, shape-checked, on ``device`` and cast there; extra tensors (rotary
    buffers) are ignored."""
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if name not in expected or name in state:
                        continue
                    found = tuple(f.get_slice(name).get_shape())
                    if found != expected[name]:
                        raise CheckpointError(
                            f"{file}: tensor {name!r} has shape {list(found)}, "
                            f"expected {list(expected[name])}"
                        )
                    state[name] = f.get_tensor(name).to(dtype)
        except CheckpointError:
            raise
        except Exception as exc:
            message = " ".join(str(exc).split())
            raise CheckpointError(f"{file}: cannot read safetensors file ({message})") from None
    missing = [name for name in expected if name not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{directory}: tensor {missing[0]!r} is missing{more}")
    return state
