"""Seeded synthetic traffic: arrivals (burst, constant, poisson), prompt and output lengths from
their distributions, prompts (with shared prefixes), and the requests the client aborts; a
dataset's requests take their arrivals, drawn output lengths and aborts from here too."""

from __future__ import annotations

import math

import numpy as np

from mrv2_prof.scenario import (
    Arrival,
    FixedLen,
    LengthDist,
    SharedPrefix,
    UniformLen,
    WorkloadSection,
)
from mrv2_prof.scenario.workload_section import DEFAULT_NUM_REQUESTS, DEFAULT_OUTPUT_LEN
from mrv2_prof.workload.notes import changed_note
from mrv2_prof.workload.request import (
    ABORTS,
    ARRIVALS,
    OUTPUT_LEN,
    PREFIX,
    PROMPT_LEN,
    TOKENS,
    WorkloadRequest,
    rng,
    sampling_of,
)


def synthetic(
    section: WorkloadSection,
    seed: int,
    vocab_size: int,
    max_model_len: int,
    random_weights: bool = True,
    notes: list[str] | None = None,
) -> list[WorkloadRequest]:
    """The section's requests in id order; lengths are cut to fit ``max_model_len``, each
    value cut (or a prompt made longer for its shared prefix) a line in ``notes``."""
    n = section.num_requests if section.num_requests is not None else DEFAULT_NUM_REQUESTS
    arrivals = draw_arrivals(section.arrival, n, rng(seed, ARRIVALS))
    output_len = section.output_len or DEFAULT_OUTPUT_LEN
    drawn_out = draw_lengths(output_len, n, rng(seed, OUTPUT_LEN), max_model_len)
    output_lens = np.minimum(drawn_out, max_model_len - 1)
    fits = max_model_len - output_lens  # room left for the prompt, >= 1
    prompt_lens = draw_lengths(section.prompt_len, n, rng(seed, PROMPT_LEN), max_model_len)
    prompts = _prompts(
        prompt_lens,
        fits,
        section.shared_prefix,
        vocab_size,
        rng(seed, TOKENS),
        rng(seed, PREFIX),
        section.repeated_segment_len,
    )
    if notes is not None:
        fit = f"to fit max_model_len {max_model_len:,}"
        found = [
            changed_note("workload.output_len", output_len, drawn_out, output_lens,
                         f"{fit} with a prompt token"),
            *_prompt_notes(section, prompt_lens, fits, fit),
        ]  # fmt: skip
        notes += [note for note in found if note is not None]
    aborts = draw_aborts(section.abort_fraction, output_lens, rng(seed, ABORTS))
    sampling = sampling_of(section, random_weights)
    return [
        WorkloadRequest(
            req_id=f"req-{i}",
            arrival_s=float(arrivals[i]),
            prompt_token_ids=prompts[i],
            max_tokens=int(output_lens[i]),
            abort_after_tokens=aborts.get(i),
            **sampling,
        )
        for i in range(n)
    ]


def _lens(
    prompt_lens: np.ndarray, fits: np.ndarray, shared: SharedPrefix | None
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt length, of which shared prefix) per request: at least a token of its own after
    its prefix, at most ``fits``."""
    prefix_len = shared.len if shared else 0
    lens = np.minimum(np.maximum(prompt_lens, prefix_len + 1), fits)
    return lens, np.minimum(prefix_len, lens - 1)


def _prompt_notes(
    section: WorkloadSection, prompt_lens: np.ndarray, fits: np.ndarray, fit: str
) -> list[str | None]:
    """Notes on the prompt lengths, shared prefixes and repeated segments ``_prompts`` cut
    (or, for a prefix, made longer)."""
    shared, seg = section.shared_prefix, section.repeated_segment_len
    lens, prefix_lens = _lens(prompt_lens, fits, shared)
    own = lens - prefix_lens
    n = len(lens)
    found = [
        changed_note("workload.prompt_len", section.prompt_len, prompt_lens,
                     np.minimum(prompt_lens, fits), f"{fit} with the request's output_len"),
    ]  # fmt: skip
    if shared is not None:
        found += [
            changed_note("workload.prompt_len", section.prompt_len, np.minimum(prompt_lens, fits),
                         lens, f"the shared prefix of {shared.len:,} and a token of its own"),
            changed_note("workload.shared_prefix.len", shared.len, np.full(n, shared.len),
                         prefix_lens, f"{fit} with the request's output_len and a token of its "
                         "own"),
        ]  # fmt: skip
    if seg is not None:
        found.append(
            changed_note("workload.repeated_segment_len", seg, np.full(n, seg),
                         np.minimum(seg, own), "a prompt's own tokens are fewer: it does not "
                         "repeat")
        )  # fmt: skip
    return found


def draw_arrivals(arrival: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    if arrival.pattern == "burst":
        return np.zeros(n)
    assert arrival.rate is not None  # the scenario requires it for these patterns
    if arrival.pattern == "constant":
        return np.arange(n) / arrival.rate
    gaps_s = rng.exponential(1.0 / arrival.rate, size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps_s)])


def draw_lengths(dist: LengthDist, n: int, rng: np.random.Generator, cap: int) -> np.ndarray:
    """``n`` lengths of ``dist``; values above ``cap`` (max_model_len) are cut to it, since the
    model fit would cut them anyway, to keep unbounded tails in int64."""
    if isinstance(dist, FixedLen):
        return np.full(n, min(dist.value, cap), dtype=np.int64)
    if isinstance(dist, UniformLen):
        return np.minimum(rng.integers(dist.min, dist.max + 1, size=n), cap)
    if dist.dist == "normal":
        x = rng.normal(dist.mean, dist.std, size=n)
    else:  # lognormal: mu chosen so that the mean (not the median) is dist.mean
        mu = math.log(dist.mean) - dist.sigma**2 / 2
        x = rng.lognormal(mu, dist.sigma, size=n)
    x = np.clip(np.rint(x), dist.min, dist.max if dist.max is not None else np.inf)
    return np.minimum(x, cap).astype(np.int64)


def _prompts(
    prompt_lens: np.ndarray,
    fits: np.ndarray,
    shared: SharedPrefix | None,
    vocab_size: int,
    token_rng: np.random.Generator,
    prefix_rng: np.random.Generator,
    segment_len: int | None = None,
) -> list[tuple[int, ...]]:
    """Prompts of the drawn lengths cut to ``fits``; with a shared prefix, request i starts
    with prefix i % G and has at least one token of its own (the prefix is cut to fit). With
    ``segment_len`` a prompt's own tokens are its first ``segment_len`` drawn ones, repeated."""
    groups, prefix_len = (shared.groups, shared.len) if shared else (1, 0)
    lens, own_prefix_lens = _lens(prompt_lens, fits, shared)
    prefixes = prefix_rng.integers(0, vocab_size, size=(groups, prefix_len)).tolist()
    suffix_lens = lens - own_prefix_lens
    suffixes = token_rng.integers(0, vocab_size, size=int(suffix_lens.sum()))
    ends = np.cumsum(suffix_lens).tolist()
    out, start = [], 0
    for i, (k, end) in enumerate(zip(own_prefix_lens.tolist(), ends, strict=True)):
        own = suffixes[start:end]
        if segment_len is not None:
            own = np.resize(own[:segment_len], len(own))  # cyclic repetition
        out.append(tuple(prefixes[i % groups][:k] + own.tolist()))
        start = end
    return out


def draw_aborts(
    fraction: float, max_tokens: np.ndarray, rng: np.random.Generator
) -> dict[int, int]:
    """``round(fraction * n)`` requests, each aborted after a uniform [0, max_tokens - 1]."""
    count = round(fraction * len(max_tokens))
    if count == 0:
        return {}
    picked = rng.choice(len(max_tokens), size=count, replace=False)
    after = rng.integers(0, max_tokens[picked])
    return dict(zip(picked.tolist(), after.tolist(), strict=True))
