"""A ShareGPT dataset as a workload, read as ``vllm bench serve --dataset-name sharegpt`` reads
one: a JSON list of ``{"conversations": [{"from": "human" | "gpt", "value": ...}, ...]}``.

Each entry's first ``human`` turn is the prompt and the ``gpt`` turn right after it the reply
whose token count is ``max_tokens`` (or the section's ``output_len``, drawn, when the scenario
gives one). Entries are taken in a seeded shuffled order and dropped by vLLM's filters: a prompt
or reply of fewer than 4 tokens (the reply's only when it sets ``max_tokens``), or prompt +
output over ``max_model_len``. Fewer entries passing than ``num_requests`` are oversampled
(seeded draws of the kept ones), as vLLM does. With ``chat`` the prompt is a user message
through the chat template. The whole file is validated before anything is tokenized; a bad
entry is a ``ScenarioError`` naming the file, the entry (its index from 0) and the key.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from mrv2_prof.inputs.input_file import InputError, MiB, decode_utf8, read_bytes
from mrv2_prof.inputs.memory_budget import shortfall
from mrv2_prof.scenario import ScenarioError, WorkloadSection
from mrv2_prof.scenario.workload_section import ARRIVAL_REASON, MAX_ARRIVAL_S
from mrv2_prof.workload.limits import workload_bytes
from mrv2_prof.workload.request import (
    ABORTS,
    ARRIVALS,
    DATASET,
    OUTPUT_LEN,
    WorkloadRequest,
    rng,
    sampling_of,
)
from mrv2_prof.workload.synthetic import draw_aborts, draw_arrivals, draw_lengths
from mrv2_prof.workload.text_prompts import Prompt, TextError, TextModel, shown_json, tokenize

MAX_DATASET_BYTES = 1024 * MiB  # parsed whole before the run: memory bounds it
MIN_LEN = 4  # vLLM's filter: shorter prompts (and replies that set max_tokens) are dropped
SHAPE = 'a JSON list of {"conversations": [{"from": ..., "value": ...}, ...]} entries (ShareGPT)'


def read_pairs(path: str) -> list[tuple[int, str, str]]:
    """``(entry index, prompt, reply)`` of every entry with a ``human`` turn followed by a
    ``gpt`` turn; every entry's shape is checked (``ScenarioError`` naming the entry and key)."""
    try:
        text = decode_utf8(read_bytes(path, "dataset file", MAX_DATASET_BYTES), path, "dataset")
        data = json.loads(text)
    except InputError as exc:
        raise ScenarioError(path, "", exc.problem) from None
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON ({exc.msg} at column {exc.colno})"
        raise ScenarioError(path, f"line {exc.lineno}", problem) from None
    except (RecursionError, ValueError) as exc:  # nested too deeply, an integer too long
        raise ScenarioError(path, "", f"not valid JSON ({type(exc).__name__})") from None
    if not isinstance(data, list):
        raise ScenarioError(path, "", f"must be {SHAPE}, got {shown_json(data)}")
    pairs = []
    for index, entry in enumerate(data):
        turns = _turns(entry, index, path)
        human = next((i for i, t in enumerate(turns) if t["from"] == "human"), None)
        if human is not None and human + 1 < len(turns) and turns[human + 1]["from"] == "gpt":
            pairs.append((index, turns[human]["value"], turns[human + 1]["value"]))
    if not pairs:
        raise ScenarioError(path, "", "no entry has a 'human' turn followed by a 'gpt' turn")
    return pairs


def _turns(entry: Any, index: int, path: str) -> list[dict[str, Any]]:
    where = f"entry {index}"
    if not isinstance(entry, dict):
        raise ScenarioError(path, where, f"must be an object, got {shown_json(entry)}")
    if "conversations" not in entry:
        raise ScenarioError(path, f"{where}: conversations", "required")
    turns = entry["conversations"]
    if not isinstance(turns, list):
        problem = f"must be a list of turns, got {shown_json(turns)}"
        raise ScenarioError(path, f"{where}: conversations", problem)
    for i, turn in enumerate(turns):
        key = f"{where}: conversations[{i}]"
        if not isinstance(turn, dict):
            problem = f"must be an object with 'from' and 'value', got {shown_json(turn)}"
            raise ScenarioError(path, key, problem)
        for name in ("from", "value"):
            if name not in turn:
                raise ScenarioError(path, f"{key}.{name}", "required")
            if not isinstance(turn[name], str):
                problem = f"must be a string, got {shown_json(turn[name])}"
                raise ScenarioError(path, f"{key}.{name}", problem)
    return turns


def dataset_requests(
    section: WorkloadSection,
    seed: int,
    vocab_size: int,
    max_model_len: int,
    source: str,
    text: TextModel,
) -> list[WorkloadRequest]:
    """The dataset's requests in order of arrival draw (ids ``entry-<index>``, a repeat of an
    oversampled entry ``entry-<index>.<k>``)."""
    dataset = section.dataset
    assert dataset is not None
    problem = text.missing_tokenizer(dataset.chat)
    if problem is not None:  # no tokenizer, or no chat template to render the prompts with
        field = "workload.dataset" if text.tokenizer is None else "workload.dataset.chat"
        raise ScenarioError(source, field, problem)
    file = str(dataset.path)
    pairs = read_pairs(file)
    order = rng(seed, DATASET).permutation(len(pairs))
    given_len = section.output_len is not None  # else each reply's own length
    out_lens = None
    if given_len:  # drawn per shuffled position: the filter sees each entry's own length
        draws = rng(seed, OUTPUT_LEN)
        out_lens = draw_lengths(section.output_len, len(pairs), draws, max_model_len)
    want = section.num_requests if section.num_requests is not None else len(pairs)
    kept: list[tuple[int, tuple[int, ...], int]] = []  # (entry index, prompt tokens, max_tokens)
    start = 0
    while len(kept) < want and start < len(order):
        # a batch a little larger than what is missing: most entries pass the filters
        size = max(256, (want - len(kept)) * 5 // 4)
        chunk = order[start : start + size].tolist()
        prompts: list[Prompt] = [pairs[k][1] for k in chunk]
        if dataset.chat:
            prompts = [[{"role": "user", "content": p}] for p in prompts]
        prompt_ids = _tokenized(text, prompts, vocab_size, file, [pairs[k][0] for k in chunk])
        if out_lens is None:
            replies = text.tokenizer.encode_batch([pairs[k][2] for k in chunk])
            lens = [len(r) for r in replies]
        else:
            lens = out_lens[start : start + len(chunk)].tolist()
        for k, ids, out_len in zip(chunk, prompt_ids, lens, strict=True):
            short = len(ids) < MIN_LEN or (not given_len and out_len < MIN_LEN)
            if not short and len(ids) + out_len <= max_model_len and len(kept) < want:
                kept.append((pairs[k][0], tuple(ids), out_len))
        start += len(chunk)
    if not kept:
        raise ScenarioError(
            file,
            "",
            f"no entry passes the length filters (prompt and reply of at least {MIN_LEN} "
            f"tokens, prompt + output within max_model_len {max_model_len})",
        )
    if section.num_requests is None:  # every entry that passed, none repeated
        want = len(kept)
    return _requests(section, seed, kept, want, source, text.random_weights)


def _tokenized(
    text: TextModel, prompts: list[Prompt], vocab_size: int, file: str, entries: list[int]
) -> list[list[int]]:
    try:
        return tokenize(text, prompts, vocab_size)
    except TextError as err:
        where = f"entry {entries[err.index]}: conversations"
        raise ScenarioError(file, where, f"the human turn {err.problem}") from None


def _requests(
    section: WorkloadSection,
    seed: int,
    kept: list[tuple[int, tuple[int, ...], int]],
    want: int,
    source: str,
    random_weights: bool,
) -> list[WorkloadRequest]:
    extra = want - len(kept)
    picks = list(range(len(kept)))
    if extra > 0:  # oversampled, as vLLM does
        picks += rng(seed, DATASET, 1).integers(0, len(kept), size=extra).tolist()
    tokens = sum(len(kept[p][1]) for p in picks[: len(kept)])  # repeats share their tuple
    need = workload_bytes(want, tokens)
    problem = shortfall(need, f"the workload ({want:,} requests)", on_device=False)
    if problem is not None:
        raise ScenarioError(source, "workload.num_requests", problem)
    arrivals = draw_arrivals(section.arrival, want, rng(seed, ARRIVALS))
    rate = section.arrival.rate  # checked with the scenario when num_requests is given
    if rate is not None and not section.as_fast_as_possible and (want - 1) / rate > MAX_ARRIVAL_S:
        raise ScenarioError(
            source,
            "workload.arrival.rate",
            f"{rate:g}/s puts the last of {want:,} dataset requests past "
            f"{MAX_ARRIVAL_S:,.0f} s ({ARRIVAL_REASON})",
        )
    max_tokens = np.array([kept[p][2] for p in picks], dtype=np.int64)
    aborts = draw_aborts(section.abort_fraction, max_tokens, rng(seed, ABORTS))
    sampling = sampling_of(section, random_weights)
    repeats: dict[int, int] = {}
    reqs = []
    for i, p in enumerate(picks):
        entry, ids, out_len = kept[p]
        k = repeats[entry] = repeats.get(entry, -1) + 1
        reqs.append(
            WorkloadRequest(
                req_id=f"entry-{entry}" if k == 0 else f"entry-{entry}.{k}",
                arrival_s=float(arrivals[i]),
                prompt_token_ids=ids,
                max_tokens=out_len,
                abort_after_tokens=aborts.get(i),
                **sampling,
            )
        )
    return reqs
