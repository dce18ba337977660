"""Async scheduling (step N+1 queued before step N's tokens are read) against the synchronous
loop, the UVA path against the copied one, and the pieces they rest on: output placeholders in
the scheduler, delayed slot reuse, the pinned rings and the UVA gather kernel.

CPU tests run the torch path (and the gather kernel under the Triton interpreter); the ``gpu``
tests run the Triton path with UVA on the GPU, bit-exact in fp32, and the steady-state decode
loop under ``torch.cuda.set_sync_debug_mode('error')``.
"""

from __future__ import annotations

import pytest
import torch
from test_engine import generate
from test_kernel_set import cfg, drive

from mrv2_prof.runner.config import ConfigError, ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker.request_states import RequestStates
from mrv2_prof.runner.worker.uva import PinnedRing, take
from mrv2_prof.runner.worker.uva_triton import gather_triton

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
ABORTED = {"r2", "r9"}  # ``drive`` aborts these at fixed steps

PARAMS = [
    SamplingParams(max_tokens=24, ignore_eos=True),
    SamplingParams(max_tokens=17, temperature=0.8, seed=11, ignore_eos=True),
    SamplingParams(max_tokens=20, temperature=1.0, top_k=20, top_p=0.9, ignore_eos=True),
    SamplingParams(max_tokens=9, temperature=0.7, top_p=0.5, logprobs=3, ignore_eos=True),
]


def run_drive(device="cpu", dtype=None, **runner) -> tuple[Engine, dict[str, list[int]]]:
    spec = ModelSpec(preset="llama-tiny", dtype=dtype)
    engine = Engine(cfg(device=device, **runner), spec)
    return engine, drive(engine, seed=3, params=PARAMS)


def assert_same_tokens(got: dict, want: dict) -> None:
    """Equal outputs; an aborted request may have fewer tokens (aborts land at a fixed step,
    and async has one of its tokens still in flight then), but never different ones."""
    assert got.keys() == want.keys()
    for rid in want:
        if rid in ABORTED:
            n = min(len(got[rid]), len(want[rid]))
            assert got[rid][:n] == want[rid][:n], rid
            assert abs(len(got[rid]) - len(want[rid])) <= 1, rid
        else:
            assert got[rid] == want[rid], rid


def assert_clean(engine: Engine) -> None:
    """Nothing left behind: no slots, no blocks, no placeholders, nothing in flight."""
    engine.step()  # hands the last finished ids to the runner
    assert not engine.has_unfinished_requests()
    assert len(engine.runner.req_states.slot_of) == 0
    engine.kv_cache_manager.check_consistency()
    assert engine.kv_cache_manager.num_free_blocks == engine.info.num_kv_blocks


def test_async_gives_the_synchronous_tokens():
    """Greedy and seeded sampling (temperature, top-k, top-p, logprobs) through chunked prefill,
    preemption and aborts: async scheduling changes when the host learns a token, not which."""
    sync_engine, sync_out = run_drive(async_scheduling=False)
    async_engine, async_out = run_drive(async_scheduling=True)
    assert_same_tokens(async_out, sync_out)
    assert all(len(sync_out[f"r{i}"]) == PARAMS[i % 4].max_tokens for i in (0, 1, 3, 5))
    assert_clean(async_engine)
    assert not any(r.num_output_placeholders for r in async_engine.scheduler.requests.values())


class CallLog:
    """Wraps the runner's two halves to record the order of queue and wait calls."""

    def __init__(self, engine: Engine) -> None:
        self.calls: list[tuple[str, int]] = []
        runner, step = engine.runner, {"n": 0}
        queue, wait = runner.queue_step, runner.wait_output
        ids = {}

        def queue_step(so, *a, **k):
            pending = queue(so, *a, **k)
            ids[id(pending)] = step["n"]
            self.calls.append(("queue", step["n"]))
            step["n"] += 1
            return pending

        def wait_output(pending):
            self.calls.append(("wait", ids[id(pending)]))
            return wait(pending)

        runner.queue_step, runner.wait_output = queue_step, wait_output


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_step_n_plus_1_is_queued_before_step_n_is_waited_for(async_scheduling):
    engine = Engine(cfg(device="cpu", async_scheduling=async_scheduling), ModelSpec())
    log = CallLog(engine)
    prompts = {f"r{i}": list(range(5 + i, 15 + 2 * i)) for i in range(4)}
    reqs = generate(engine, prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    assert all(r.num_output_tokens == 6 for r in reqs.values())
    waits = [k for kind, k in log.calls if kind == "wait"]
    assert waits == sorted(waits) and len(waits) == len(set(waits))
    for k in waits:
        pos_wait = log.calls.index(("wait", k))
        queued_next = ("queue", k + 1) in log.calls[:pos_wait]
        # sync: each step is read before the next is queued; async: always one step ahead
        assert queued_next == async_scheduling or (async_scheduling and k == waits[-1])


def stop_run(async_scheduling: bool, stop_token: int | None):
    """One greedy request, alone; returns it and the steps that scheduled it."""
    engine = Engine(cfg(device="cpu", async_scheduling=async_scheduling), ModelSpec())
    stops = (stop_token,) if stop_token is not None else ()
    params = SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=stops)
    req = engine.add_request("a", list(range(20, 33)), params)
    scheduled = 0
    while engine.has_unfinished_requests():
        scheduled += "a" in engine.step().scheduler_output.num_scheduled_tokens
    return req, scheduled


def test_a_stop_found_one_step_late_discards_the_extra_token():
    base, base_steps = stop_run(False, None)
    stop = base.output_token_ids[3]
    sync_req, sync_steps = stop_run(False, stop)
    async_req, async_steps = stop_run(True, stop)
    n = base.output_token_ids.index(stop) + 1
    assert sync_req.output_token_ids == async_req.output_token_ids == base.output_token_ids[:n]
    assert sync_req.finish_reason == async_req.finish_reason == "stop"
    # the async loop had already queued the next decode when the stop token came back
    assert async_steps == sync_steps + 1 == n + 1
    # a length limit is known ahead: no wasted step
    length_req, length_steps = stop_run(True, None)
    assert length_req.output_token_ids == base.output_token_ids
    assert length_steps == base_steps == 10


def test_seeded_sampling_does_not_depend_on_order_composition_or_mode():
    prompts = {f"s{i}": list(range(7 * i + 1, 7 * i + 12 + 3 * i)) for i in range(6)}
    params = [
        SamplingParams(max_tokens=8, temperature=0.9, seed=100 + i, top_k=40, ignore_eos=True)
        if i % 2
        else SamplingParams(max_tokens=8, temperature=1.2, top_p=0.8, ignore_eos=True)
        for i in range(6)
    ]

    def run(async_scheduling: bool, order: list[str], stagger: int) -> dict[str, list[int]]:
        engine = Engine(cfg(device="cpu", async_scheduling=async_scheduling), ModelSpec())
        reqs, step = {}, 0
        pending = list(order)
        while pending or engine.has_unfinished_requests():
            for _ in range(stagger or len(pending)):
                if pending:
                    rid = pending.pop(0)
                    i = int(rid[1:])
                    reqs[rid] = engine.add_request(rid, prompts[rid], params[i], float(step))
            engine.step()
            step += 1
        return {rid: r.output_token_ids for rid, r in reqs.items()}

    together = run(False, list(prompts), 0)
    assert run(True, list(reversed(prompts)), 1) == together
    assert run(True, list(prompts), 2) == together
    assert len({tuple(v) for v in together.values()}) == 6


def test_a_freed_slot_is_reused_only_after_the_lag():
    rs = RequestStates(4, 32, torch.device("cpu"), staged_writes=True, reuse_lag=1)
    p = SamplingParams()
    rs.begin_step()
    a = rs.add_request("a", [1, 2], 0, p, seed=0)
    rs.apply_writes()
    rs.begin_step()
    rs.remove_request("a")
    b = rs.add_request("b", [3], 0, p, seed=0)
    rs.apply_writes()
    assert b != a  # step N-1 may still read slot a on the GPU
    rs.begin_step()
    c = rs.add_request("c", [4], 0, p, seed=0)
    rs.apply_writes()
    assert c == a
    assert rs.prefill_token_ids.gpu[a, :1].tolist() == [4]
    no_lag = RequestStates(4, 32, torch.device("cpu"), staged_writes=True)
    x = no_lag.add_request("x", [1], 0, p, seed=0)
    no_lag.apply_writes()
    no_lag.remove_request("x")
    assert no_lag.add_request("y", [1], 0, p, seed=0) == x


def test_async_needs_room_for_the_slots_of_one_more_step():
    with pytest.raises(ConfigError, match=r"runner.max_num_reqs: 30 .* at least .* 32"):
        RunnerConfig(max_num_reqs=30, max_num_seqs=16, async_scheduling=True)
    RunnerConfig(max_num_reqs=30, max_num_seqs=16, async_scheduling=False)


def test_uva_without_triton_is_a_note_or_under_strict_an_error():
    engine = Engine(cfg(device="cpu", uva=True), ModelSpec())
    assert not engine.runner.uva
    assert any(n.startswith("runner.uva: needs the Triton kernels") for n in engine.info.notes)
    with pytest.raises(ConfigError, match=r"runner.uva.*strict"):
        Engine(cfg(device="cpu", uva=True, strict=True), ModelSpec())


def test_pinned_ring_hands_out_its_buffers_in_turn():
    ring = PinnedRing(5, torch.int32, pin=CUDA, depth=3)
    got = [ring.next() for _ in range(7)]
    ptrs = [t.data_ptr() for t, _ in got]
    assert len(set(ptrs[:3])) == 3 and ptrs[3:6] == ptrs[:3] and ptrs[6] == ptrs[0]
    tensor, view = got[0]
    view[:] = [5, 4, 3, 2, 1]
    assert tensor.tolist() == [5, 4, 3, 2, 1]  # the numpy view is the same memory
    assert tensor.is_pinned() == CUDA


def gather_ref(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The torch reference of ``gather_triton``: ``src[idx]`` on ``idx``'s device."""
    return src[idx.long().to(src.device)].to(idx.device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
@pytest.mark.parametrize("n", [0, 1, 127, 128, 300])
def test_gather_kernel_matches_the_reference(dtype, n):
    """Under the interpreter on CPU (src on the host); on the GPU ``src`` is pinned (UVA)."""
    g = torch.Generator().manual_seed(n)
    src = (torch.randn(257, generator=g) * 1000).to(dtype)
    idx = torch.randint(0, 257, (n,), generator=g, dtype=torch.int32)
    if CUDA:
        src, idx = src.pin_memory(), idx.cuda()
    out = gather_triton(src, idx)
    assert out.device == idx.device and out.dtype == dtype
    assert torch.equal(out, gather_ref(src, idx))
    assert torch.equal(take(src, idx), out)


def test_take_gathers_through_the_kernel_with_int32_indices_whatever_the_caller_has(monkeypatch):
    """A table on another device than the indices (pinned host memory, read through UVA) goes
    to the gather kernel with int32 indices: the speculative samplers index with int64 slots,
    and a second index dtype would be a kernel variant the warm-up never compiled."""
    import mrv2_prof.runner.worker.uva_triton as uva_triton

    seen = []
    monkeypatch.setattr(uva_triton, "gather_triton", lambda s, i: seen.append(i.dtype) or s)
    src = torch.arange(5, dtype=torch.int64)
    for dtype in (torch.int32, torch.int64):
        take(src, torch.zeros(3, dtype=dtype, device="meta"))
    assert seen == [torch.int32, torch.int32]
    assert torch.equal(take(src, torch.tensor([4, 0], dtype=torch.int64)), torch.tensor([4, 0]))


@pytest.mark.gpu
@needs_cuda
def test_prepare_inputs_reads_a_pinned_prompt_table_in_place():
    from mrv2_prof.runner.worker.input_batch import prepare_inputs_ref
    from mrv2_prof.runner.worker.input_batch_triton import prepare_inputs_triton

    g = torch.Generator().manual_seed(0)
    slots, max_len, max_blocks, block = 64, 2048, 128, 16
    table = torch.randint(0, 50_000, (slots, max_len), generator=g, dtype=torch.int32)
    pinned = table.pin_memory()
    counts = torch.randint(1, 300, (40,), generator=g, dtype=torch.int32)
    idx = torch.randperm(slots, generator=g)[:40].to(torch.int32)
    computed = torch.randint(0, 1500, (slots,), generator=g, dtype=torch.int32)
    prefill = (computed + torch.randint(-200, 300, (slots,), generator=g)).clamp(min=1)
    last = torch.randint(0, 50_000, (slots,), generator=g)
    bt = torch.randint(0, 5000, (slots, max_blocks), generator=g, dtype=torch.int32)
    i, c, done, pre, ls, b = (
        t.cuda() for t in (idx, counts, computed, prefill.to(torch.int32), last, bt)
    )
    n = int(counts.sum())
    want = prepare_inputs_ref(i, c, n, done, pre, table.cuda(), ls, b, block)
    got = prepare_inputs_triton(i, c, n, done, pre, pinned, ls, b, block)
    for key in want:
        assert torch.equal(got[key].long(), want[key].long()), key


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("staged_writes", [True, False])
def test_async_and_uva_give_the_reference_tokens_on_the_gpu_fp32(staged_writes):
    """Every combination of async scheduling and UVA on the Triton path gives the tokens of the
    synchronous torch path, bit-exact in fp32, through chunked prefill, preemption and aborts."""
    ref_engine, ref = run_drive("cuda", "float32", kernels="torch", staged_writes=staged_writes)
    for async_scheduling in (False, True):
        for uva in (False, True):
            engine, out = run_drive(
                "cuda",
                "float32",
                kernels="triton",
                async_scheduling=async_scheduling,
                uva=uva,
                staged_writes=staged_writes,
            )
            assert engine.runner.uva == uva
            table = engine.runner.req_states.prefill_token_ids.gpu
            assert (table.device.type == "cpu" and table.is_pinned()) == uva
            assert_same_tokens(out, ref)
            assert_clean(engine)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_the_steady_state_decode_loop_has_no_hidden_syncs(async_scheduling):
    """Under ``set_sync_debug_mode('error')`` any synchronising CUDA call raises, except the one
    designed wait for the sampled tokens. Admission, decode (greedy, seeded top-k, logprobs) and
    finishing steps all run in it."""
    engine = Engine(
        RunnerConfig(
            device="cuda",
            kernels="triton",
            async_scheduling=async_scheduling,
            uva=True,
            cudagraph_mode="none",
            max_num_seqs=64,
            max_model_len=512,
            num_kv_blocks=2048,
        ),
        ModelSpec(preset="llama-tiny", dtype="bfloat16"),
    )
    greedy = SamplingParams(max_tokens=48, ignore_eos=True)
    seeded = SamplingParams(max_tokens=40, temperature=0.8, top_k=50, seed=1, ignore_eos=True)
    with_logprobs = SamplingParams(max_tokens=30, temperature=0.5, logprobs=2, ignore_eos=True)
    kinds = [seeded, greedy, greedy, with_logprobs]
    for i in range(48):
        engine.add_request(f"r{i}", list(range(1 + i, 33 + i)), kinds[i % 4])
    for _ in range(3):  # the first prefills (and any lazy initialisation) run unchecked
        engine.step()
    steps = 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(48, 64):  # late arrivals: admission and prefill inside the checked loop
            engine.add_request(f"r{i}", list(range(100 + i, 140 + i)), greedy)
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert steps > 40
    assert engine.scheduler.num_unfinished == 0
