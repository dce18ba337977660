"""One request of a workload, and what synthetic traffic, traces and datasets share: the seeded
random stream of each aspect and the sampling settings of the section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mrv2_prof.scenario import WorkloadSection

# Each random aspect draws from its own stream keyed by (seed, aspect): changing one
# distribution leaves the others as they were. The numbers are part of what a seed means.
ARRIVALS, PROMPT_LEN, OUTPUT_LEN, TOKENS, PREFIX, ABORTS, TRACE_TOKENS, DATASET = range(8)
SAMPLING_KEYS = (
    "temperature",
    "top_k",
    "top_p",
    "logprobs",
    "prompt_logprobs",
    "seed",
    "ignore_eos",
    "stop_token_ids",
)


@dataclass(frozen=True)
class WorkloadRequest:
    req_id: str
    arrival_s: float  # offset from the start of the run
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    logprobs: int
    seed: int | None
    ignore_eos: bool
    prompt_logprobs: int | None
    # None: runs to completion; k >= 1: the client aborts once k output tokens were emitted;
    # 0: aborted at arrival, before being scheduled.
    abort_after_tokens: int | None
    # End the request with finish_reason 'stop' (vLLM's stop_token_ids), even with ignore_eos.
    stop_token_ids: tuple[int, ...] = ()


def rng(seed: int, *key: int) -> np.random.Generator:
    """The stream of one aspect (``ARRIVALS``, ...) of a seed."""
    return np.random.default_rng([seed % 2**64, *key])


def sampling_of(section: WorkloadSection, random_weights: bool = True) -> dict[str, Any]:
    """The section's sampling settings, as ``WorkloadRequest`` fields. ``ignore_eos`` unset is
    true on a model of ``random_weights`` (its EOS is noise) and false on a real model."""
    s = section.sampling
    ignore_eos = section.ignore_eos
    if ignore_eos is None:
        ignore_eos = random_weights
    return {
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "logprobs": s.logprobs,
        "prompt_logprobs": s.prompt_logprobs,
        "seed": s.seed,
        "ignore_eos": ignore_eos,
        "stop_token_ids": s.stop_token_ids,
    }
