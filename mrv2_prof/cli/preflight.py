"""What ``run`` checks of each scenario before anything is written: the probes this machine can
record (under ``strict``), the bounds that come from the model (``max_position_embeddings``, the
vocabulary), the checkpoint's config and tensor headers, the memory the weights, the KV cache
and the request state will take against what is free, and the whole workload.

Every problem is a one-line ``ConfigError``, ``CheckpointError`` or ``ScenarioError``; the CLI
prints it and exits 2 before a run row exists. Checked in this process, which never creates a
CUDA context and (unless ``strict`` or tensor parallelism needs it) never imports torch: whether
CUDA has a device and the GPU's free memory come from NVML (``inputs/cuda_devices.py``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from mrv2_prof.inputs.cuda_devices import cuda_driver_present, visible_cuda_devices
from mrv2_prof.inputs.memory_budget import shortfall
from mrv2_prof.runner.model.args import weight_count
from mrv2_prof.scenario import Scenario, ScenarioError

if TYPE_CHECKING:
    from mrv2_prof.runner.config import RunnerConfig
    from mrv2_prof.runner.model.args import ModelArgs

NSYS_SESSION_ENV = "NSYS_PROFILING_SESSION_ID"  # set in processes Nsight Systems profiles
_ITEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_INDEX_BYTES = 4  # int32 block ids and prompt token ids of the request state


def _on_gpu(config: RunnerConfig) -> bool:
    """Whether the runner will run on CUDA (``auto`` picks it when a device is visible)."""
    from mrv2_prof.runner.config import NO_CUDA, invalid

    if config.device == "cpu":
        return False
    available = cuda_driver_present()
    if available:  # NVML and torch's build, not torch's 1-3 s of imports (cuda_devices.py)
        count = visible_cuda_devices()
        if count is None:  # what only torch can answer
            import torch

            available = torch.cuda.is_available()  # asks the driver; creates no CUDA context
        else:
            available = count > 0
    if config.device == "cuda" and not available:
        raise invalid("device", NO_CUDA)
    return available


def _probe_checks(scenario: Scenario, config: RunnerConfig) -> None:
    from mrv2_prof.probes.support import cpu_probe_notes, unavailable_probe_notes
    from mrv2_prof.runner.config import ConfigError

    if scenario.probes.kernel_trace and os.environ.get(NSYS_SESSION_ENV):
        raise ConfigError(
            "probes.kernel_trace: cannot run under Nsight Systems (CUPTI takes one subscriber); "
            "set probes.kernel_trace: false and use mrv2-prof nsys import for the kernels"
        )
    notes = unavailable_probe_notes(scenario.probes.model_dump())
    if scenario.runner.strict and not _on_gpu(config):
        notes += cpu_probe_notes(scenario.probes.model_dump())
    if notes and scenario.runner.strict:
        raise ConfigError(f"{notes[0]} (strict: true)")
    if config.strict:
        from mrv2_prof.runner.worker.switches import check_strict

        check_strict(config)


def _model_bounds(config: RunnerConfig, args: ModelArgs, on_gpu: bool) -> None:
    from mrv2_prof.runner.config import invalid

    world, spec = config.tensor_parallel_size, config.spec_decode.method
    if world > 1:  # the check sits beside the ranks' code, which loads torch
        from mrv2_prof.runner.parallel.tensor_parallel import tp_problem

        problem = tp_problem(world, args, on_gpu, spec)
        if problem is not None:
            raise invalid("tensor_parallel_size", problem)
    if config.spec_decode.method == "draft_model":  # the draft model against the target
        from mrv2_prof.runner.worker.spec_decode.draft_model import check_draft, draft_args_for

        check_draft(config.spec_decode, args, draft_args_for(config.spec_decode, args))
    if config.max_model_len > args.max_position_embeddings:
        raise invalid(
            "max_model_len",
            f"{config.max_model_len:,} exceeds the model's max_position_embeddings "
            f"{args.max_position_embeddings:,}",
        )


def memory_needs(
    config: RunnerConfig, args: ModelArgs, dtype: str, on_gpu: bool = True
) -> dict[str, tuple[str, int]]:
    """Bytes of what start-up allocates, by the field that sizes it: the weights, the KV cache
    (an explicit block count, or ``auto``'s on a CPU; on a GPU ``auto`` is sized from what is
    free) and the request state
    (a prompt row and a block-table row per slot, on the device and staged on the host)."""
    item = _ITEM_BYTES[dtype]
    weights = weight_count(args) * item
    per_block = 2 * config.block_size * args.num_key_value_heads * args.head_dim * item
    blocks = config.num_kv_blocks
    if blocks is None and not on_gpu:  # auto on a CPU: the blocks start-up will allocate
        blocks = config.cpu_auto_num_kv_blocks(per_block * args.num_hidden_layers)
    kv = (blocks or 0) * per_block * args.num_hidden_layers
    row = config.max_model_len + config.max_num_blocks_per_req
    state = 2 * config.max_num_reqs * row * _INDEX_BYTES
    needs = {
        "model": ("the weights", weights),
        "runner.num_kv_blocks": (f"the KV cache ({blocks or 0:,} blocks)", kv),
        "runner.max_num_reqs": (f"the request state ({config.max_num_reqs:,} slots)", state),
    }
    spec = config.spec_decode
    if spec.method == "draft_model":  # its weights (none of its own when self-drafting), cache
        from mrv2_prof.runner.worker.spec_decode.draft_model import draft_args_for

        draft = draft_args_for(spec, args)
        own = 0 if spec.draft_target_layers is not None else 1
        w = own * weight_count(draft) * item
        tokens = (config.max_num_reqs + 1) * config.max_num_blocks_per_req * config.block_size
        kv = tokens * 2 * draft.num_key_value_heads * draft.head_dim * item
        probs = (config.max_num_reqs + 1) * spec.max_k * draft.vocab_size * 4
        needs["runner.spec_decode.draft"] = (
            "the draft model (weights, KV cache, draft probabilities)",
            w + kv * draft.num_hidden_layers + probs,
        )
    return needs


def _memory(config: RunnerConfig, args: ModelArgs, dtype: str, on_gpu: bool) -> None:
    from mrv2_prof.runner.config import ConfigError

    needs = memory_needs(config, args, dtype, on_gpu)
    total = sum(n for _, n in needs.values())
    field, (what, _) = max(needs.items(), key=lambda item: item[1][1])
    others = " with the rest" if len(needs) > 1 else ""
    problem = shortfall(total, f"{what}{others}", on_device=on_gpu)
    if problem is not None:
        raise ConfigError(f"{field}: {problem}", field=None, problem=f"{field}: {problem}")


def preflight(scenario: Scenario) -> Scenario:
    """Every check of ``scenario`` that needs the model or the machine; raises on the first.
    Returns the scenario with ``runner.max_model_len: auto`` resolved to the model's own
    ``max_position_embeddings`` (what the runner will use, and what the run stores)."""
    from mrv2_prof.runner.config import ConfigError
    from mrv2_prof.runner.model.checkpoint_args import model_args_for
    from mrv2_prof.workload import build_workload, model_tokenizer

    config = scenario.runner_config()
    _probe_checks(scenario, config)
    spec = scenario.model_spec()
    from mrv2_prof.runner.model.shipped import SHIPPED

    if spec.preset in SHIPPED:  # a shipped real model: fetched on first use
        from mrv2_prof.cli.fetch import ensure_shipped

        ensure_shipped(spec.preset)
    args = model_args_for(spec)
    try:
        config = config.for_model(args.max_position_embeddings)
        on_gpu = _on_gpu(config)
        _model_bounds(config, args, on_gpu)
        _memory(config, args, spec.dtype or ("bfloat16" if on_gpu else "float32"), on_gpu)
    except ConfigError as exc:  # a setting of this scenario file: the error names it
        field = f"runner.{exc.field}" if exc.field else ""
        raise ScenarioError(scenario.source, field, exc.problem) from None
    build_workload(
        scenario.workload,
        seed=scenario.seed,
        vocab_size=args.vocab_size,
        max_model_len=config.max_model_len,
        source=scenario.source,
        tokenizer=model_tokenizer(spec, scenario.workload, scenario.source),
        model=spec,
    )
    if scenario.runner.max_model_len == config.max_model_len:
        return scenario
    runner = scenario.runner.model_copy(update={"max_model_len": config.max_model_len})
    return scenario.model_copy(update={"runner": runner})
