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

from pathlib import Path

import torch
from safetensors import safe_open

from mrv2_prof.runner.config import ConfigError, ModelSpec
from mrv2_prof.runner.model.args import CheckpointError, ModelArgs
from mrv2_prof.runner.model.checkpoint_args import checked_checkpoint, checked_gguf, is_gguf
from mrv2_prof.runner.model.decoder import LlamaForCausalLM
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
    # Module.to_empty, but by torch.empty: its empty_like on the meta device loads sympy (0.7 s)
    model = model.to(dtype)._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
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
    args, files = checked_checkpoint(directory)
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
    # here, not at the top: the ``gguf`` package's import (~0.1 s) only for a GGUF's run
    from mrv2_prof.runner.model.gguf_dequant import dequantize
    from mrv2_prof.runner.model.gguf_model import unpermute_qk

    args, tensors = checked_gguf(path)
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
