"""The Triton bundle's decode paths, chosen by the runner's settings: the batch-1 projections
(``runner.decode_gemv``), the projections of 2-256 rows (``runner.decode_gemm``), programmatic
dependent launch (``runner.pdl``) and RoPE folded into decode attention
(``runner.rope_in_attention``).

Each is a switch the model's kernel modules read at every call (``projections_triton``'s
``DECODE_GEMV`` and ``DECODE_GEMM``, ``pdl.LAUNCH_PDL``, ``attention_decode_rope_triton``'s
``ROPE_IN_DECODE_ATTENTION``), so ``apply_kernel_paths`` sets them from the config when a runner
is built, before its warm-up and graph capture, and the as-run scenario records what the run
used. They are process-wide: the runner built last sets them (one engine runs at a time).

``kernel_path_notes``: a path the run cannot take, one note each (``strict`` refuses it): any
of them with the torch kernels (the model's torch ops have none of them), and PDL without a
GPU of compute capability 9.0 or more (the kernels then launch as ever).
"""

from __future__ import annotations

import dataclasses

import torch

from mrv2_prof.runner.config import RunnerConfig

PATHS = ("decode_gemv", "decode_gemm", "pdl", "rope_in_attention")
DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunnerConfig) if f.name in PATHS}


def chosen(config: RunnerConfig) -> dict[str, object]:
    """The config's four paths, by setting name."""
    return {name: getattr(config, name) for name in PATHS}


def _yaml(value: object) -> str:
    """A setting's value as a scenario spells it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def kernel_path_notes(config: RunnerConfig, kernels: str, is_cuda: bool) -> list[str]:
    """The paths of ``config`` this run cannot take with ``kernels`` on its device."""
    changed = [f"{k}: {_yaml(v)}" for k, v in chosen(config).items() if v != DEFAULTS[k]]
    if changed and kernels != "triton":
        return [
            f"runner.{changed[0].split(':')[0]}: the decode paths ({', '.join(changed)}) are the "
            "Triton kernels'; the torch ops run"
        ]
    if config.pdl and is_cuda and torch.cuda.get_device_capability()[0] < 9:
        major, minor = torch.cuda.get_device_capability()
        return [
            f"runner.pdl: programmatic dependent launch needs compute capability 9.0 or more, "
            f"this GPU has {major}.{minor}; the kernels launch as ever"
        ]
    if config.pdl and not is_cuda:
        return ["runner.pdl: programmatic dependent launch needs a CUDA device; not used"]
    return []


def apply_kernel_paths(config: RunnerConfig, kernels: str) -> None:
    """Set the model kernel modules' switches to the config's paths (Triton bundle only)."""
    if kernels != "triton":
        return
    from mrv2_prof.runner.model import attention_decode_rope_triton, pdl, projections_triton

    projections_triton.DECODE_GEMV = config.decode_gemv
    projections_triton.DECODE_GEMM = config.decode_gemm
    pdl.LAUNCH_PDL = config.pdl
    attention_decode_rope_triton.ROPE_IN_DECODE_ATTENTION = config.rope_in_attention
