"""The request stream a run submits: seeded synthetic traffic or a validated JSONL trace.

This is the client side of the engine, the counterpart of vLLM's benchmark datasets: it turns a
scenario's ``workload`` section into ``WorkloadRequest``s sorted by arrival. Each random aspect
(arrivals, prompt lengths, output lengths, tokens, prefixes, aborts) draws from its own numpy
stream keyed by ``(seed, aspect)``, so changing one distribution leaves the others as they were.
numpy only: the CLI validates traces with this module before it starts the runner.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mrv2_prof.scenario import (
    Arrival,
    FixedLen,
    LengthDist,
    ScenarioError,
    SharedPrefix,
    UniformLen,
    WorkloadSection,
)

_ARRIVALS, _PROMPT_LEN, _OUTPUT_LEN, _TOKENS, _PREFIX, _ABORTS, _TRACE_TOKENS = range(7)
DEFAULT_NUM_REQUESTS = 16  # synthetic workloads without num_requests
_SAMPLING_KEYS = (
    "temperature",
    "top_k",
    "top_p",
    "logprobs",
    "prompt_logprobs",
    "seed",
    "ignore_eos",
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
    if section.trace is None:
        reqs = _synthetic(section, seed, vocab_size, max_model_len)
    else:
        reqs = _trace(section, seed, vocab_size, max_model_len, source)
    if section.as_fast_as_possible:
        reqs = [dataclasses.replace(r, arrival_s=0.0) for r in reqs]
    return sorted(reqs, key=lambda r: r.arrival_s)


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed % 2**64, *key])


def _sampling(section: WorkloadSection) -> dict[str, Any]:
    s = section.sampling
    return {
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "logprobs": s.logprobs,
        "prompt_logprobs": s.prompt_logprobs,
        "seed": s.seed,
        "ignore_eos": section.ignore_eos,
    }


# ---------------------------------------------------------------------------- synthetic traffic


def _synthetic(
    section: WorkloadSection, seed: int, vocab_size: int, max_model_len: int
) -> list[WorkloadRequest]:
    n = section.num_requests if section.num_requests is not None else DEFAULT_NUM_REQUESTS
    arrivals = _arrivals(section.arrival, n, _rng(seed, _ARRIVALS))
    output_lens = _lengths(section.output_len, n, _rng(seed, _OUTPUT_LEN), max_model_len)
    output_lens = np.minimum(output_lens, max_model_len - 1)
    fits = max_model_len - output_lens  # room left for the prompt, >= 1
    prompt_lens = _lengths(section.prompt_len, n, _rng(seed, _PROMPT_LEN), max_model_len)
    prompts = _prompts(
        prompt_lens,
        fits,
        section.shared_prefix,
        vocab_size,
        _rng(seed, _TOKENS),
        _rng(seed, _PREFIX),
    )
    aborts = _aborts(section.abort_fraction, output_lens, _rng(seed, _ABORTS))
    sampling = _sampling(section)
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


def _arrivals(arrival: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    if arrival.pattern == "burst":
        return np.zeros(n)
    assert arrival.rate is not None  # the scenario requires it for these patterns
    if arrival.pattern == "constant":
        return np.arange(n) / arrival.rate
    gaps_s = rng.exponential(1.0 / arrival.rate, size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps_s)])


def _lengths(dist: LengthDist, n: int, rng: np.random.Generator, cap: int) -> np.ndarray:
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
) -> list[tuple[int, ...]]:
    """Prompts of the drawn lengths cut to ``fits``; with a shared prefix, request i starts
    with prefix i % G and has at least one token of its own (the prefix is cut to fit)."""
    groups, prefix_len = (shared.groups, shared.len) if shared else (1, 0)
    lens = np.minimum(np.maximum(prompt_lens, prefix_len + 1), fits)
    own_prefix_lens = np.minimum(prefix_len, lens - 1)
    prefixes = prefix_rng.integers(0, vocab_size, size=(groups, prefix_len)).tolist()
    suffix_lens = lens - own_prefix_lens
    suffixes = token_rng.integers(0, vocab_size, size=int(suffix_lens.sum()))
    ends = np.cumsum(suffix_lens).tolist()
    out, start = [], 0
    for i, (k, end) in enumerate(zip(own_prefix_lens.tolist(), ends, strict=True)):
        out.append(tuple(prefixes[i % groups][:k] + suffixes[start:end].tolist()))
        start = end
    return out


def _aborts(fraction: float, max_tokens: np.ndarray, rng: np.random.Generator) -> dict[int, int]:
    """``round(fraction * n)`` requests, each aborted after a uniform [0, max_tokens - 1]."""
    count = round(fraction * len(max_tokens))
    if count == 0:
        return {}
    picked = rng.choice(len(max_tokens), size=count, replace=False)
    after = rng.integers(0, max_tokens[picked])
    return dict(zip(picked.tolist(), after.tolist(), strict=True))


# ---------------------------------------------------------------------------------- JSONL trace


class _LineError(Exception):
    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem


def _is_int(v: Any) -> bool:
    return type(v) is int  # not bool


def _is_num(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "id": (
        lambda v: _is_int(v) or (isinstance(v, str) and v != ""),
        "must be a non-empty string or an integer",
    ),
    "arrival_s": (lambda v: _is_num(v) and v >= 0, "must be a number >= 0"),
    "prompt_token_ids": (
        lambda v: isinstance(v, list) and len(v) > 0 and all(map(_is_int, v)),
        "must be a non-empty list of integers",
    ),
    "prompt_len": (lambda v: _is_int(v) and v >= 1, "must be an integer >= 1"),
    "max_tokens": (lambda v: _is_int(v) and v >= 1, "must be an integer >= 1"),
    "temperature": (lambda v: _is_num(v) and v >= 0, "must be a number >= 0"),
    "top_k": (lambda v: _is_int(v) and v >= 0, "must be an integer >= 0"),
    "top_p": (lambda v: _is_num(v) and 0 < v <= 1, "must be in (0, 1]"),
    "logprobs": (lambda v: _is_int(v) and v >= 0, "must be an integer >= 0"),
    "prompt_logprobs": (
        lambda v: v is None or (_is_int(v) and v >= 0),
        "must be an integer >= 0 or null",
    ),
    "seed": (lambda v: v is None or _is_int(v), "must be an integer or null"),
    "ignore_eos": (lambda v: isinstance(v, bool), "must be true or false"),
}


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _LineError(key, "key given twice")
        obj[key] = value
    return obj


def _parse_line(raw: bytes, line_no: int) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
    except UnicodeDecodeError:
        raise _LineError("", "not valid UTF-8") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise _LineError("", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise _LineError("", f"must be a JSON object, got {_shown(obj)}")
    for key, value in obj.items():
        if key not in _RULES:
            raise _LineError(key, "unknown key")
        is_ok, want = _RULES[key]
        if not is_ok(value):
            raise _LineError(key, f"{want}, got {_shown(value)}")
    return obj


def _line_request(
    obj: dict[str, Any],
    line_no: int,
    defaults: dict[str, Any],
    seed: int,
    vocab_size: int,
    max_model_len: int,
) -> WorkloadRequest:
    has_ids, has_len = "prompt_token_ids" in obj, "prompt_len" in obj
    if has_ids and has_len:
        raise _LineError("prompt_len", "give exactly one of 'prompt_token_ids' or 'prompt_len'")
    if not has_ids and not has_len:
        raise _LineError("prompt_token_ids", "required (or 'prompt_len')")
    if "max_tokens" not in obj:
        raise _LineError("max_tokens", "required")
    max_tokens = obj["max_tokens"]
    if has_ids:
        bad = next((t for t in obj["prompt_token_ids"] if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise _LineError(
                "prompt_token_ids", f"token id {bad} outside the vocabulary [0, {vocab_size})"
            )
    prompt_len = len(obj["prompt_token_ids"]) if has_ids else obj["prompt_len"]
    if prompt_len + max_tokens > max_model_len:
        raise _LineError(
            "max_tokens",
            f"prompt length {prompt_len} + max_tokens {max_tokens} exceeds "
            f"max_model_len {max_model_len}",
        )
    if has_ids:
        tokens = tuple(obj["prompt_token_ids"])
    else:
        tokens = tuple(
            _rng(seed, _TRACE_TOKENS, line_no).integers(0, vocab_size, prompt_len).tolist()
        )
    sampling = {**defaults, **{k: obj[k] for k in _SAMPLING_KEYS if k in obj}}
    sampling["temperature"] = float(sampling["temperature"])
    sampling["top_p"] = float(sampling["top_p"])
    return WorkloadRequest(
        req_id=str(obj.get("id", line_no)),
        arrival_s=float(obj.get("arrival_s", 0.0)),
        prompt_token_ids=tokens,
        max_tokens=max_tokens,
        abort_after_tokens=None,
        **sampling,
    )


def _trace(
    section: WorkloadSection, seed: int, vocab_size: int, max_model_len: int, source: str
) -> list[WorkloadRequest]:
    """Every line is validated; the first ``num_requests`` are kept when it is set."""
    assert section.trace is not None
    file = str(section.trace)
    try:
        lines = section.trace.read_bytes().splitlines()
    except OSError as exc:
        raise ScenarioError(
            source, "workload.trace", f"cannot read {file}: {exc.strerror or exc}"
        ) from None
    defaults = _sampling(section)
    first_line_of: dict[str, int] = {}
    reqs = []
    for line_no, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = _parse_line(raw, line_no)
            req = _line_request(obj, line_no, defaults, seed, vocab_size, max_model_len)
            if req.req_id in first_line_of:
                raise _LineError(
                    "id", f"duplicate id {req.req_id!r} (first on line {first_line_of[req.req_id]})"
                )
        except _LineError as err:
            field = f"line {line_no}: {err.key}" if err.key else f"line {line_no}"
            raise ScenarioError(file, field, err.problem) from None
        first_line_of[req.req_id] = line_no
        reqs.append(req)
    if not reqs:
        raise ScenarioError(file, "", "trace has no requests")
    if section.num_requests is not None:
        reqs = reqs[: section.num_requests]
    return reqs
