"""The request stream a run submits: seeded synthetic traffic, a validated JSONL trace or a
ShareGPT dataset.

This is the client side of the engine, the counterpart of vLLM's benchmark datasets: it turns a
scenario's ``workload`` section into ``WorkloadRequest``s sorted by arrival (``synthetic``,
``trace``, ``sharegpt``); text prompts are tokenized here, in batches (``text_prompts``), with
the model's tokenizer. numpy only (and the tokenizer it is given): the CLI validates traces and
datasets with this package before it starts the runner.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from mrv2_prof.scenario import WorkloadSection
from mrv2_prof.workload.limits import check_section
from mrv2_prof.workload.notes import trace_count_note, unused_keys_note
from mrv2_prof.workload.request import WorkloadRequest
from mrv2_prof.workload.sharegpt import dataset_requests
from mrv2_prof.workload.synthetic import DEFAULT_NUM_REQUESTS, synthetic
from mrv2_prof.workload.text_prompts import TextModel, model_tokenizer
from mrv2_prof.workload.trace import trace_requests

if TYPE_CHECKING:
    from mrv2_prof.text import TextTokenizer

__all__ = [
    "DEFAULT_NUM_REQUESTS",
    "TextModel",
    "WorkloadRequest",
    "build_workload",
    "model_tokenizer",
]


def build_workload(
    section: WorkloadSection,
    *,
    seed: int,
    vocab_size: int,
    max_model_len: int,
    source: str = "<scenario>",
    tokenizer: TextTokenizer | None = None,
    model: Any = None,
    notes: list[str] | None = None,
) -> list[WorkloadRequest]:
    """The requests of ``section``, sorted (stably) by arrival; a bad trace or dataset is a
    ScenarioError.

    ``source`` names the scenario file in errors that are not about a trace line or a dataset
    entry. ``tokenizer`` (``mrv2_prof.text.tokenizer_for``) tokenizes text prompts; ``model``
    (the run's ``ModelSpec``) names the model in errors and decides ``ignore_eos`` when the
    section leaves it unset: true on a random-weight preset, false on a real model. Without
    ``model``, a model without a tokenizer is taken for random weights. ``notes`` gets a line
    for each value the workload could not honour as given (``workload.notes``).
    """
    if vocab_size < 1 or max_model_len < 2:
        raise ValueError(
            f"need vocab_size >= 1 and max_model_len >= 2, got {vocab_size}, {max_model_len}"
        )
    text = TextModel.of(tokenizer, model)
    check_section(section, vocab_size, max_model_len, source)
    args = (section, seed, vocab_size, max_model_len)
    found: list[str | None] = []
    if section.trace is not None:
        reqs = trace_requests(*args, source, text)
        found.append(trace_count_note(section.num_requests, len(reqs)))
    elif section.dataset is not None:
        reqs = dataset_requests(*args, source, text)
    else:
        reqs = synthetic(*args, text.random_weights, notes)
    if section.trace is not None or section.dataset is not None:
        found.append(unused_keys_note(section))
    if notes is not None:
        notes += [note for note in found if note is not None]
    if section.as_fast_as_possible:
        reqs = [dataclasses.replace(r, arrival_s=0.0) for r in reqs]
    return sorted(reqs, key=lambda r: r.arrival_s)
