"""Which runner switches this build can honour with the kernels in use.

A switch that cannot be honoured is a visible note in ``RuntimeInfo`` (the run goes on without
it), or under ``strict`` a ``ConfigError`` naming it. ``check_strict`` asks the same questions
without building a runner, so the CLI can refuse a run before it writes anything. CUDA graphs
answer for themselves (``cudagraph_plan.plan_graphs``).
"""

from __future__ import annotations

import torch

from mrv2_prof.runner.config import ConfigError, RunnerConfig
from mrv2_prof.runner.worker.cudagraph_plan import plan_graphs
from mrv2_prof.runner.worker.kernel_paths import kernel_path_notes
from mrv2_prof.runner.worker.kernel_set import resolve_kernels


def unsupported_switches(
    config: RunnerConfig, kernels: str, kernels_note: str | None, is_cuda: bool = False
) -> list[str]:
    """The runner switches (besides CUDA graphs, see ``plan_graphs``) that cannot be honoured
    with the ``kernels`` in use; ``kernels_note`` says why those differ from the request."""
    unsupported = [kernels_note] if kernels_note else []
    unsupported += kernel_path_notes(config, kernels, is_cuda)
    # Only a Triton kernel can dereference pinned host memory; the torch ops cannot.
    if config.uva and kernels != "triton":
        unsupported.append(
            "runner.uva: needs the Triton kernels on a CUDA device; prompt tokens and "
            "sampling parameters are copied to the device"
        )
    spec = config.spec_decode
    if spec.enabled and config.async_scheduling and not config.drafts_on_device:
        why = "draft_on: host" if spec.draft_on == "host" else (
            "staged_writes: false re-sends the host's computed counts, which device drafts run "
            "ahead of"
        )  # fmt: skip
        unsupported.append(
            f"runner.spec_decode: drafts on the host ({why}): with async_scheduling a request "
            "whose tokens are in flight sits out the next step (the host drafts from its "
            "complete history), so speculating requests step every other step"
        )
    return unsupported


def check_strict(config: RunnerConfig) -> None:
    """What the runner would refuse under ``strict``, checked without building it (the CLI
    runs this before it writes anything)."""
    if not config.strict:
        return
    is_cuda = config.device != "cpu" and torch.cuda.is_available()
    kernels, note = resolve_kernels(config.kernels, is_cuda)
    unsupported = unsupported_switches(config, kernels.name, note, is_cuda)
    if unsupported:
        raise ConfigError(f"{unsupported[0]} (strict: true)")
    plan_graphs(config, kernels.name, is_cuda)
