"""The request stream: seeded synthetic traffic (arrivals, lengths, prefixes, aborts) and traces."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mrv2_prof.scenario import ScenarioError, WorkloadSection
from mrv2_prof.workload import WorkloadRequest, build_workload

VOCAB = 32000


def section(base_dir: Path | None = None, **data: Any) -> WorkloadSection:
    return WorkloadSection.model_validate(data, context={"base_dir": base_dir})


def build(
    sec: WorkloadSection, seed: int = 0, vocab_size: int = VOCAB, max_model_len: int = 100_000
) -> list[WorkloadRequest]:
    return build_workload(sec, seed=seed, vocab_size=vocab_size, max_model_len=max_model_len)


def by_id(reqs: list[WorkloadRequest]) -> dict[str, WorkloadRequest]:
    return {r.req_id: r for r in reqs}


def test_workload_does_not_import_torch() -> None:
    code = "import sys, mrv2_prof.workload; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---------------------------------------------------------------------------- determinism


MIXED = {
    "num_requests": 64,
    "arrival": {"pattern": "poisson", "rate": 10},
    "prompt_len": {"dist": "uniform", "min": 4, "max": 40},
    "output_len": {"dist": "normal", "mean": 20, "std": 5, "min": 1},
    "shared_prefix": {"groups": 4, "len": 3},
    "abort_fraction": 0.25,
}


def test_same_seed_same_requests_other_seed_differs() -> None:
    a, b = build(section(**MIXED), seed=3), build(section(**MIXED), seed=3)
    assert a == b
    c = build(section(**MIXED), seed=4)
    assert [r.prompt_token_ids for r in a] != [r.prompt_token_ids for r in c]
    assert [r.arrival_s for r in a] != [r.arrival_s for r in c]


def test_ids_count_and_sampling_from_section() -> None:
    sampling = {"temperature": 0.8, "top_k": 5, "top_p": 0.5, "logprobs": 3, "seed": 9}
    reqs = build(section(**MIXED, sampling=sampling, ignore_eos=False))
    assert sorted(r.req_id for r in reqs) == sorted(f"req-{i}" for i in range(64))
    for r in reqs:
        got = (r.temperature, r.top_k, r.top_p, r.logprobs, r.seed, r.ignore_eos)
        assert got == (0.8, 5, 0.5, 3, 9, False)


def test_changing_output_len_leaves_prompts_and_arrivals() -> None:
    a = by_id(build(section(**MIXED)))
    b = by_id(build(section(**{**MIXED, "output_len": {"dist": "uniform", "min": 50, "max": 90}})))
    assert [r.max_tokens for r in a.values()] != [b[k].max_tokens for k in a]
    for k, r in a.items():
        assert (r.prompt_token_ids, r.arrival_s) == (b[k].prompt_token_ids, b[k].arrival_s)


def test_changing_prompt_len_leaves_outputs_and_arrivals() -> None:
    a = by_id(build(section(**MIXED)))
    b = by_id(build(section(**{**MIXED, "prompt_len": {"dist": "fixed", "value": 7}})))
    for k, r in a.items():
        assert (r.max_tokens, r.arrival_s) == (b[k].max_tokens, b[k].arrival_s)


def test_changing_arrivals_leaves_prompts_and_outputs() -> None:
    a = by_id(build(section(**MIXED)))
    b = by_id(build(section(**{**MIXED, "arrival": {"pattern": "poisson", "rate": 3}})))
    for k, r in a.items():
        assert (r.prompt_token_ids, r.max_tokens) == (b[k].prompt_token_ids, b[k].max_tokens)


def test_prompt_and_output_lengths_are_drawn_independently() -> None:
    dist = {"dist": "uniform", "min": 1, "max": 1000}
    reqs = build(section(num_requests=50, prompt_len=dist, output_len=dist))
    assert [len(r.prompt_token_ids) for r in reqs] != [r.max_tokens for r in reqs]


# ------------------------------------------------------------------------------- arrivals


def test_burst_arrives_at_zero() -> None:
    reqs = build(section(num_requests=20, arrival={"pattern": "burst"}))
    assert [r.arrival_s for r in reqs] == [0.0] * 20
    assert [r.req_id for r in reqs] == [f"req-{i}" for i in range(20)]  # stable order


def test_constant_spacing_is_one_over_rate() -> None:
    reqs = build(section(num_requests=50, arrival={"pattern": "constant", "rate": 8}))
    assert [r.arrival_s for r in reqs] == [i / 8 for i in range(50)]


def test_poisson_gaps_are_exponential_with_mean_one_over_rate() -> None:
    n, rate = 2000, 40.0
    reqs = build(section(num_requests=n, arrival={"pattern": "poisson", "rate": rate}))
    arrivals = np.array([r.arrival_s for r in reqs])
    assert arrivals[0] == 0.0
    assert [r.req_id for r in reqs] == [f"req-{i}" for i in range(n)]
    gaps = np.diff(arrivals)
    assert (gaps >= 0).all()
    # The mean of n-1 exponential gaps has standard error (1/rate)/sqrt(n-1): allow 5 of them.
    assert abs(gaps.mean() - 1 / rate) < 5 * (1 / rate) / math.sqrt(n - 1)
    # An exponential's std equals its mean (a constant stream would have std 0).
    assert gaps.std() == pytest.approx(1 / rate, rel=0.15)


@pytest.mark.parametrize("pattern", ["burst", "constant", "poisson"])
def test_as_fast_as_possible_zeroes_arrivals(pattern: str) -> None:
    arrival = {"pattern": pattern, "rate": 2.0}
    reqs = build(section(num_requests=10, arrival=arrival, as_fast_as_possible=True))
    assert [r.arrival_s for r in reqs] == [0.0] * 10


# -------------------------------------------------------------------------------- lengths


def output_lens(dist: dict[str, Any], n: int = 4000, max_model_len: int = 100_000) -> np.ndarray:
    sec = section(num_requests=n, prompt_len={"dist": "fixed", "value": 1}, output_len=dist)
    return np.array([r.max_tokens for r in build(sec, max_model_len=max_model_len)])


def test_fixed_length() -> None:
    assert set(output_lens({"dist": "fixed", "value": 17}, n=30)) == {17}


def test_uniform_length_covers_inclusive_bounds() -> None:
    lens = output_lens({"dist": "uniform", "min": 10, "max": 20})
    assert set(lens.tolist()) == set(range(10, 21))
    assert lens.mean() == pytest.approx(15, abs=0.3)


def test_normal_length_mean_and_bounds() -> None:
    lens = output_lens({"dist": "normal", "mean": 100, "std": 20})
    assert lens.mean() == pytest.approx(100, abs=1.5)
    assert lens.std() == pytest.approx(20, rel=0.1)
    clipped = output_lens({"dist": "normal", "mean": 100, "std": 20, "min": 90, "max": 105})
    assert clipped.min() == 90 and clipped.max() == 105
    assert (clipped == 90).mean() == pytest.approx(0.31, abs=0.04)  # P(N < 89.5)


def test_lognormal_mean_is_the_mean_and_sigma_is_log_space() -> None:
    mean, sigma = 200.0, 0.5
    lens = output_lens({"dist": "lognormal", "mean": mean, "sigma": sigma})
    stderr = mean * math.sqrt(math.exp(sigma**2) - 1) / math.sqrt(len(lens))
    assert abs(lens.mean() - mean) < 5 * stderr
    assert np.median(lens) == pytest.approx(mean * math.exp(-(sigma**2) / 2), rel=0.05)
    assert np.log(lens).std() == pytest.approx(sigma, rel=0.1)


def test_lognormal_clipped_to_bounds() -> None:
    lens = output_lens({"dist": "lognormal", "mean": 50, "sigma": 1.0, "min": 20, "max": 80})
    assert lens.min() == 20 and lens.max() == 80


def test_lognormal_unbounded_tail_is_cut_by_the_model() -> None:
    lens = output_lens({"dist": "lognormal", "mean": 1e6, "sigma": 3.0}, max_model_len=512)
    assert lens.max() == 511 and lens.min() >= 1


def test_lengths_fit_the_model() -> None:
    reqs = build(
        section(
            num_requests=30,
            prompt_len={"dist": "uniform", "min": 50, "max": 60},
            output_len={"dist": "fixed", "value": 20},
        ),
        max_model_len=64,
    )
    assert {r.max_tokens for r in reqs} == {20}
    assert {len(r.prompt_token_ids) for r in reqs} == {44}
    huge = section(num_requests=5, output_len={"dist": "fixed", "value": 1000})
    for r in build(huge, max_model_len=64):
        assert (r.max_tokens, len(r.prompt_token_ids)) == (63, 1)


def test_short_requests_are_not_clipped() -> None:
    sec = section(num_requests=200, prompt_len={"dist": "uniform", "min": 1, "max": 30})
    lens = {len(r.prompt_token_ids) for r in build(sec, max_model_len=64)}
    assert lens == set(range(1, 31))


def test_token_ids_cover_the_vocabulary_and_stay_inside() -> None:
    sec = section(num_requests=20, prompt_len={"dist": "fixed", "value": 50})
    tokens = [t for r in build(sec, vocab_size=7) for t in r.prompt_token_ids]
    assert all(type(t) is int for t in tokens)
    assert set(tokens) == set(range(7))


# ---------------------------------------------------------------------------- shared prefix


def test_shared_prefix_groups() -> None:
    groups, plen, n = 3, 8, 30
    base = {"num_requests": n, "prompt_len": {"dist": "uniform", "min": 10, "max": 30}}
    plain = build(section(**base))
    reqs = build(section(**base, shared_prefix={"groups": groups, "len": plen}))
    prompts = [r.prompt_token_ids for r in reqs]
    assert [len(p) for p in prompts] == [len(r.prompt_token_ids) for r in plain]
    for i in range(n - groups):
        assert prompts[i][:plen] == prompts[i + groups][:plen]
        assert prompts[i] != prompts[i + groups]
    assert len({p[:plen] for p in prompts}) == groups
    # Past the prefix the requests of a group are unrelated.
    assert len({p[plen] for p in prompts[::groups]}) > 1


def test_shared_prefix_raises_short_prompts_and_yields_to_the_model() -> None:
    prefix = {"groups": 2, "len": 8}
    short = section(num_requests=6, prompt_len={"dist": "fixed", "value": 4}, shared_prefix=prefix)
    assert {len(r.prompt_token_ids) for r in build(short)} == {9}

    tight = section(
        num_requests=6,
        prompt_len={"dist": "fixed", "value": 4},
        output_len={"dist": "fixed", "value": 2},
        shared_prefix=prefix,
    )
    long_prefix = build(short)
    reqs = build(tight, max_model_len=8)
    for i, r in enumerate(reqs):
        assert len(r.prompt_token_ids) == 6  # the model fits 8 - 2 tokens
        assert r.prompt_token_ids[:5] == long_prefix[i].prompt_token_ids[:5]  # the prefix, cut
    assert reqs[0].prompt_token_ids[:5] != reqs[1].prompt_token_ids[:5]
    assert reqs[0].prompt_token_ids != reqs[2].prompt_token_ids  # one own token each


# --------------------------------------------------------------------------------- aborts


@pytest.mark.parametrize(("n", "fraction", "aborted"), [(40, 0.3, 12), (10, 0.26, 3), (7, 1.0, 7)])
def test_abort_fraction(n: int, fraction: float, aborted: int) -> None:
    out = {"dist": "uniform", "min": 1, "max": 5}
    reqs = build(section(num_requests=n, output_len=out, abort_fraction=fraction))
    cut = [r for r in reqs if r.abort_after_tokens is not None]
    assert len(cut) == aborted
    assert all(0 <= r.abort_after_tokens < r.max_tokens for r in cut)


def test_abort_points_cover_the_range() -> None:
    out = {"dist": "fixed", "value": 4}
    reqs = build(section(num_requests=200, output_len=out, abort_fraction=0.5))
    assert {r.abort_after_tokens for r in reqs} == {None, 0, 1, 2, 3}


def test_no_aborts_by_default() -> None:
    assert all(r.abort_after_tokens is None for r in build(section(num_requests=30)))


# ---------------------------------------------------------------------------------- traces


def write_trace(tmp_path: Path, lines: list[str | dict[str, Any]]) -> Path:
    path = tmp_path / "traffic.jsonl"
    text = [x if isinstance(x, str) else json.dumps(x) for x in lines]
    path.write_text("\n".join(text) + "\n")
    return path


HAPPY = [
    {"id": "b", "arrival_s": 0.5, "prompt_token_ids": [1, 2, 3], "max_tokens": 4,
     "temperature": 0.7, "seed": None},
    "",
    {"id": 7, "prompt_len": 5, "max_tokens": 2, "top_k": 3, "ignore_eos": False,
     "prompt_logprobs": 1},
    {"arrival_s": 0.25, "prompt_len": 3, "max_tokens": 1, "top_p": 1, "logprobs": 0},
]  # fmt: skip
SAMPLING = {"temperature": 0.3, "top_k": 0, "top_p": 0.9, "logprobs": 2, "seed": 11}


def test_trace_happy_path(tmp_path: Path) -> None:
    write_trace(tmp_path, HAPPY)
    sec = section(tmp_path, trace="traffic.jsonl", sampling=SAMPLING, arrival={"pattern": "burst"})
    reqs = build(sec, seed=5, max_model_len=16)
    assert [r.req_id for r in reqs] == ["7", "4", "b"]  # by arrival; absent id = line number
    b, seven, four = by_id(reqs)["b"], by_id(reqs)["7"], by_id(reqs)["4"]
    assert b == WorkloadRequest(
        req_id="b", arrival_s=0.5, prompt_token_ids=(1, 2, 3), max_tokens=4, temperature=0.7,
        top_k=0, top_p=0.9, logprobs=2, seed=None, ignore_eos=True, abort_after_tokens=None,
        prompt_logprobs=None,
    )  # fmt: skip
    assert (seven.arrival_s, seven.max_tokens, seven.top_k, seven.ignore_eos) == (0, 2, 3, False)
    assert (seven.temperature, seven.seed, seven.logprobs) == (0.3, 11, 2)
    assert (seven.prompt_logprobs, four.prompt_logprobs) == (1, None)
    assert (four.top_p, four.logprobs, four.max_tokens) == (1.0, 0, 1)
    assert len(seven.prompt_token_ids) == 5 and len(four.prompt_token_ids) == 3
    assert all(0 <= t < VOCAB for t in seven.prompt_token_ids + four.prompt_token_ids)
    assert all(r.abort_after_tokens is None for r in reqs)


def test_trace_lines_of_equal_length_get_different_prompts(tmp_path: Path) -> None:
    write_trace(tmp_path, [{"prompt_len": 6, "max_tokens": 1}] * 2)
    first, second = build(section(tmp_path, trace="traffic.jsonl"))
    assert first.prompt_token_ids != second.prompt_token_ids


def test_trace_drawn_prompts_are_seeded_per_line(tmp_path: Path) -> None:
    write_trace(tmp_path, HAPPY)
    sec = section(tmp_path, trace="traffic.jsonl")
    first = by_id(build(sec, seed=5))
    assert first == by_id(build(sec, seed=5))
    assert first["7"].prompt_token_ids != by_id(build(sec, seed=6))["7"].prompt_token_ids
    edited = [{**HAPPY[0], "max_tokens": 9, "prompt_token_ids": [4]}, *HAPPY[1:]]
    write_trace(tmp_path, edited)
    assert by_id(build(sec, seed=5))["7"].prompt_token_ids == first["7"].prompt_token_ids


def test_trace_as_fast_as_possible_keeps_file_order(tmp_path: Path) -> None:
    write_trace(tmp_path, HAPPY)
    sec = section(tmp_path, trace="traffic.jsonl", as_fast_as_possible=True)
    reqs = build(sec)
    assert [(r.req_id, r.arrival_s) for r in reqs] == [("b", 0.0), ("7", 0.0), ("4", 0.0)]


def test_trace_num_requests_limits_only_when_set(tmp_path: Path) -> None:
    lines = [{"arrival_s": 20 - i, "prompt_len": 2, "max_tokens": 1} for i in range(20)]
    write_trace(tmp_path, lines)
    assert len(build(section(tmp_path, trace="traffic.jsonl"))) == 20  # default 16 ignored
    limited = build(section(tmp_path, trace="traffic.jsonl", num_requests=3))
    assert [r.req_id for r in limited] == ["3", "2", "1"]  # the first 3 lines, by arrival
    assert len(build(section(tmp_path, trace="traffic.jsonl", num_requests=50))) == 20


def test_trace_rejects_a_bad_line_past_num_requests(tmp_path: Path) -> None:
    write_trace(tmp_path, [{"prompt_len": 2, "max_tokens": 1}, {"prompt_len": 2}])
    with pytest.raises(ScenarioError) as info:
        build(section(tmp_path, trace="traffic.jsonl", num_requests=1))
    assert info.value.field == "line 2: max_tokens"


OK = {"prompt_len": 2, "max_tokens": 1}


def line(**kw: Any) -> dict[str, Any]:
    return {**OK, **kw}


BAD_TRACES = [
    # (lines, expected field, expected problem)
    ([OK, OK, '{"prompt_len": 2,, "max_tokens": 1}'], "line 3", "not valid JSON (Expecting"),
    ([OK, "[1, 2]"], "line 2", "must be a JSON object, got [1, 2]"),
    ([OK, "", OK, "", "", OK, line(top_p=1.5)], "line 7", "top_p: must be in (0, 1], got 1.5"),
    ([line(top_p=0)], "line 1", "top_p: must be in (0, 1], got 0"),
    ([OK, OK, OK, {"prompt_token_ids": [5, 70000], "max_tokens": 1}], "line 4",
     "prompt_token_ids: token id 70000 outside the vocabulary [0, 32000)"),
    ([{"prompt_token_ids": [-1], "max_tokens": 1}], "line 1",
     "prompt_token_ids: token id -1 outside the vocabulary [0, 32000)"),
    ([{"prompt_token_ids": [], "max_tokens": 1}], "line 1",
     "prompt_token_ids: must be a non-empty list of integers, got []"),
    ([{"prompt_token_ids": [1, 2.5], "max_tokens": 1}], "line 1",
     "prompt_token_ids: must be a non-empty list of integers"),
    ([OK, line(prompt="hi")], "line 2", "prompt: give exactly one of 'prompt_token_ids', "
     "'prompt_len', 'prompt' or 'messages'"),
    ([OK, line(bogus="hi")], "line 2", "bogus: unknown key"),
    ([OK, {"prompt_len": 3}], "line 2", "max_tokens: required"),
    ([line(max_tokens=0)], "line 1", "max_tokens: must be an integer >= 1, got 0"),
    ([line(prompt_logprobs=-1)], "line 1",
     "prompt_logprobs: must be an integer >= 0 or null, got -1"),
    ([line(max_tokens="5")], "line 1", 'max_tokens: must be an integer >= 1, got "5"'),
    ([line(max_tokens=True)], "line 1", "max_tokens: must be an integer >= 1, got true"),
    ([line(prompt_token_ids=[1])], "line 1",
     "prompt_len: give exactly one of 'prompt_token_ids', 'prompt_len', 'prompt'"),
    ([{"max_tokens": 1}], "line 1", "prompt_token_ids: required"),
    ([line(prompt_len=0)], "line 1", "prompt_len: must be an integer >= 1, got 0"),
    ([line(prompt_len=4000, max_tokens=97)], "line 1",
     "max_tokens: prompt length 4000 + max_tokens 97 exceeds max_model_len 4096"),
    ([line(arrival_s=-1)], "line 1", "arrival_s: must be a number >= 0, got -1"),
    (['{"arrival_s": NaN, "prompt_len": 2, "max_tokens": 1}'], "line 1", "arrival_s: must be"),
    ([line(arrival_s="0")], "line 1", "arrival_s: must be a number >= 0"),
    ([line(temperature=-0.5)], "line 1", "temperature: must be a number >= 0, got -0.5"),
    ([line(top_k=1.5)], "line 1", "top_k: must be an integer >= 0, got 1.5"),
    ([line(logprobs=-1)], "line 1", "logprobs: must be an integer >= 0, got -1"),
    ([line(seed="x")], "line 1", 'seed: must be an integer or null, got "x"'),
    ([line(ignore_eos=1)], "line 1", "ignore_eos: must be true or false, got 1"),
    ([line(id=[1])], "line 1", "id: must be a non-empty string or an integer, got [1]"),
    ([line(id="")], "line 1", "id: must be a non-empty string or an integer"),
    ([line(id="a"), OK, line(id="a")], "line 3", "id: duplicate id 'a' (first on line 1)"),
    ([line(id=2), OK], "line 2", "id: duplicate id '2' (first on line 1)"),
    (['{"top_k": 1, "prompt_len": 2, "top_k": 2, "max_tokens": 1}'], "line 1",
     "top_k: key given twice"),
    ([OK, line(top_k=-1), line(top_p=2)], "line 2", "top_k: must be"),  # the first problem
]  # fmt: skip


@pytest.mark.parametrize(("lines", "where", "problem"), BAD_TRACES)
def test_malformed_trace_line(tmp_path: Path, lines: list[Any], where: str, problem: str) -> None:
    path = write_trace(tmp_path, lines)
    with pytest.raises(ScenarioError) as info:
        build(section(tmp_path, trace="traffic.jsonl"), max_model_len=4096)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {where}: {problem}")
    assert info.value.file == str(path)


def test_invalid_utf8_line(tmp_path: Path) -> None:
    path = tmp_path / "traffic.jsonl"
    path.write_bytes(json.dumps(OK).encode() + b'\n{"id": "\xff"}\n')
    with pytest.raises(ScenarioError, match="line 2: not valid UTF-8"):
        build(section(tmp_path, trace="traffic.jsonl"))


def test_empty_trace(tmp_path: Path) -> None:
    path = write_trace(tmp_path, ["", "   "])
    with pytest.raises(ScenarioError) as info:
        build(section(tmp_path, trace="traffic.jsonl"))
    assert str(info.value) == f"{path}: trace has no requests"
