"""What a run says, ranked: small pure rules over ``run_summary`` and ``finding_facts``.

Each rule takes the run's ``RunSummary`` and ``FindingFacts`` and returns one ``Finding`` (a
severity, a one-line text with its number, and where to look) or ``None`` when the run gives it
nothing to say. ``findings`` runs every rule and ranks what fired: severity first (2: costs time
or throughput, 1: worth a look, 0: context), then the rule's weight: the share of the run it
touches, from 0 to 1 (of the steps, the requests, the captured keys, the prompt tokens).
``show`` and the HTML report open with this list; the rules read numbers only, never the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from mrv2_prof.analysis.finding_facts import FindingFacts, finding_facts
from mrv2_prof.analysis.host_contention import assess, contention_text
from mrv2_prof.analysis.kernel_roofline import kernels_far_from_roof
from mrv2_prof.analysis.metrics import RunSummary, run_summary
from mrv2_prof.store.db import Store
from mrv2_prof.views.downgrades import downgrades
from mrv2_prof.views.format import format_bytes

HOST_BOUND_SHARE = 0.10  # host-bound steps below this share of the timed steps are not a finding
KV_FULL_SHARE = 0.95  # KV blocks in use, of all, that count as a full cache without preemptions
SPEC_MIN_STEPS = 8  # verify and plain decode steps (or dynamic-k decisions) a spec verdict needs
BYTECODE_WHY = {  # the bytecode fact's "why" (pipeline/bytecode_cache.py)
    "writing_off": "Python's bytecode writing is off (PYTHONDONTWRITEBYTECODE or -B)",
    "read_only": "their directories are read-only",
}


@dataclass(frozen=True)
class Finding:
    rule: str  # the rule's name: host_bound, unused_graphs, ...
    severity: int  # 2 costs time or throughput, 1 worth a look, 0 context
    weight: float  # the share of the run it touches (0..1); orders one severity's findings
    text: str  # one line, with its number
    where: str  # where to look: a report section, a table, a scenario key


def _pct(share: float) -> str:
    """A share as a percentage: whole numbers from 10 %, one decimal below."""
    return f"{100 * share:.0f} %" if share >= 0.1 else f"{100 * share:.1f} %"


def host_bound(s: RunSummary, f: FindingFacts) -> Finding | None:
    """The GPU waited for the host (between or inside steps) in a share of the timed steps."""
    if f.timed_steps == 0 or f.host_bound_steps == 0:
        return None
    share = f.host_bound_steps / f.timed_steps
    if share < HOST_BOUND_SHARE:
        return None
    text = f"host-bound: the GPU waited for the host in {_pct(share)} of steps"
    details = []
    if s.host_bound_bubble_ms is not None:
        details.append(f"bubbles {s.host_bound_bubble_ms:,.1f} ms")
    if f.host_phase_ms:
        details.append(f"mostly {max(f.host_phase_ms, key=f.host_phase_ms.__getitem__)}")
    if details:
        text += f" ({', '.join(details)})"
    where = "report: GPU bubbles and Step timeline; steps.bubble_kind, steps.starved_ns"
    return Finding("host_bound", 2, share, text, where)


def unused_graphs(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Captured CUDA graph keys that no step replayed: start-up time and pool memory spent."""
    num = int(s.info.get("num_graphs") or 0)
    replayed = s.info.get("graph_keys_replayed")
    if isinstance(replayed, list):
        replayed = len(replayed)
    if not num or not isinstance(replayed, int) or replayed >= num:
        return None
    unused = num - replayed
    text = (
        f"{unused} of {num} captured graph keys were never replayed "
        f"({s.info.get('unused_capture_s', 0):.1f} s of start-up, "
        f"{format_bytes(int(s.info.get('unused_graph_bytes', 0)))} of graph pool)"
    )
    where = "report: Graph capture cost; runner.cudagraph_capture_sizes"
    return Finding("unused_graphs", 1, unused / num, text, where)


def implicit_syncs(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Syncs the sync finder caught (hidden waits for the device), per step, at their site."""
    total = sum(n for _, n in f.implicit_sites)
    if total == 0:
        return None
    site, at_site = f.implicit_sites[0]
    steps = max(f.considered_steps, 1)
    text = (
        f"{total / steps:.2g} implicit syncs per step ({total:,} in {f.considered_steps:,} "
        f"steps), most at {site} ({at_site:,})"
    )
    where = "report: Sync sites; syncs WHERE kind = 'implicit'"
    return Finding("implicit_syncs", 2, min(1.0, total / steps), text, where)


def graph_fallback(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Steps that ran a worse CUDA graph mode than the best one captured, and the main reason."""
    best = "full" if "full" in f.captured_modes else None
    if best is None and "piecewise" in f.captured_modes:
        best = "piecewise"
    total = sum(n for _, _, n in f.dispatches)
    if best is None or total == 0:
        return None
    fell = [(m, r, n) for m, r, n in f.dispatches if m != best and (best == "full" or m == "none")]
    if not fell:
        return None
    num_fell = sum(n for _, _, n in fell)
    mode, reason, _ = max(fell, key=lambda d: d[2])
    share = num_fell / total
    name = "eager" if mode == "none" else mode.upper()
    text = (
        f"{_pct(share)} of steps ({num_fell:,} of {total:,}) fell back from {best.upper()}: "
        f"most to {name} ({reason})"
    )
    return Finding("graph_fallback", 1, share, text, "report: Graph mode per step")


def kv_pressure(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Preemptions (the KV cache ran out of blocks), or a cache that filled without them."""
    total = s.info.get("num_kv_blocks")
    peak = ""
    if f.peak_kv_blocks is not None and isinstance(total, int) and total > 0:
        peak = f" (peak {f.peak_kv_blocks:,} of {total:,} blocks in use)"
    where = "report: Scheduler; steps.num_preempted, steps.kv_used_blocks"
    if s.num_preemptions > 0:
        at = "" if f.first_preemption_step is None else f" at step {f.first_preemption_step}"
        text = f"KV cache full{at}: {s.num_preemptions:,} preemptions{peak}"
        weight = min(1.0, s.num_preemptions / max(s.num_requests, 1))
        return Finding("kv_pressure", 2, weight, text, where)
    if f.peak_kv_blocks is None or not isinstance(total, int) or total <= 0:
        return None
    share = f.peak_kv_blocks / total
    if share < KV_FULL_SHARE:
        return None
    text = f"KV cache {_pct(share)} full at step {f.peak_kv_step}, no preemptions{peak}"
    return Finding("kv_pressure", 1, share, text, where)


def spec_costs_more(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Speculation costs more than it saves: a verify step emits fewer tokens per verifying
    request than it is longer than a plain decode step (tokens per verify / step-time ratio
    below 1; decode-only steps, ``finding_facts``). With too few plain decode steps to time,
    dynamic k's own estimates over the speculating steps decide instead."""
    p = f.spec
    if s.spec_decode is None:
        return None
    if p.verify_steps >= SPEC_MIN_STEPS and p.plain_steps >= SPEC_MIN_STEPS:
        if p.tokens_per_verify is None or p.verify_step_ms is None or not p.plain_step_ms:
            return None
        tokens, cost = p.tokens_per_verify, p.verify_step_ms / p.plain_step_ms
        steps = p.verify_steps
        basis = (
            f"a verify step emits {tokens:.2f} tokens per request but takes {cost:.2f}× a plain "
            f"decode step ({p.verify_steps:,} verify, {p.plain_steps:,} plain steps)"
        )
    elif p.plain_steps < SPEC_MIN_STEPS and p.decided_steps >= SPEC_MIN_STEPS:
        tokens, cost, steps = p.mean_expected_tokens, p.mean_cost_ratio, p.decided_steps
        if tokens is None or cost is None:
            return None
        basis = (
            f"dynamic k expects {tokens:.2f} tokens per verifying request at {cost:.2f}× a plain "
            f"decode step's time (mean of {steps:,} decisions)"
        )
    else:
        return None
    if cost <= 0 or tokens / cost >= 1:
        return None
    text = (
        f"speculation costs more than it saves: {basis}; lower k, set dynamic_k, or turn "
        "speculation off"
    )
    where = (
        "report: Speculative decoding per step; runner.spec_decode.num_speculative_tokens, "
        "runner.spec_decode.dynamic_k, runner.spec_decode.method"
    )
    return Finding("spec_costs_more", 2, min(1.0, steps / max(f.considered_steps, 1)), text, where)


def spec_sat_out(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Requests that sat out steps because the drafts are made on the host: under async
    scheduling a request with tokens in flight cannot draft until they are back."""
    n = f.spec.sat_out_steps
    if n == 0:
        return None
    runner = f.scenario_as_run.get("runner")
    if isinstance(runner, dict) and runner.get("async_scheduling", True) is False:
        return None
    text = (
        f"{n:,} step{'' if n == 1 else 's'} had requests sit out because drafting is on the host "
        f"({f.spec.sat_out_requests:,} request-steps); set runner.spec_decode.draft_on: device"
    )
    where = "report: Speculative decoding per step; steps.spec_sat_out; runner.spec_decode.draft_on"
    return Finding("spec_sat_out", 2, min(1.0, n / max(f.considered_steps, 1)), text, where)


def prefix_cache(s: RunSummary, f: FindingFacts) -> Finding | None:
    """The prefix-cache hit rate: a hit rate worth knowing, or none where prefixes are shared."""
    rate = s.prefix_cache_hit_rate
    if rate is None:
        return None
    workload = f.scenario_as_run.get("workload")
    shared = isinstance(workload, dict) and workload.get("shared_prefix") not in (None, {})
    where = "requests.cached_tokens; runner.enable_prefix_caching, workload.shared_prefix"
    if rate > 0:
        text = (
            f"prefix cache: {_pct(rate)} of prompt tokens hit "
            f"({round(rate * s.prompt_tokens):,} of {s.prompt_tokens:,})"
        )
        return Finding("prefix_cache", 0, rate, text, where)
    if shared:
        runner = f.scenario_as_run.get("runner")
        off = isinstance(runner, dict) and runner.get("enable_prefix_caching") is False
        why = " (runner.enable_prefix_caching is off)" if off else ""
        text = f"prefix cache: 0 % of prompt tokens hit although the workload shares a prefix{why}"
        return Finding("prefix_cache", 1, 1.0, text, where)
    return None


def perturbed(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Steps a probe slowed (a kernel-trace window), left out of the step figures."""
    if not s.perturbed_steps:
        return None
    verb = "included in" if s.includes_perturbed else "left out of"
    n = s.perturbed_steps
    text = (
        f"{n} step{'' if n == 1 else 's'} perturbed by the kernel trace, {verb} overlap, "
        "bubbles, syncs and ITL"
    )
    where = "steps.perturbed; probes.kernel_trace_steps"
    return Finding("perturbed", 0, n / max(s.steps, 1), text, where)


def downgraded(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Settings the run did not honour (the scenario as run against the scenario as given)."""
    found = downgrades(f.scenario_given, f.scenario_as_run)
    if not found:
        return None
    shown = ", ".join(d.short for d in found[:4])
    more = f" and {len(found) - 4} more" if len(found) > 4 else ""
    text = f"{len(found)} settings did not run as asked: {shown}{more}"
    where = "the run's notes; runs.scenario_yaml against runs.scenario_given_yaml"
    return Finding("downgraded", 1, min(1.0, len(found) / 4), text, where)


def host_contention(s: RunSummary, f: FindingFacts) -> Finding | None:
    """A busy or oversubscribed host, or CPU time stolen (``host_contention``: the rules)."""
    c = assess(s.environment)
    if c is None or not c.contended:
        return None
    where = "runs.environment: load_avg_start/end, torch_threads, cpu_steal_ticks; OMP_NUM_THREADS"
    return Finding("host_contention", 2, 1.0, contention_text(c), where)


def compiles_after_warmup(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Kernels compiled after warm-up (a launcher's cache miss in a step): a request paid for
    each; named with its step and specialization key (``analysis/compiles.py``)."""
    late = f.late_compiles
    if late.count == 0:
        return None
    n = late.count
    what = "Triton" if all(c.source == "triton" for c in late.compiles) else "kernel"
    named = "; ".join(
        f"kernel {c.kernel} at step {c.step} (key {c.key})" for c in late.compiles[:2]
    )
    more = f"; and {n - 2} more" if n > 2 else ""
    text = (
        f"{n} {what} compile{'' if n == 1 else 's'} after warm-up cost "
        f"{late.total_ms:,.0f} ms: {named}{more}"
    )
    where = "compiles WHERE after_warmup; runner.strict makes one an error"
    run_ms = 1e3 * s.duration_s
    weight = min(1.0, late.total_ms / run_ms) if run_ms > 0 else 1.0
    return Finding("compiles_after_warmup", 2, weight, text, where)


def uncached_bytecode(s: RunSummary, f: FindingFacts) -> Finding | None:
    """Python modules the runner compiled from source and could not cache: every run compiles
    them again (``pipeline/bytecode_cache.py``; torch's import is most of it)."""
    b = s.info.get("bytecode")
    if not isinstance(b, dict) or not b.get("uncached") or not b.get("modules"):
        return None
    if not b.get("torch_uncached") and (b.get("cache") or 10 * b["uncached"] < b["modules"]):
        return None  # torch cached, and a few modules not (those imported before the runner's
        # own cache went on: ``bytecode_cache.cache_bytecode``): some ms, not worth a finding
    n, torch_n = int(b["uncached"]), int(b.get("torch_uncached") or 0)
    text = f"{n:,} of {int(b['modules']):,} Python modules compiled from source, none cached"
    if torch_n and s.info.get("torch_import_s") is not None:
        text += f" (torch's {torch_n:,}: its import took {s.info['torch_import_s']:.1f} s)"
    why = b.get("why")
    text += f": {BYTECODE_WHY.get(why, 'the cause unknown')}, so every run compiles them again"
    fix = "PYTHONPYCACHEPREFIX=<a writable directory>"
    if why == "writing_off":  # a cache prefix is not written either
        fix = "unset PYTHONDONTWRITEBYTECODE"
    where = (f"runs.info bytecode; python -m compileall -q <site-packages> once, or {fix} (the "
             "runner caches it itself unless MRV2_PROF_BYTECODE_CACHE=off or no cache directory "
             "is writable)")  # fmt: skip
    return Finding("uncached_bytecode", 1, n / int(b["modules"]), text, where)


def not_completed(s: RunSummary, f: FindingFacts) -> Finding | None:
    """A run that failed or was stopped: its figures cover only what ran."""
    if s.status in ("completed", "running"):
        return None
    error = f" ({s.error})" if s.error else ""
    text = f"the run {s.status}{error}: {s.num_completed} of {s.num_requests} requests completed"
    return Finding("not_completed", 2, 1.0, text, "runs.status, runs.error")


RULES: tuple[Callable[[RunSummary, FindingFacts], Finding | None], ...] = (
    not_completed, host_contention, host_bound, implicit_syncs, compiles_after_warmup,
    kv_pressure, spec_costs_more, spec_sat_out, graph_fallback, unused_graphs, uncached_bytecode,
    downgraded, prefix_cache, perturbed, partial(kernels_far_from_roof, Finding),
)  # fmt: skip


def findings(s: RunSummary, f: FindingFacts) -> list[Finding]:
    """Every rule that fired, most important first (severity, then weight, then rule order)."""
    fired = [(i, found) for i, rule in enumerate(RULES) if (found := rule(s, f)) is not None]
    fired.sort(key=lambda p: (-p[1].severity, -p[1].weight, p[0]))
    return [found for _, found in fired]


def run_findings(store: Store, run_id: str, summary: RunSummary | None = None) -> list[Finding]:
    """``findings`` of a stored run (``summary``: its ``run_summary``, when already read)."""
    s = summary if summary is not None else run_summary(store, run_id)
    return findings(s, finding_facts(store, run_id, include_perturbed=s.includes_perturbed))
