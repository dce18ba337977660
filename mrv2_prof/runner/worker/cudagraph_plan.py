"""The CUDA graph plan: what this runner will capture, for the scenario's request
(``runner.cudagraph_mode`` and ``cudagraph_capture_sizes``), its GPU and kernels.

``plan_graphs`` turns the request into FULL sizes (uniform decode batches, at most
``max_num_seqs`` requests), PIECEWISE sizes (token counts of any batch) and, with speculative
decoding, FULL verify shapes (batch size, 1 + k), with a visible note for each downgrade (an
error under ``strict``). Unset sizes are vLLM's ladder (``default_capture_sizes``) bounded by the
workload (``RunnerConfig.workload_*``, from the scenario): vLLM captures its whole ladder because
a server cannot know its traffic; a run knows its workload before start-up, and no step of it
reaches a size past the bound. The bound's note is not a downgrade. What the plan is captured
and dispatched by is ``cudagraph_manager.py``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from mrv2_prof.runner.config import ConfigError, RunnerConfig

FULL, PIECEWISE, NONE = "full", "piecewise", "none"


def default_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM's default: 1, 2, 4, then 8..248 by 8, then 256.. by 16, up to
    min(2 x max_num_seqs, 512, max_num_batched_tokens)."""
    limit = min(2 * max_num_seqs, 512, max_num_batched_tokens)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    return [s for s in sizes if s <= limit]


@dataclass(frozen=True)
class GraphPlan:
    """What will be captured: sizes per mode (ascending), and the notes of any downgrade."""

    requested: str
    full_sizes: tuple[int, ...] = ()
    piecewise_sizes: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    none_reason: str = "mode none requested"  # why nothing is captured, when nothing is
    # FULL verify graphs: (batch size, query length 1 + k), k > 0
    verify_shapes: tuple[tuple[int, int], ...] = ()
    # auto sizes the workload bounded: no list of sizes asks for them again (the scenario as run
    # keeps "auto", which bounds a re-run of the same workload alike)
    bounded_by_workload: bool = False
    # ``runner.piecewise_capture: first_use``: PIECEWISE sizes are captured by the first step that
    # needs each (``CudaGraphManager.capture_first_use``), not at start-up
    piecewise_on_first_use: bool = False


def plan_graphs(config: RunnerConfig, kernels: str, is_cuda: bool) -> GraphPlan:
    """The graphs this runner can capture for ``config``; each downgrade is a note, or with
    ``strict`` a ``ConfigError`` naming it. Auto sizes are vLLM's ladder bounded by the
    workload (``_bound_by_workload``), with a note that is not a downgrade."""
    requested = config.cudagraph_mode
    if requested == NONE:
        return GraphPlan(requested)
    if not is_cuda:
        return _downgrade(
            config, requested, (), (), "CUDA graphs need a CUDA device; running eagerly"
        )
    auto = config.cudagraph_capture_sizes is None
    sizes = (
        default_capture_sizes(config.max_num_seqs, config.max_num_batched_tokens)
        if auto
        else sorted(set(config.cudagraph_capture_sizes))
    )
    notes = []
    full: list[int] = []
    if requested in (FULL, "full_and_piecewise"):
        if kernels != "triton":
            notes.append(
                "runner.cudagraph_mode: full needs the Triton attention (the torch reference "
                "reads host-side lengths and cannot be captured); no FULL graphs"
            )
        else:
            full = [s for s in sizes if s <= config.max_num_seqs]
            too_big = [s for s in sizes if s > config.max_num_seqs]
            if too_big and not auto and requested == FULL:
                notes.append(
                    f"runner.cudagraph_capture_sizes: {too_big} exceed max_num_seqs "
                    f"{config.max_num_seqs}, no decode batch is that large; not captured"
                )
    piecewise = sizes if requested in (PIECEWISE, "full_and_piecewise") else []
    if not full and not piecewise:
        notes.append("runner.cudagraph_mode: nothing left to capture; running eagerly")
    if notes and config.strict:
        raise ConfigError(f"{notes[0]} (strict: true)")
    reason = notes[-1] if not full and not piecewise else "mode none requested"
    verify = _verify_shapes(config, full)
    note = None
    if auto:  # not a downgrade: every size left out is one no step of this workload reaches
        full, piecewise, note = _bound_by_workload(config, full, piecewise, len(verify))
        verify = _verify_shapes(config, full)
        notes += [note] if note else []
    first_use = bool(piecewise) and config.piecewise_capture != "startup"
    if first_use and config.tensor_parallel_size > 1:
        first_use = False  # the ranks capture together at start-up; a note only if asked for
    if config.piecewise_capture == "first_use" and piecewise and not first_use:
        notes.append(
            "runner.piecewise_capture: first_use needs one rank (the ranks would capture apart); "
            "PIECEWISE graphs captured at start-up"
        )
        if config.strict:
            raise ConfigError(f"{notes[-1]} (strict: true)")
    return GraphPlan(
        requested, tuple(full), tuple(piecewise), tuple(notes), reason, tuple(verify), bool(note),
        first_use,
    )  # fmt: skip


def _verify_shapes(config: RunnerConfig, full: list[int]) -> list[tuple[int, int]]:
    """The FULL verify shapes (batch size, 1 + k) of every k > 0 a step can choose."""
    ks = config.spec_decode.possible_ks(config.max_num_seqs)
    limit = config.max_num_batched_tokens
    return [(s, 1 + k) for k in ks if k > 0 for s in full if s * (1 + k) <= limit]


def _up_to(sizes: list[int], bound: int | None) -> list[int]:
    """``sizes`` (ascending) up to the smallest one >= ``bound``; all of them for None."""
    return sizes if bound is None else sizes[: bisect.bisect_left(sizes, bound) + 1]


def _bound_by_workload(
    config: RunnerConfig, full: list[int], piecewise: list[int], num_verify: int
) -> tuple[list[int], list[int], str | None]:
    """The auto sizes bounded by the workload (``RunnerConfig.workload_*``), and a note when
    that leaves keys out. vLLM captures its whole ladder because a server cannot know its
    traffic; a run knows its workload before start-up. No decode batch holds more requests than
    exist; no step schedules more tokens than its requests' prompts and outputs (a preempted
    request's recompute included) or, verifying, 1 + k slots each."""
    reqs, tokens = config.workload_max_reqs, config.workload_max_step_tokens
    if reqs is None:  # a count known only once the workload is built: the whole ladder
        return full, piecewise, None
    if tokens is not None:
        tokens = max(tokens, reqs * (1 + config.spec_decode.max_k))
    new_full, new_piecewise = _up_to(full, reqs), _up_to(piecewise, tokens)
    before = len(full) + len(piecewise) + num_verify
    after = len(new_full) + len(new_piecewise) + len(_verify_shapes(config, new_full))
    if after == before:
        return full, piecewise, None
    parts = []
    if new_full:
        why = f" ({reqs:,} request{'s' * (reqs != 1)})" if new_full != full else ""
        parts.append(f"FULL up to {new_full[-1]}{why}")
    if new_piecewise:
        why = f" (at most {tokens:,} tokens in a step)" if new_piecewise != piecewise else ""
        parts.append(f"PIECEWISE up to {new_piecewise[-1]}{why}")
    note = (
        f"runner.cudagraph_capture_sizes: auto, bounded by the workload: {', '.join(parts)}; "
        f"{after} keys instead of {before}"
    )
    return new_full, new_piecewise, note


def _downgrade(config, requested, full, piecewise, note) -> GraphPlan:
    if config.strict:
        raise ConfigError(f"runner.cudagraph_mode: {requested}: {note} (strict: true)")
    return GraphPlan(requested, full, piecewise, (f"runner.cudagraph_mode: {note}",), note)
