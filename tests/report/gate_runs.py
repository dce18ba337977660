"""Hand-made runs for the compare and gate tests; every metric value is worked out below.

Times in ms after T0. Percentiles are DuckDB's quantile_cont (linear): over sorted v[0..n-1],
p_q sits at position q * (n - 1).

BASE (run aaa111)
  r0 stop: arrival 0, tokens 10 20 30 40        r1 stop: arrival 0, tokens 20 30 40 50
  TTFT [10, 20]            -> p50 15, p95 10 + 0.95*10 = 19.5, p99 19.9
  TPOT [30/3, 30/3]        -> 10 at every percentile
  ITL  six gaps of 10      -> 10 at every percentile
  duration 50 ms           -> 2 / 0.05 = 40 req/s, 8 / 0.05 = 160 tok/s
  steps host_prep 100 100 200, hidden 50 100 50          -> overlap 200/400 = 0.5
  bubbles 1 2 4 ms, kinds host_bound other host_bound    -> host_bound_bubble_ms 5
  3 syncs; dispatch hits T T T F -> 0.75; GPU memory 1, 3, 2 GiB -> peak 3072 MiB
  info capture_s 2, startup_s 10; errors 0, aborts 0, preemptions 0
  spec decode: steps 0 and 1 draft 4 tokens each, verifies (drafted, accepted) 2/2 2/1 2/0 2/2
    -> 4 drafts, 5 accepted -> mean_acceptance_length 1 + 5/4 = 2.25
  draft spans 1 ms in steps 0, 1; forward + sample 2 + 1 ms in steps 0, 1, 2 (step 2 drafts
    nothing: not a verify) -> draft 2 ms, verify 6 ms -> draft_time_share 2/8 = 0.25
  draft slots reserved 4 4 0, reclaimed 1 2 0 (the rejected drafts of the verifies read in steps
    0 and 1) -> spec_reclaimed_share 3/8 = 0.375; no request sat out -> spec_sat_out_steps 0
  KV blocks used 2 5 3 of 10 -> peak_kv_usage 0.5; runner_cpu_util 1.0 -> host_cpu_util 1.0
  one compile at start-up (step -1) -> compiles_after_warmup 0
  roofline: 1 GB of weights per step at 1 TB/s (1 ms) over 2 ms of GPU time per decode step
    -> decode_roofline 0.5
  NVML energy counter 1000 mJ at 5 ms, 1700 mJ at 45 ms; tokens in (5, 45]: r0 10 20 30 40,
    r1 20 30 40 -> joules_per_output_token 0.7 / 7 = 0.1

WORSE (run bbb222): BASE with
  r0 preempted once; r1 tokens 20 30 40 62; r2 never finished; r3 aborted at 5 ms, no tokens
  TTFT as BASE (15, 19.5, 19.9); TPOT [10, 42/3 = 14] -> p50 12, p95 13.8, p99 13.96
  ITL [10 10 10 10 10 22]  -> p50 10, p95 (pos 4.75) 10 + 0.75*12 = 19, p99 (pos 4.95) 21.4
  duration 62 ms           -> 2 / 0.062 req/s, 8 / 0.062 tok/s
  hidden 50 50 50 -> overlap 150/400 = 0.375; all bubbles host_bound -> 7 ms
  5 syncs; hits T F F F -> 0.25; GPU memory 4 GiB -> 4096 MiB; capture_s 3, startup_s 11
  errors 1 (r2), aborts 1 (r3), preemptions 1
  verifies 2/0 2/1 2/0 2/1 -> 1 + 2/4 = 1.5; draft spans 3 ms -> 6 / (6 + 6) = 0.5
  reclaimed 3 3 0 -> 6/8 = 0.75; requests sat out 0 1 2 -> spec_sat_out_steps 2
  KV blocks used 2 8 3 of 10 -> peak_kv_usage 0.8; runner_cpu_util 1.5 -> host_cpu_util 1.5
  a compile at start-up and one in step 1 -> compiles_after_warmup 1
  4 ms of GPU time per step -> decode_roofline 0.25
  energy counter 1000 mJ at 5 ms, 2400 mJ at 45 ms -> 1.4 / 7 = 0.2 J per output token

SLIGHT (run ccc333): BASE with r1's last token at 50.5, no steps and no GPU samples
  ITL [10 10 10 10 10 10.5] -> p50 10, p95 10.375, p99 10 + 0.95*0.5 = 10.475 (+4.75%)
  TPOT [10, 30.5/3]; duration 50.5 ms; peak_gpu_mem, overlap, host_bound_bubble_ms,
  peak_kv_usage, host_cpu_util, decode_roofline, joules_per_output_token: None
  no drafts: mean_acceptance_length, draft_time_share, spec_sat_out_steps,
    spec_reclaimed_share: None
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mrv2_prof.store import Store

MS = 1_000_000
GIB = 2**30
T0 = 7_000_000_000_000


def _ns(ms: float) -> int:
    return T0 + round(ms * MS)


def add_run(
    store: Store,
    run_id: str,
    *,
    requests: list[tuple[str, float, str | None, int, float | None]],
    tokens_ms: dict[str, list[float]],
    steps: dict[str, list] | None = None,
    num_syncs: int = 0,
    hits: tuple[bool, ...] = (),
    gpu_mem_gib: tuple[float, ...] = (),
    info: dict | None = None,
    verifies: tuple[tuple[int, str, int, int], ...] = (),
    spans: tuple[tuple[int, str, float, float], ...] = (),
    energy: tuple[tuple[float, int], ...] = (),
    compiles: tuple[int, ...] = (),
) -> None:
    """``requests``: (req_id, arrival_ms, finish_reason, num_preemptions, finish_ms or None for
    the last token's time)."""
    store.begin_run(
        run_id,
        scenario_name="gate",
        label=f"gate[{run_id}]",
        matrix_combo=None,
        scenario_yaml="name: gate\n",
        device="cuda:0",
        versions={},
        started_ns=T0,
        info=info,
    )
    cols: dict[str, list] = {k: [] for k in ("req_id", "arrival_ns", "first_token_ns")}
    cols |= {k: [] for k in ("finish_ns", "output_tokens", "num_preemptions", "finish_reason")}
    for req_id, arrival_ms, reason, preemptions, finish_ms in requests:
        times = tokens_ms.get(req_id, [])
        if finish_ms is None and reason is not None:
            finish_ms = times[-1]
        cols["req_id"].append(req_id)
        cols["arrival_ns"].append(_ns(arrival_ms))
        cols["first_token_ns"].append(_ns(times[0]) if times else None)
        cols["finish_ns"].append(None if finish_ms is None else _ns(finish_ms))
        cols["output_tokens"].append(len(times))
        cols["num_preemptions"].append(preemptions)
        cols["finish_reason"].append(reason)
    store.append(run_id, "requests", cols)
    rows = [(req, i, ms) for req, times in tokens_ms.items() for i, ms in enumerate(times)]
    store.append(
        run_id,
        "tokens",
        {
            "req_id": [r for r, _, _ in rows],
            "idx": [i for _, i, _ in rows],
            "t_ns": [_ns(ms) for _, _, ms in rows],
        },
    )
    if steps:
        num_steps = len(steps["host_prep_ns"])
        store.append(run_id, "steps", {"step": list(range(num_steps)), **steps})
    if num_syncs:
        kinds = ["implicit"] * num_syncs
        store.append(run_id, "syncs", {"step": list(range(num_syncs)), "kind": kinds})
    if hits:
        store.append(run_id, "graph_dispatch", {"step": list(range(len(hits))), "hit": list(hits)})
    if gpu_mem_gib:
        store.append(
            run_id,
            "gpu_samples",
            {
                "t_ns": [_ns(i) for i in range(len(gpu_mem_gib))],
                "mem_used_bytes": np.array([round(g * GIB) for g in gpu_mem_gib], dtype=np.int64),
            },
        )
    if energy:  # NVML energy counter samples: (ms, mJ)
        store.append(
            run_id,
            "gpu_samples",
            {"t_ns": [_ns(ms) for ms, _ in energy], "energy_mj": [mj for _, mj in energy]},
        )
    if verifies:
        names = ("step", "req_id", "num_draft_tokens", "num_accepted_tokens")
        columns = zip(names, zip(*verifies, strict=True), strict=True)
        store.append(run_id, "spec_verifies", {n: list(c) for n, c in columns})
    if spans:  # host spans: (step, name, start ms, end ms)
        store.append(
            run_id,
            "spans",
            {
                "step": [s for s, _, _, _ in spans],
                "track": ["cpu"] * len(spans),
                "name": [n for _, n, _, _ in spans],
                "start_ns": [_ns(a) for _, _, a, _ in spans],
                "end_ns": [_ns(b) for _, _, _, b in spans],
            },
        )
    if compiles:  # Triton compiles at these steps (-1: start-up), 250 ms each
        store.append(
            run_id,
            "compiles",
            {
                "step": list(compiles),
                "source": ["triton"] * len(compiles),
                "kernel": ["_advance_kernel"] * len(compiles),
                "key": ["int64@16, =1"] * len(compiles),
                "compile_ms": [250.0] * len(compiles),
                "after_warmup": [s >= 0 for s in compiles],
            },
        )
    store.finish_run(run_id, "completed", ended_ns=_ns(100))


# the roofline's constants: only the weights count (1 GB a step), read at 1 TB/s
ROOFLINE = {
    "step_cost": {
        "weight_bytes": 10**9, "embed_row_bytes": 0, "kv_bytes_per_token": 0,
        "logits_bytes_per_row": 0, "matmul_flops_per_token": 0, "lm_head_flops_per_row": 0,
        "attn_flops_per_pair": 0,
    },
    "machine_peaks": {"hbm_read_bytes_per_s": 1e12, "hbm_source": "given"},
}  # fmt: skip


def _steps(
    hidden: list[int],
    kinds: list[str],
    kv_used: list[int],
    reclaimed: list[int],
    sat_out: list[int],
    gpu_ms: float,
) -> dict[str, list]:
    return {
        "num_reqs": [2, 2, 2],
        "num_tokens": [2, 2, 2],
        "num_prefill_tokens": [0, 0, 0],
        "context_tokens": [0, 0, 0],
        "attn_pairs": [0, 0, 0],
        "gpu_start_ns": [_ns(10 * i) for i in range(3)],
        "gpu_end_ns": [_ns(10 * i + gpu_ms) for i in range(3)],
        "kv_used_blocks": kv_used,
        "host_prep_ns": [100, 100, 200],
        "hidden_prep_ns": hidden,
        "bubble_ns": [1 * MS, 2 * MS, 4 * MS],
        "bubble_kind": kinds,
        "num_draft_tokens": [4, 4, 0],
        "spec_k": [2, 2, 0],
        "spec_reserved": [4, 4, 0],
        "spec_reclaimed": reclaimed,
        "spec_sat_out": sat_out,
    }


def _spec_spans(draft_ms: float) -> tuple[tuple[int, str, float, float], ...]:
    """``draft_ms`` of drafting in steps 0 and 1; a 2 ms forward and a 1 ms sample in each step."""
    out = []
    for step in range(3):
        t = 10.0 * step
        if step < 2:
            out.append((step, "draft", t, t + draft_ms))
        out += [(step, "forward", t + 4, t + 6), (step, "sample", t + 6, t + 7)]
    return tuple(out)


def add_base(store: Store, run_id: str = "aaa111") -> None:
    add_run(
        store,
        run_id,
        requests=[("r0", 0, "stop", 0, None), ("r1", 0, "stop", 0, None)],
        tokens_ms={"r0": [10, 20, 30, 40], "r1": [20, 30, 40, 50]},
        steps=_steps(
            [50, 100, 50], ["host_bound", "other", "host_bound"], [2, 5, 3], [1, 2, 0], [0, 0, 0], 2
        ),
        num_syncs=3,
        hits=(True, True, True, False),
        gpu_mem_gib=(1, 3, 2),
        info={
            "capture_s": 2.0,
            "startup_s": 10.0,
            "num_kv_blocks": 10,
            "runner_cpu_util": 1.0,
            **ROOFLINE,
        },  # fmt: skip
        verifies=((0, "r0", 2, 2), (0, "r1", 2, 1), (1, "r0", 2, 0), (1, "r1", 2, 2)),
        spans=_spec_spans(1.0),
        energy=((5, 1000), (45, 1700)),
        compiles=(-1,),
    )


def add_worse(store: Store, run_id: str = "bbb222") -> None:
    add_run(
        store,
        run_id,
        requests=[
            ("r0", 0, "stop", 1, None),
            ("r1", 0, "stop", 0, None),
            ("r2", 0, None, 0, None),
            ("r3", 0, "abort", 0, 5),
        ],
        tokens_ms={"r0": [10, 20, 30, 40], "r1": [20, 30, 40, 62]},
        steps=_steps([50, 50, 50], ["host_bound"] * 3, [2, 8, 3], [3, 3, 0], [0, 1, 2], 4),
        num_syncs=5,
        hits=(True, False, False, False),
        gpu_mem_gib=(4,),
        info={
            "capture_s": 3.0,
            "startup_s": 11.0,
            "num_kv_blocks": 10,
            "runner_cpu_util": 1.5,
            **ROOFLINE,
        },  # fmt: skip
        verifies=((0, "r0", 2, 0), (0, "r1", 2, 1), (1, "r0", 2, 0), (1, "r1", 2, 1)),
        spans=_spec_spans(3.0),
        energy=((5, 1000), (45, 2400)),
        compiles=(-1, 1),
    )


def add_slight(store: Store, run_id: str = "ccc333") -> None:
    add_run(
        store,
        run_id,
        requests=[("r0", 0, "stop", 0, None), ("r1", 0, "stop", 0, None)],
        tokens_ms={"r0": [10, 20, 30, 40], "r1": [20, 30, 40, 50.5]},
        num_syncs=3,
        hits=(True, True, True, False),
        info={"capture_s": 2.0, "startup_s": 10.0},
    )


def make_db(path: Path, *adders) -> Path:
    with Store.open(path) as store:
        for add in adders:
            add(store)
    return path
