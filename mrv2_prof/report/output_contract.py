"""The gate's first two stages: static (no note on the candidate) and the output contract.

*Static*: every note a candidate run carries (``runs.info.notes``: a switch it could not honour,
a fallback such as ``runner.device: auto`` landing on the CPU) fails the stage unless allowed
(``--allow-note TEXT``: a note holding TEXT; ``--allow-notes``: every note).

*Output contract*, from the stored tokens of the same seeded workload (the scenario as run's
``seed``, ``model`` and ``workload`` equal; else the stage is skipped and says why): the same
requests; per request the same finish reason (stop, length, abort) and, for a greedy workload
(temperature 0), the same token sequence. The first difference is named by request (in arrival
order) and output position; when the runs stored decoded text, the lines under it show the
request's prompt and both outputs about the first character where they differ. Top-k logprobs
are not stored with the tokens, and prefix-cache hits against misses need a paired run: both
are reported as not checked. Leaks: a run stores, at its end, the request slots and KV blocks
still held (``info.leaks``); with every request finished both must be 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mrv2_prof.analysis.request_list import request_texts
from mrv2_prof.analysis.request_outputs import finish_reasons, token_ids
from mrv2_prof.analysis.run_sides import RunFacts
from mrv2_prof.inputs import limited_yaml
from mrv2_prof.store import Store
from mrv2_prof.views.request_text import around, asked, first_difference
from mrv2_prof.views.safe_text import plain

PASS, FAIL, SKIP = "pass", "FAIL", "skip"
DETAIL = "  "  # a line that belongs to the failure line above it
TEXT_CHARS = 100  # of each output shown about the first difference
PROMPT_CHARS = 80


@dataclass
class StageResult:
    name: str  # static | output contract | load
    status: str  # pass | FAIL | skip | inconclusive
    lines: list[str] = field(default_factory=list)  # what was checked, each failure first


def static_stage(
    candidate: list[RunFacts],
    allowed: list[str],
    allow_all: bool = False,
    baseline: list[RunFacts] | None = None,
) -> StageResult:
    """Each note of the candidate's runs: a new fallback fails the stage unless allowed; a note
    the baseline has too (the same text on any of its runs: the same machine's limits, such as
    no CUDA device) is reported, not failed: it is not a change."""
    lines, failed = [], False
    before = {note for facts in baseline or () for note in facts.notes}
    for facts in candidate:
        for note in facts.notes:
            if note in before:
                lines.append(f"on both sides note on run {facts.run_id}: {plain(note)}")
                continue
            ok = allow_all or any(text in note for text in allowed)
            failed |= not ok
            lines.append(f"{'allowed' if ok else FAIL} note on run {facts.run_id}: {plain(note)}")
    if not lines:
        lines.append(f"no note on the candidate ({len(candidate)} run(s))")
    return StageResult("static", FAIL if failed else PASS, lines)


def _scenario(facts: RunFacts) -> dict[str, Any]:
    try:
        data = limited_yaml.load(facts.scenario_yaml or "")
    except limited_yaml.YamlError:
        return {}
    return data if isinstance(data, dict) else {}


def _workload_key(facts: RunFacts) -> tuple:
    s = _scenario(facts)
    return (repr(s.get("seed")), repr(s.get("model")), repr(s.get("workload")))


def _greedy(facts: RunFacts) -> bool:
    sampling = (_scenario(facts).get("workload") or {}).get("sampling") or {}
    return sampling.get("temperature", 0.0) == 0


def _text_lines(store_a: Store, a: RunFacts, store_b: Store, b: RunFacts, req: str) -> list[str]:
    """The differing request's prompt and both outputs about their first differing character
    (nothing when neither run stored text)."""
    prompt, x = request_texts(store_a, a.run_id, req)
    prompt_b, y = request_texts(store_b, b.run_id, req)
    if x is None and y is None:
        return []
    pos = first_difference(x, y) if x is not None and y is not None else 0

    def shown(text: str | None) -> str:
        return "no text stored" if text is None else f'"{around(text, pos, TEXT_CHARS)}"'

    where = f" from character {pos}" if pos else ""
    lines = []
    prompt = prompt if prompt is not None else prompt_b
    if prompt:
        lines.append(f'{DETAIL}prompt: "{asked(prompt, PROMPT_CHARS)}"')
    lines.append(f"{DETAIL}baseline output{where}: {shown(x)}")
    lines.append(f"{DETAIL}candidate output{where}: {shown(y)} (run {b.run_id})")
    return lines


def _leaks(facts: RunFacts) -> tuple[bool, str]:
    leaks = facts.info.get("leaks")
    if not isinstance(leaks, dict):
        return False, f"leaks: run {facts.run_id} has no leak counters stored (not checked)"
    slots, blocks = leaks.get("request_slots", 0), leaks.get("kv_blocks", 0)
    if leaks.get("unfinished"):
        why = f"{leaks['unfinished']} request(s) still in flight at the end"
        return False, f"leaks: run {facts.run_id} stopped early ({why}; not checked)"
    if slots or blocks:
        return True, (
            f"{FAIL} leaks: run {facts.run_id} still holds {slots} request slot(s) and {blocks} "
            "KV block(s) after every request finished"
        )
    return False, f"leaks: run {facts.run_id} holds no request slot or KV block at its end"


def _stored(tokens: dict[str, list[int | None]]) -> bool:
    return bool(tokens) and all(t is not None for seq in tokens.values() for t in seq)


def _compare_runs(
    store_a: Store, a: RunFacts, store_b: Store, b: RunFacts, greedy: bool
) -> tuple[str, list[str]]:
    """(status, lines: a failure first) for candidate run ``b`` against baseline run ``a``."""
    ta, tb = token_ids(store_a, a.run_id), token_ids(store_b, b.run_id)
    if not (_stored(ta) and _stored(tb)):
        return SKIP, [f"run {b.run_id}: token ids not stored in both runs (not checked)"]
    ra, rb = finish_reasons(store_a, a.run_id), finish_reasons(store_b, b.run_id)
    only_a = [r for r in ra if r not in rb]
    only_b = [r for r in rb if r not in ra]
    if only_a:
        return FAIL, [f"{FAIL} output contract: request {only_a[0]!r} only in the baseline"]
    if only_b:
        return FAIL, [
            f"{FAIL} output contract: request {only_b[0]!r} only in the candidate (run {b.run_id})"
        ]
    order = sorted(ra, key=lambda r: ra[r][1])
    for req in order:
        if ra[req][0] != rb[req][0]:
            return FAIL, [
                f"{FAIL} output contract: request {req!r}: finish reason {ra[req][0]} in the "
                f"baseline, {rb[req][0]} in the candidate (run {b.run_id})",
                *_text_lines(store_a, a, store_b, b, req),
            ]
    checked = [f"finish reasons: {len(order)} requests identical (run {b.run_id})"]
    if not greedy:
        checked.append("tokens: sampled workload (temperature > 0): not part of the contract")
        return PASS, checked
    for req in order:
        sa, sb = ta.get(req, []), tb.get(req, [])
        for pos in range(max(len(sa), len(sb))):
            x = sa[pos] if pos < len(sa) else None
            y = sb[pos] if pos < len(sb) else None
            if x != y:
                want = "nothing" if x is None else f"token {x}"
                got = "nothing" if y is None else f"token {y}"
                return FAIL, [
                    f"{FAIL} output contract: request {req!r} position {pos}: baseline {want}, "
                    f"candidate {got} (run {b.run_id})",
                    *_text_lines(store_a, a, store_b, b, req),
                    *checked,
                ]
    total = sum(len(s) for s in ta.values())
    checked.append(f"greedy tokens: {total} tokens of {len(order)} requests identical")
    return PASS, checked


def contract_stage(
    store_a: Store, baseline: RunFacts, store_b: Store, candidate: list[RunFacts]
) -> StageResult:
    """The output contract of each candidate run against the baseline's first run: FAIL when
    one fails, skip when none could be checked, else pass."""
    result = StageResult("output contract", PASS)
    statuses = []
    for facts in candidate:
        if _workload_key(facts) != _workload_key(baseline):
            statuses.append(SKIP)
            result.lines.append(
                f"run {facts.run_id}: not the same seeded workload as {baseline.run_id} "
                "(seed, model or workload differ): not checked"
            )
            continue
        greedy = _greedy(baseline) and _greedy(facts)
        status, lines = _compare_runs(store_a, baseline, store_b, facts, greedy)
        leaked, line = _leaks(facts)
        statuses.append(FAIL if leaked else status)
        failures = [x for x in [*lines, line] if x.startswith((FAIL, DETAIL))]
        result.lines = failures + result.lines + [x for x in [*lines, line] if x not in failures]
    if FAIL in statuses:
        result.status = FAIL
    elif statuses and all(s == SKIP for s in statuses):
        result.status = SKIP
    result.lines.append("top-k logprobs: not stored with the tokens (not checked)")
    result.lines.append("prefix-cache hit against miss: needs a paired run (not checked)")
    return result
