"""What a workload may ask of the model and of the machine, checked before it is built: the
sampling settings against the vocabulary, and the memory its requests will take against the
host's free memory (the workload is built in the CLI, to validate it, and again in the runner)."""

from __future__ import annotations

from mrv2_prof.inputs.finite_numbers import shown_number
from mrv2_prof.inputs.memory_budget import shortfall
from mrv2_prof.scenario import FixedLen, LengthDist, ScenarioError, UniformLen, WorkloadSection
from mrv2_prof.scenario.workload_section import DEFAULT_NUM_REQUESTS

# A prompt token costs a Python int in a tuple (the workload), in a list (the engine's request)
# and numpy scratch while drawing; a request its objects. Estimates on the high side: the
# check is there to catch a workload orders of magnitude too big, not to size one exactly.
BYTES_PER_TOKEN = 96
BYTES_PER_REQUEST = 2048
VOCAB_KEYS = ("top_k", "logprobs", "prompt_logprobs")


def vocab_problem(value: int | None, vocab_size: int) -> str | None:
    """The problem of a top-k / logprobs count larger than the vocabulary, else None."""
    if value is None or value <= vocab_size:
        return None
    return f"must be <= the model's vocabulary size {vocab_size:,}, got {shown_number(value)}"


def _max_len(dist: LengthDist, cap: int) -> int:
    if isinstance(dist, FixedLen):
        return min(dist.value, cap)
    if isinstance(dist, UniformLen) or dist.max is not None:
        return min(dist.max, cap)
    return cap


def workload_bytes(num_requests: int, tokens: int) -> int:
    """Host memory of ``num_requests`` requests holding ``tokens`` prompt tokens in all."""
    return num_requests * BYTES_PER_REQUEST + tokens * BYTES_PER_TOKEN


def check_section(
    section: WorkloadSection, vocab_size: int, max_model_len: int, source: str
) -> None:
    """``ScenarioError`` when the section's sampling exceeds the vocabulary or its synthetic
    requests (at their longest) would not fit in the host's free memory."""
    for key in VOCAB_KEYS:
        problem = vocab_problem(getattr(section.sampling, key), vocab_size)
        if problem is not None:
            raise ScenarioError(source, f"workload.sampling.{key}", problem)
    bad = next((t for t in section.sampling.stop_token_ids if t >= vocab_size), None)
    if bad is not None:
        problem = f"token id {bad} outside the vocabulary [0, {vocab_size})"
        raise ScenarioError(source, "workload.sampling.stop_token_ids", problem)
    if section.trace is not None or section.dataset is not None:
        return  # a trace's lines are checked as they are read, a dataset's entries once drawn
    n = section.num_requests if section.num_requests is not None else DEFAULT_NUM_REQUESTS
    prompt = _max_len(section.prompt_len, max_model_len - 1)
    prefix_tokens = 0
    if section.shared_prefix is not None:
        prompt = max(prompt, min(section.shared_prefix.len + 1, max_model_len - 1))
        prefix_tokens = section.shared_prefix.groups * section.shared_prefix.len
    need = workload_bytes(n, n * prompt + prefix_tokens)
    problem = shortfall(need, f"the workload ({n:,} requests of up to {prompt:,} prompt tokens)",
                        on_device=False)  # fmt: skip
    if problem is not None:
        field = "workload.num_requests"
        if prefix_tokens > n * prompt:
            field = "workload.shared_prefix"
        raise ScenarioError(source, field, problem)
