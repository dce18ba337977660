"""Part (b) engine of ``host_path.py``: the same batch through ``Engine`` directly, the no-op
``Probe`` against ``RecordingProbe`` (drained as the harness drains it), alternating.

The engine's schedule, queue and update calls are wrapped in timers, and inside the queue the
calls that do device work (input prep, model, sampler); per uniform-decode step the median host
time (``StepResult.host_ns`` less the output wait), its calls, the device-side work and the rest,
the bookkeeping. The probe's cost is the difference of the bookkeeping.
"""

from __future__ import annotations

import gc
import statistics
from typing import Any

from host_path_runs import number, scenario

from mrv2_prof.scenario import Scenario

# part_engine's figures per side
ENGINE_KEYS = ("host", "bookkeeping", "schedule", "queue", "device", "update")


class Timed:
    """Accumulates the host time spent inside wrapped callables (per key), for one step."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}

    def wrap(self, key: str, fn):
        import time

        def timed(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                self.ns[key] = self.ns.get(key, 0) + time.perf_counter_ns() - t0

        return timed


def instrument(engine) -> Timed:
    """Time the engine's schedule, queue and update calls, and inside the queue the calls that
    do device work (input prep, model, logits, sampler; the staged-write apply, bound at
    start-up, stays in the bookkeeping): on the CPU these
    compute, on a GPU they launch. Bookkeeping = host time less that device-side work."""
    import dataclasses

    t = Timed()
    runner, sched = engine.runner, engine.scheduler
    sched.schedule = t.wrap("schedule", sched.schedule)
    sched.update_from_output = t.wrap("update", sched.update_from_output)
    runner.queue_step = t.wrap("queue", runner.queue_step)
    k = runner.kernels
    runner.kernels = dataclasses.replace(
        k,
        prepare_inputs=t.wrap("device", k.prepare_inputs),
        sample=t.wrap("device", k.sample),
    )
    model = runner.model
    model.forward = t.wrap("device", model.forward)
    model.compute_logits = t.wrap("device", model.compute_logits)
    return t


def part_engine(args) -> list[dict]:
    """The no-op probe against the recording one, on ``Engine`` directly: host time per
    uniform-decode step by call, and the probe's cost."""
    import time

    from mrv2_prof.pipeline.open_loop import FLUSH_INTERVAL_NS
    from mrv2_prof.probes.api import Probe
    from mrv2_prof.probes.recording import RecordingProbe
    from mrv2_prof.runner.core.request import SamplingParams
    from mrv2_prof.runner.engine import Engine

    sides = ("none", "recording")
    keys = ENGINE_KEYS
    results = []
    for batch in args.batches:
        data = scenario(
            args,
            preset=args.preset,
            num_requests=batch,
            prompt=(16, 32),
            tokens=args.decode_tokens,
            probes={},
            # both engines live at once: a fixed KV pool each (room for every request), not
            # a share of the free GPU memory that the first would take
            runner={}
            if args.quick
            else {
                "cudagraph_capture_sizes": [batch],
                "num_kv_blocks": batch * ((args.decode_tokens + 63) // 16) + 64,
            },
        )
        s = Scenario.from_data(data, "<host_path>")
        engines = {}
        for side in sides:
            probe = RecordingProbe() if side == "recording" else Probe()
            engine = Engine(s.runner_config(), s.model_spec(), probe)
            engines[side] = (engine, probe, instrument(engine))
        per_side: dict[str, dict[str, list[float]]] = {x: {k: [] for k in keys} for x in sides}
        for rep in range(args.repeats):
            for side in sides if rep % 2 == 0 else sides[::-1]:
                engine, probe, timed = engines[side]
                for i in range(batch):
                    prompt = [(7 * i + j) % 500 + 3 for j in range(16 + i % 16)]
                    params = SamplingParams(max_tokens=args.decode_tokens, ignore_eos=True)
                    engine.add_request(f"b{rep}-{i}", prompt, params)
                steps: dict[str, list[int]] = {k: [] for k in keys}
                next_flush = time.perf_counter_ns() + FLUSH_INTERVAL_NS
                while engine.has_unfinished_requests():
                    timed.ns.clear()
                    res = engine.step()
                    so = res.scheduler_output
                    if so.num_reqs == batch and so.total_num_scheduled_tokens == batch:
                        host = res.host_ns - res.runner_output.output_wait_ns
                        steps["host"].append(host)
                        steps["bookkeeping"].append(host - timed.ns.get("device", 0))
                        for k in ("schedule", "queue", "device", "update"):
                            steps[k].append(timed.ns.get(k, 0))
                    if probe.enabled and (time.perf_counter_ns() >= next_flush or probe.fill > 0.5):
                        probe.drain()
                        next_flush = time.perf_counter_ns() + FLUSH_INTERVAL_NS
                if probe.enabled:
                    probe.drain()
                for k in keys:
                    per_side[side][k].append(statistics.median(steps[k]) / 1e3)
        row: dict[str, Any] = {"part": "engine", "batch": batch}
        for side in sides:
            for k in keys:
                row[f"{side}_{k}"] = statistics.median(per_side[side][k])
        row["probe_cost"] = row["recording_bookkeeping"] - row["none_bookkeeping"]
        row["repeats"] = per_side
        results.append(row)
        print(f"  engine batch {batch}: done", flush=True)
        del engines
        gc.collect()
    return results


def markdown_engine(results: list[dict]) -> list[str]:
    """Part (b)'s table (one row per batch and probe) and the probe's cost."""
    lines = []
    eng = [r for r in results if r["part"] == "engine"]
    if eng:
        keys = ENGINE_KEYS
        lines += [
            "Engine alone, per uniform-decode step (median µs; host less the output wait;"
            " device = time inside the input prep, model and sampler calls;"
            " bookkeeping = host - device):",
            "",
            "| batch | probe | " + " | ".join(keys) + " |",
            "| ---: | --- |" + " ---: |" * len(keys),
        ]
        for r in eng:
            for side in ("none", "recording"):
                cells = " | ".join(number(r[f"{side}_{k}"]) for k in keys)
                lines.append(f"| {r['batch']} | {side} | {cells} |")
        lines += [
            "",
            "Probe cost (recording - none, bookkeeping): "
            + ", ".join(f"batch {r['batch']}: {number(r['probe_cost'])} µs" for r in eng),
            "",
        ]
    return lines
