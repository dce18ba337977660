"""Trace replay: a JSONL file, one request per line, every line validated before the run.

A line has ``max_tokens`` and one of ``prompt_token_ids``, ``prompt_len`` (seeded random
tokens), ``prompt`` (text) or ``messages`` (chat); ``id``, ``arrival_s`` and the sampling keys
are optional (the section's sampling settings are the defaults). Text lines are tokenized
together once every line was read (``text_prompts``). A bad line is a ``ScenarioError`` naming
the file, line and key.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from mrv2_prof.inputs.finite_numbers import finite, is_json_number, number_problem, shown_number
from mrv2_prof.inputs.input_file import InputError, MiB, read_bytes
from mrv2_prof.inputs.memory_budget import available_host_bytes
from mrv2_prof.scenario import ScenarioError, WorkloadSection
from mrv2_prof.scenario.section import SEED_LIMIT
from mrv2_prof.scenario.workload_section import (
    ARRIVAL_REASON,
    LEN_REASON,
    MAX_ARRIVAL_S,
    MAX_LEN,
    MAX_NUM_REQUESTS,
    NUM_REQUESTS_REASON,
    over,
)
from mrv2_prof.views.format import format_bytes
from mrv2_prof.views.safe_text import plain, shown
from mrv2_prof.workload.limits import vocab_problem, workload_bytes
from mrv2_prof.workload.request import (
    SAMPLING_KEYS,
    TRACE_TOKENS,
    WorkloadRequest,
    rng,
    sampling_of,
)
from mrv2_prof.workload.text_prompts import (
    Prompt,
    TextError,
    TextModel,
    ids_problem,
    messages_problem,
    shown_json,
    tokenize,
)

MAX_TRACE_BYTES = 1024 * MiB  # read whole and validated before the run: memory bounds it
MAX_ID_CHARS = 200  # becomes requests.req_id
PROMPT_KEYS = ("prompt_token_ids", "prompt_len", "prompt", "messages")


class _LineError(Exception):
    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem


def _is_int(v: Any) -> bool:
    return type(v) is int  # not bool


def _is_num(v: Any) -> bool:
    return finite(v) is not None  # the scenario's rule: no overflow, no inf or nan


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
    "prompt": (lambda v: isinstance(v, str) and v != "", "must be a non-empty string"),
    "messages": (lambda v: True, ""),  # its own check: messages_problem
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
    "stop_token_ids": (
        lambda v: isinstance(v, list) and all(map(_is_int, v)),
        "must be a list of integers",
    ),
}


_NUMBERS = ("arrival_s", "temperature", "top_p")  # the keys of a (float) number
# Upper bounds, checked once the type is right: (the largest value, or length, and why).
_LIMITS: dict[str, tuple[int | float, str]] = {
    "id": (MAX_ID_CHARS, "characters of requests.req_id"),
    "arrival_s": (MAX_ARRIVAL_S, ARRIVAL_REASON),
    "prompt_token_ids": (MAX_LEN, f"tokens: {LEN_REASON}"),
    "prompt_len": (MAX_LEN, LEN_REASON),
    "max_tokens": (MAX_LEN, LEN_REASON),
    "seed": (SEED_LIMIT - 1, "a seed is a signed 64-bit integer"),
}


def _over_limit(key: str, value: Any) -> str | None:
    if key not in _LIMITS or value is None:
        return None
    limit, reason = _LIMITS[key]
    if key == "seed" and value < 0:
        return f"must be >= 0, got {shown_number(value)}"
    size = len(value) if isinstance(value, list) else value
    if key == "id":  # characters, an integer id's too
        size = len(str(value))
    return over(limit, size, reason) if size > limit else None


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
    except RecursionError:
        raise _LineError("", "not valid here: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise _LineError("", f"not valid JSON ({plain(exc, limit=80)})") from None
    if not isinstance(obj, dict):
        raise _LineError("", f"must be a JSON object, got {shown_json(obj)}")
    for key, value in obj.items():
        if key not in _RULES:
            raise _LineError(key, "unknown key")
        is_ok, want = _RULES[key]
        if key in _NUMBERS and is_json_number(value) and (problem := number_problem(value)):
            raise _LineError(key, problem)  # a 400-digit integer, or 1e400 (inf)
        if not is_ok(value):
            raise _LineError(key, f"{want}, got {shown_json(value)}")
        bad_messages = messages_problem(value) if key == "messages" else None
        if bad_messages is not None:
            raise _LineError(*bad_messages)
        problem = _over_limit(key, value)
        if problem is not None:
            raise _LineError(key, problem)
    return obj


def _line_request(
    obj: dict[str, Any],
    line_no: int,
    defaults: dict[str, Any],
    seed: int,
    vocab_size: int,
    max_model_len: int,
) -> WorkloadRequest:
    """The line's request; a text line's has no prompt tokens yet (``_with_text_tokens``)."""
    given = [k for k in PROMPT_KEYS if k in obj]
    if len(given) > 1:
        raise _LineError(
            given[1], "give exactly one of 'prompt_token_ids', 'prompt_len', 'prompt' or 'messages'"
        )
    if not given:
        raise _LineError("prompt_token_ids", "required (or 'prompt_len', 'prompt' or 'messages')")
    has_ids, is_text = given[0] == "prompt_token_ids", given[0] in ("prompt", "messages")
    if "max_tokens" not in obj:
        raise _LineError("max_tokens", "required")
    max_tokens = obj["max_tokens"]
    for key in ("top_k", "logprobs", "prompt_logprobs"):
        problem = vocab_problem(obj.get(key), vocab_size)
        if problem is not None:
            raise _LineError(key, problem)
    if "stop_token_ids" in obj:
        problem = ids_problem(obj["stop_token_ids"], vocab_size)
        if problem is not None:
            raise _LineError("stop_token_ids", problem)
    if has_ids:
        bad = next((t for t in obj["prompt_token_ids"] if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise _LineError(
                "prompt_token_ids",
                f"token id {shown_number(bad, False)} outside the vocabulary [0, {vocab_size})",
            )
    if is_text and max_tokens >= max_model_len:  # a text's length is known once tokenized
        raise _LineError(
            "max_tokens",
            f"max_tokens {max_tokens} leaves no room for a prompt in max_model_len {max_model_len}",
        )
    prompt_len = len(obj["prompt_token_ids"]) if has_ids else obj.get("prompt_len", 0)
    if prompt_len + max_tokens > max_model_len:
        raise _LineError(
            "max_tokens",
            f"prompt length {prompt_len} + max_tokens {max_tokens} exceeds "
            f"max_model_len {max_model_len}",
        )
    if has_ids:
        tokens = tuple(obj["prompt_token_ids"])
    elif is_text:
        tokens = ()
    else:
        tokens = tuple(
            rng(seed, TRACE_TOKENS, line_no).integers(0, vocab_size, prompt_len).tolist()
        )
    sampling = {**defaults, **{k: obj[k] for k in SAMPLING_KEYS if k in obj}}
    sampling["temperature"] = float(sampling["temperature"])
    sampling["top_p"] = float(sampling["top_p"])
    sampling["stop_token_ids"] = tuple(sampling["stop_token_ids"])
    return WorkloadRequest(
        req_id=str(obj.get("id", line_no)),
        arrival_s=float(obj.get("arrival_s", 0.0)),
        prompt_token_ids=tokens,
        max_tokens=max_tokens,
        abort_after_tokens=None,
        **sampling,
    )


def trace_requests(
    section: WorkloadSection,
    seed: int,
    vocab_size: int,
    max_model_len: int,
    source: str,
    text: TextModel,
) -> list[WorkloadRequest]:
    """Every line is validated (text lines tokenized with ``text``'s tokenizer); the first
    ``num_requests`` are kept when it is set."""
    assert section.trace is not None
    file = str(section.trace)
    try:
        data = read_bytes(section.trace, "trace file", MAX_TRACE_BYTES)
    except InputError as exc:
        raise ScenarioError(file, "", exc.problem) from None
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise ScenarioError(file, "", "the trace is UTF-16 (byte order mark); save it as UTF-8")
    lines = data.splitlines()
    free_bytes = available_host_bytes()
    num_tokens = 0
    defaults = sampling_of(section, text.random_weights)
    first_line_of: dict[str, int] = {}
    reqs = []
    texts: list[tuple[int, int, str, Prompt]] = []  # (request index, line, key, prompt)
    for line_no, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = _parse_line(raw, line_no)
            req = _line_request(obj, line_no, defaults, seed, vocab_size, max_model_len)
            if req.req_id in first_line_of:
                first = first_line_of[req.req_id]
                raise _LineError("id", f"duplicate id {shown(req.req_id)} (first on line {first})")
        except _LineError as err:
            field = f"line {line_no}: {err.key}" if err.key else f"line {line_no}"
            raise ScenarioError(file, field, err.problem) from None
        first_line_of[req.req_id] = line_no
        key = "prompt" if "prompt" in obj else "messages" if "messages" in obj else None
        if key is not None:
            texts.append((len(reqs), line_no, key, obj[key]))
        if len(reqs) == MAX_NUM_REQUESTS:
            raise ScenarioError(
                file,
                f"line {line_no}",
                f"more than {MAX_NUM_REQUESTS:,} requests ({NUM_REQUESTS_REASON})",
            )
        reqs.append(req)
        # a text's tokens are not known yet: its characters are more than its tokens
        num_tokens += len(req.prompt_token_ids) if key is None else len(str(obj[key]))
        need = workload_bytes(len(reqs), num_tokens)
        if free_bytes is not None and need > free_bytes:
            raise ScenarioError(
                file,
                f"line {line_no}",
                f"the requests up to this line need {format_bytes(need)}, more than the "
                f"{format_bytes(free_bytes)} free on the host",
            )
    if not reqs:
        raise ScenarioError(file, "", "trace has no requests")
    if texts:
        _with_text_tokens(reqs, texts, text, vocab_size, max_model_len, file)
    if section.num_requests is not None:
        reqs = reqs[: section.num_requests]
    return reqs


def _with_text_tokens(
    reqs: list[WorkloadRequest],
    texts: list[tuple[int, int, str, Prompt]],
    text: TextModel,
    vocab_size: int,
    max_model_len: int,
    file: str,
) -> None:
    """The text lines' requests (in ``reqs``) with their prompts tokenized, in one batch."""
    chat = any(key == "messages" for _, _, key, _ in texts)
    problem = text.missing_tokenizer(chat)
    if problem is not None:  # no tokenizer (the first text), or no template (the first chat)
        first = texts[0] if text.tokenizer is None else next(t for t in texts if t[2] == "messages")
        raise ScenarioError(file, f"line {first[1]}: {first[2]}", problem)
    try:
        ids = tokenize(text, [prompt for *_, prompt in texts], vocab_size)
    except TextError as err:
        _, line_no, key, _ = texts[err.index]
        raise ScenarioError(file, f"line {line_no}: {key}", err.problem) from None
    for (at, line_no, key, _), tokens in zip(texts, ids, strict=True):
        req = reqs[at]
        if len(tokens) + req.max_tokens > max_model_len:
            raise ScenarioError(
                file,
                f"line {line_no}: {key}",
                f"{len(tokens):,} tokens after tokenization + max_tokens {req.max_tokens} "
                f"exceeds max_model_len {max_model_len}",
            )
        reqs[at] = dataclasses.replace(req, prompt_token_ids=tuple(tokens))
