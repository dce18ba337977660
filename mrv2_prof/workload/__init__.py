"""The request stream a run submits: seeded synthetic traffic or a validated JSONL trace.

This is the client side of the engine, the counterpart of vLLM's benchmark datasets: it turns a
scenario's ``workload`` section into ``WorkloadRequest``s sorted by arrival (``synthetic``,
``trace``). numpy only: the CLI validates traces with this package before it starts the runner.
"""

from __future__ import annotations

import dataclasses

from mrv2_prof.scenario import WorkloadSection
from mrv2_prof.workload.limits import check_section
from mrv2_prof.workload.request import WorkloadRequest
from mrv2_prof.workload.synthetic import DEFAULT_NUM_REQUESTS, synthetic
from mrv2_prof.workload.trace import trace_requests

__all__ = ["DEFAULT_NUM_REQUESTS", "WorkloadRequest", "build_workload"]


def build_workload(
    section: WorkloadSection,
    *,
    seed: int,
    vocab_size: int,
    max_model_len: int,
    source: str = "<scenario>",
) -> list[WorkloadRequest]:
    """The requests of ``section``, sorted (stably) by arrival; a bad trace is a ScenarioError.

    ``source`` names the scenario file in errors that are not about a trace line.
    """
    if vocab_size < 1 or max_model_len < 2:
        raise ValueError(
            f"need vocab_size >= 1 and max_model_len >= 2, got {vocab_size}, {max_model_len}"
        )
    check_section(section, vocab_size, max_model_len, source)
    if section.trace is None:
        reqs = synthetic(section, seed, vocab_size, max_model_len)
    else:
        reqs = trace_requests(section, seed, vocab_size, max_model_len, source)
    if section.as_fast_as_possible:
        reqs = [dataclasses.replace(r, arrival_s=0.0) for r in reqs]
    return sorted(reqs, key=lambda r: r.arrival_s)
