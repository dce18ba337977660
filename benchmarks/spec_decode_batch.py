"""One batch of ``spec_decode.py``'s workload through an engine, and what it measured.

``run_batch`` adds the batch's requests and steps the engine until they finish: TPOT from the
host times at which each step's tokens were known, tok/s, engine steps, sat-out requests, the
speculative counters' change over the batch (drafts, accepted tokens per position, padded
slots), the steps adaptive dynamic k turned off, the graphs replayed, and for a draft model its
device time against the step's (``DeviceTimer``: CUDA events, host time on the CPU). Also the
random workload's prompts.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine

SEGMENT = 8  # the random workload's prompts repeat a segment of this many tokens


class DeviceTimer:
    """Device time (CUDA events; host time on the CPU) of every call to ``obj.name``."""

    def __init__(self, obj, name: str) -> None:
        self.spans: list = []
        fn = getattr(obj, name)
        cuda = torch.cuda.is_available() and getattr(obj, "device", None) != torch.device("cpu")
        self.cuda = cuda

        def timed(*args, **kwargs):
            if cuda:
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                out = fn(*args, **kwargs)
                end.record()
            else:
                start = time.perf_counter()
                out = fn(*args, **kwargs)
                end = time.perf_counter()
            self.spans.append((start, end))
            return out

        setattr(obj, name, timed)

    def take_ms(self) -> tuple[float, int]:
        """Milliseconds summed over the calls since the last take, and how many calls."""
        spans, self.spans = self.spans, []
        if self.cuda:
            torch.cuda.synchronize()
            return sum(s.elapsed_time(e) for s, e in spans), len(spans)
        return 1e3 * sum(e - s for s, e in spans), len(spans)


def random_prompts(batch: int, vocab_size: int, prompt: int) -> list[list[int]]:
    """The random workload's prompts of a batch: a random segment each, repeated."""
    rng = np.random.default_rng(batch)
    return [
        np.resize(rng.integers(0, vocab_size, size=SEGMENT), prompt).tolist() for _ in range(batch)
    ]


def run_batch(engine: Engine, prompts: list[list[int]], tag: str, params: SamplingParams) -> dict:
    reqs = [engine.add_request(f"{tag}-{i}", p, params) for i, p in enumerate(prompts)]
    times: dict[str, list[float]] = {}
    spec = engine.scheduler.spec
    stats = spec.stats if spec else None
    before = ()
    if stats is not None:
        before = (stats.num_drafts, stats.num_accepted_tokens, stats.num_padded_slots)
        before += (list(stats.accepted_per_position),)
    adaptive = engine.adaptive
    off_before = adaptive.num_off if adaptive is not None else 0
    replays_before = dict(engine.runner.graphs.replays)
    t_first = None
    steps = sat_out = 0
    while engine.has_unfinished_requests():
        res = engine.step()
        now = time.perf_counter()
        steps += 1
        if spec is not None:
            sat_out += spec.num_sat_out  # requests that sat out the step just scheduled
        for r in res.updated:
            got = times.setdefault(r.request_id, [])
            got.extend([now] * (len(r.output_token_ids) - len(got)))
        if t_first is None and any(len(t) > 1 for t in times.values()):
            t_first = now
    t_end = time.perf_counter()
    timing = {}
    timers = getattr(engine, "bench_timers", None)
    if timers is not None:  # a draft model: its device time against the step's
        draft_ms, n_draft = timers[0].take_ms()
        step_ms, n_steps = timers[1].take_ms()
        timing = {
            "draft_ms": draft_ms / max(n_steps, 1),
            "step_ms": step_ms / max(n_steps, 1),
            "draft_share": draft_ms / step_ms if step_ms > 0 else None,
            "draft_rounds": n_draft,
        }
        graphs = engine.runner.drafter.graphs
        if graphs is not None:
            timing["draft_graph_replays"] = sum(graphs.replays.values())
    tpots = [(t[-1] - t[0]) / (len(t) - 1) for t in times.values() if len(t) > 1]
    drafts = accepted = padded = 0
    per_position: list[int] = []
    if spec is not None:
        drafts = spec.stats.num_drafts - before[0]
        accepted = spec.stats.num_accepted_tokens - before[1]
        padded = spec.stats.num_padded_slots - before[2]  # placeholder draft slots verified
        was = before[3] + [0] * (len(spec.stats.accepted_per_position) - len(before[3]))
        per_position = [n - b for n, b in zip(spec.stats.accepted_per_position, was, strict=True)]
    replayed: dict[str, int] = {}
    for (mode, key), n in engine.runner.graphs.replays.items():
        extra = n - replays_before.get((mode, key), 0)
        name = f"{mode} verify" if isinstance(key, tuple) else mode
        replayed[name] = replayed.get(name, 0) + extra
    output_tokens = sum(len(r.output_token_ids) for r in reqs)
    return {
        "batch": len(prompts),
        "tpot_ms": 1e3 * float(np.mean(tpots)) if tpots else None,
        "tok_s": sum(map(len, times.values())) / (t_end - (t_first or t_end) or 1e-9),
        "output_tokens": output_tokens,
        "prompt_tokens": sum(map(len, prompts)),
        "steps": steps,
        "sat_out": sat_out,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "num_drafts": drafts,
        "num_accepted_tokens": accepted,
        "accepted_per_position": per_position,
        "num_padded_slots": padded,
        "drafts_on": engine.runner.info.spec_drafts_on or None,
        "k_off_steps": adaptive.num_off - off_before if adaptive is not None else None,
        "replays": {k: v for k, v in replayed.items() if v},
        **timing,
    }
