"""The Triton bundle's decode paths, chosen by the runner's settings: the batch-1 projections
(``runner.decode_gemv``), the projections of 2-256 rows (``runner.decode_gemm``), programmatic
dependent launch (``runner.pdl``), RoPE folded into decode attention
(``runner.rope_in_attention``), split-KV decode attention (``runner.split_kv``) and the batch-1
MLP in one launch (``runner.fused_mlp``).

Each is a switch the model's kernel modules read at every call (``projections_triton``'s
``DECODE_GEMV`` and ``DECODE_GEMM``, ``pdl.LAUNCH_PDL``, ``attention_decode_rope_triton``'s
``ROPE_IN_DECODE_ATTENTION``, ``attention_split_kv_triton``'s ``SPLIT_KV_ENABLED``,
``projections_triton``'s ``FUSED_MLP``), so
``apply_kernel_paths`` sets them from the config when a runner is built, before its warm-up and
graph capture, and the as-run scenario records what the run used. They are process-wide: the
runner built last sets them (one engine runs at a time).

``pdl`` defaults to ``auto`` (None): on where the run can take it (``resolved_paths``: the
Triton kernels on a CUDA device of compute capability 9.0 or more), as the H200 measured it
faster at every preset and its GPU tests serve the same tokens and logprobs bit for bit
(benchmarks/RESULTS.md, "Closer to the limit"). ``rope_in_attention`` defaults to ``auto`` too
(on with the Triton kernels on a GPU): it measured 1-6 % faster, and its GPU tests (the kernel
against its torch reference at real sizes, the engine's tokens with and without it) passed.
``split_kv`` (a decode batch's keys over ``attention_split_kv_triton.split_count`` programs a
request where that policy splits: small batches under a long context bound, the RoPE fold
included) defaults to ``auto`` as well (on with the Triton kernels on a GPU): it measured 23-37 %
faster at context 2,000 (H200 and H100, benchmarks/RESULTS.md, "Closer to the limit, second
round") and the kernel alone 2-3x faster at context 1,000 and batch 1 (third round); at context
~160 under a 2,048 bound it costs 0.5-1.4 % on an H100 (the policy reads the bound, not the
batch's contexts, so that a CUDA graph fits every batch of its size). Its GPU tests pass, the
warmed engine's no-compile test on every shipped scenario included (the failure that kept it off
was the sampler's UVA gather compiling late, not split-KV).
``decode_gemv`` defaults to ``auto``: with the Triton kernels on a GPU, ``fused_onepass`` for a
model of at most ``one_pass_max_hidden`` hidden features, ``plain`` otherwise (and on the CPU).
In one invocation on an H200 (batch 1, PDL and the fold on) the one-pass fused GEMVs took
SmolLM2-135M (576 features) from 0.543 to 0.511 ms, were even on qwen3-0.6b (1,024: 0.851 against
0.854) and lost 4 % on llama-1b (2,048) and 10 % on llama-3-8b (4,096): with a narrow model the
step is launches, and the fused path has six a layer against nine. So the width is 768
(``ONE_PASS_MAX_HIDDEN``) on any GPU but one measured otherwise: on the H100 SXM ("H100 80GB
HBM3", ``ONE_PASS_WIDER``), in five invocations on three machines, they won at 576 (6-7 %),
1,024 (2-3 %) and 2,048 (3.6-6.8 %) and lost at 4,096 (2.6 %), so there it is 2,048. Its GPU
tests (SmolLM2's greedy tokens against the torch path and transformers, no compile after
warm-up) passed with every decode path on. ``decode_gemm`` defaults to ``auto``: ``narrow`` on a
GPU that takes PDL (by the device, not by ``pdl``, so that PDL on and off run the same kernels
and serve the same bits), ``cublas`` elsewhere. The Triton GEMM for every projection
(``triton``) lost at every batch. ``narrow`` keeps it to projections of at most 1,024 outputs and
2-64 rows (``projections_triton.NARROW_GEMM``), where under PDL it reads its first weight tile
while the kernel before it runs and cuBLAS fills few SMs: on an H100 (``decode_roofline.py``,
one invocation each) it took qwen3-0.6b's step (its o and down, 1,024 outputs) 2.5-5.5 %
shorter at batch 2-16, 5-7 % at 24-32 once those rows took the 64-row tile (the 32-row one had
lost 3.6-5 % there) and 4-6 % at 48-64, and SmolLM2-135M's (QKV, o and down) 6-9 % shorter at
batch 2-64; on llama-1b's 2,048-output o and down it was even at batch 2-8 and lost 6-10 % at
16-64, hence the width. With ``auto`` the default (and ``narrow`` then at 2-16 and 33-64 rows),
the whole GPU suite passed on an H100 (benchmarks/RESULTS.md, twenty-fourth round).
``fused_mlp: false`` is the default, and no ``auto`` takes it:
on an H100 (``decode_roofline.py --variant ...+mlp``, one invocation) it took SmolLM2-135M from
0.508-0.520 to 0.494-0.496 ms a step, but lost 5-7 % on qwen3-0.6b and 17-20 % on llama-1b (its
96-256 programs stream the weights at 43-63 % of the roof against the GEMVs' 62-91 %), and its
float32 atomics add in no fixed order, so two runs of one prompt may differ in the last bits
(and, at a near-tie, in a token), which the default paths do not. The order-free form (int64
fixed point) was measured too: 8.4 µs a layer against the two GEMVs' 7.2 on SmolLM2's shape,
slower than what it replaces (benchmarks/RESULTS.md, nineteenth round).

``kernel_path_notes``: a path asked for that the run cannot take, one note each (``strict``
refuses it): any of them with the torch kernels (the model's torch ops have none of them), and
PDL without a GPU of compute capability 9.0 or more (the kernels then launch as ever). An
``auto`` path the run cannot take is simply off, with no note.
"""

from __future__ import annotations

import torch

from mrv2_prof.runner.config import RunnerConfig

PATHS = ("decode_gemv", "decode_gemm", "pdl", "rope_in_attention", "split_kv", "fused_mlp")
ONE_PASS_MAX_HIDDEN = 768  # decode_gemv auto: fused_onepass up to this width (SmolLM2's 576)
ONE_PASS_WIDER = {"H100 80GB HBM3": 2048}  # ... or this, on a GPU of this name (measured there)
OFF = {
    "decode_gemv": "plain", "decode_gemm": "cublas", "pdl": False, "rope_in_attention": False,
    "split_kv": False, "fused_mlp": False,
}  # fmt: skip


def _pdl_capable(is_cuda: bool) -> bool:
    return is_cuda and torch.cuda.get_device_capability()[0] >= 9


def one_pass_max_hidden() -> int:
    """The widest model (hidden features) ``decode_gemv: auto`` gives the one-pass fused GEMVs
    on this process's CUDA device: ``ONE_PASS_WIDER`` by the device's name, else 768."""
    name = torch.cuda.get_device_name()
    return next((w for key, w in ONE_PASS_WIDER.items() if key in name), ONE_PASS_MAX_HIDDEN)


def resolved_paths(
    config: RunnerConfig, kernels: str, is_cuda: bool, hidden_size: int | None = None
) -> dict[str, object]:
    """The six paths this run takes, by setting name: ``auto`` (None, or ``decode_gemv``'s
    "auto", which reads the model's ``hidden_size``, unknown: plain; or ``decode_gemm``'s,
    ``narrow`` on a GPU that takes PDL, whether or not ``pdl`` is on) resolved, and every path
    off with the torch kernels (the model's torch ops have none of them)."""
    if kernels != "triton":
        return dict(OFF)
    paths = {name: getattr(config, name) for name in PATHS}
    if paths["decode_gemv"] == "auto":
        narrow = is_cuda and hidden_size is not None and hidden_size <= one_pass_max_hidden()
        paths["decode_gemv"] = "fused_onepass" if narrow else "plain"
    if paths["decode_gemm"] == "auto":  # by the device, not by runner.pdl: the same bits
        paths["decode_gemm"] = "narrow" if _pdl_capable(is_cuda) else "cublas"
    if paths["pdl"] is None:
        paths["pdl"] = _pdl_capable(is_cuda)
    elif paths["pdl"] and not _pdl_capable(is_cuda):
        paths["pdl"] = False  # a note says why (kernel_path_notes)
    for name in ("rope_in_attention", "split_kv"):
        if paths[name] is None:
            paths[name] = is_cuda
    if fused_mlp_unused(config) or fused_mlp_too_wide(config, paths["decode_gemv"], hidden_size):
        paths["fused_mlp"] = False  # a note says why (kernel_path_notes, fused_mlp_too_wide)
    return paths


def fused_mlp_unused(config: RunnerConfig) -> str | None:
    """Why ``fused_mlp: true`` cannot run with the rest of ``config``, or None: its MLP kernel
    follows the batch-1 o GEMV, and a tensor-parallel shard splits the MLP at an all-reduce."""
    if not config.fused_mlp:
        return None
    if config.decode_gemv == "off":
        return "the MLP in one launch follows the batch-1 GEMV, and runner.decode_gemv is off"
    if config.tensor_parallel_size > 1:
        return "a tensor-parallel shard splits the MLP at its all-reduce"
    return None


def fused_mlp_too_wide(
    config: RunnerConfig, decode_gemv: str, hidden_size: int | None
) -> str | None:
    """The note of a ``fused_mlp: true`` this model cannot take, or None: under a width-bound
    GEMV mode (``plain``, ``hybrid``) an o projection of more than ``PLAIN_MAX_FEATURES``
    outputs takes cuBLAS, and the MLP in one launch follows the o GEMV. Known only once the
    model is read (``decode_gemv`` resolved, ``hidden_size`` the model's), so the runner notes
    it after the load."""
    from mrv2_prof.runner.model.projections_triton import PLAIN_MAX_FEATURES, WIDTH_BOUND_MODES

    if not config.fused_mlp or hidden_size is None or fused_mlp_unused(config):
        return None
    if decode_gemv not in WIDTH_BOUND_MODES or hidden_size <= PLAIN_MAX_FEATURES:
        return None
    return (
        f"runner.fused_mlp: the o projection's {hidden_size:,} outputs take cuBLAS under "
        f"runner.decode_gemv: {decode_gemv} (its GEMV takes at most {PLAIN_MAX_FEATURES:,}), "
        "and the MLP in one launch follows the o GEMV; not used"
    )


def _yaml(value: object) -> str:
    """A setting's value as a scenario spells it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def kernel_path_notes(config: RunnerConfig, kernels: str, is_cuda: bool) -> list[str]:
    """The paths ``config`` asks for (not ``auto``) that this run cannot take with ``kernels``
    on its device."""
    asked = [
        f"{k}: {_yaml(v)}"
        for k in PATHS
        if (v := getattr(config, k)) is not None and v != "auto" and v != OFF[k]
    ]
    if asked and kernels != "triton":
        return [
            f"runner.{asked[0].split(':')[0]}: the decode paths ({', '.join(asked)}) are the "
            "Triton kernels'; the torch ops run"
        ]
    notes = []
    if config.pdl and is_cuda and not _pdl_capable(is_cuda):
        major, minor = torch.cuda.get_device_capability()
        notes.append(
            f"runner.pdl: programmatic dependent launch needs compute capability 9.0 or more, "
            f"this GPU has {major}.{minor}; the kernels launch as ever"
        )
    if config.pdl and not is_cuda:
        notes.append("runner.pdl: programmatic dependent launch needs a CUDA device; not used")
    if why := fused_mlp_unused(config):
        notes.append(f"runner.fused_mlp: {why}; not used")
    return notes


def apply_kernel_paths(paths: dict[str, object]) -> None:
    """Set the model kernel modules' switches to the run's paths (``resolved_paths``)."""
    from mrv2_prof.runner.model import (
        attention_decode_rope_triton,
        attention_split_kv_triton,
        pdl,
        projections_triton,
    )

    projections_triton.DECODE_GEMV = paths["decode_gemv"]
    gemm = paths["decode_gemm"]
    projections_triton.DECODE_GEMM = "cublas" if gemm == "cublas" else "triton"
    bounds = projections_triton.NARROW_GEMM if gemm == "narrow" else projections_triton.EVERY_GEMM
    projections_triton.GEMM_MAX_FEATURES, projections_triton.GEMM_ROWS = bounds
    pdl.LAUNCH_PDL = paths["pdl"]
    attention_decode_rope_triton.ROPE_IN_DECODE_ATTENTION = paths["rope_in_attention"]
    attention_split_kv_triton.SPLIT_KV_ENABLED = paths["split_kv"]
    projections_triton.FUSED_MLP = paths["fused_mlp"]
