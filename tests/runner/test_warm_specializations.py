"""A warmed engine serves the shipped scenarios' step shapes with no new Triton specialization.

CPU, ``TRITON_INTERPRET=1``: the engine has every Triton kernel forced in, the specialization
census is taken once start-up is over (the launchers', ``triton_launch.specializations``, and
the directly launched kernels', ``interpreter_census``: the model's norm, rotary, attention,
GEMV and activation kernels), and requests shaped like the shipped scenarios' (greedy;
temperature, top-p and logprobs as mixed_poisson; top-k; a batch of one; chunked prefill with
preemption; n-gram speculation as spec_decode) are served. Every key a step launches must have
been launched by the warm-up: on a GPU each new key is a compile inside a step (or inside a
graph capture: every CPU step is eager, a superset of a GPU run's eager steps, so warming such
a key is right either way).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mrv2_prof.runner.config import ModelSpec, RunnerConfig, SpecDecodeConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker import interpreter_census, triton_launch

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the GPU version is test_compiles_gpu.py's"
)

BASE = RunnerConfig(
    device="cpu",
    max_num_reqs=16,
    max_num_seqs=4,
    max_num_batched_tokens=32,
    max_model_len=80,
    block_size=8,
    num_kv_blocks=40,
    kernels="triton",
    uva=False,
    cudagraph_mode="none",
)
GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)
MIXED = SamplingParams(
    max_tokens=4, temperature=0.8, top_p=0.95, logprobs=5, seed=3, ignore_eos=True
)
TOP_K = SamplingParams(max_tokens=4, temperature=0.7, top_k=20, seed=4, ignore_eos=True)


def _calls() -> dict[str, int]:
    """Launches so far per kernel."""
    out: dict[str, int] = {}
    for launcher in triton_launch.launchers():
        out[launcher.name] = out.get(launcher.name, 0) + launcher.calls
    return out


def _serve(monkeypatch, config: RunnerConfig, waves: list[list[tuple[list[int], SamplingParams]]]):
    """Serve each wave of requests to its end, one wave after the other, on one engine with
    the Triton kernels forced in. Returns the (kernel, key) pairs the steps launched that
    start-up had not, the launches per kernel during the steps, and the engine."""
    import mrv2_prof.runner.worker.model_runner as model_runner
    from mrv2_prof.runner.worker.kernel_set import triton_kernels

    monkeypatch.setattr(model_runner, "resolve_kernels", lambda r, c: (triton_kernels(), None))
    triton_launch.forget_interpreted_specializations()  # this engine's launches only
    with interpreter_census.recording():  # the kernels launched directly, too
        engine = Engine(config, ModelSpec(preset="llama-tiny"))
        try:
            return _serve_waves(engine, waves)
        finally:
            engine.close()


def _specializations() -> dict[str, set[str]]:
    """Every key so far: the launchers' and the directly launched kernels'."""
    return {**triton_launch.specializations(), **interpreter_census.specializations()}


def _serve_waves(engine: Engine, waves):
    """The waves served on a started engine (see ``_serve``)."""
    assert engine.runner.kernels.name == "triton" and engine.info.warmup_s > 0
    warm, calls = _specializations(), _calls()
    # calibration: the direct census is on and saw the model's kernels in the warm-up
    assert {"_rmsnorm_kernel", "_qk_norm_rope_kernel", "_paged_attention_kernel"} <= set(warm)
    for w, wave in enumerate(waves):
        reqs = [
            engine.add_request(f"w{w}r{i}", ids, params, arrival_time=float(i))
            for i, (ids, params) in enumerate(wave)
        ]
        while engine.has_unfinished_requests():
            engine.step()
        assert all(len(r.output_token_ids) == r.sampling_params.max_tokens for r in reqs)
    after, step_calls = _specializations(), _calls()
    new = sorted(
        (kernel, key) for kernel, keys in after.items() for key in keys - warm.get(kernel, set())
    )
    launched = {k: n - calls.get(k, 0) for k, n in step_calls.items() if n > calls.get(k, 0)}
    return new, launched, engine


def _assert_none(new: list[tuple[str, str]]) -> None:
    assert not new, "launched after warm-up (kernel: key):\n" + "\n".join(
        f"{kernel}: {key}" for kernel, key in new
    )


def _prompts(n: int, lengths=(7, 12, 21, 30)) -> list[list[int]]:
    return [list(range(3 + i, 3 + i + lengths[i % len(lengths)])) for i in range(n)]


def test_greedy_then_mixed_then_top_k_launch_nothing_new(monkeypatch):
    """Three waves, each all of one kind (so each batch's sampler flags are that kind's):
    greedy, mixed_poisson's temperature / top-p / logprobs, and top-k."""
    waves = [[(p, params) for p in _prompts(3)] for params in (GREEDY, MIXED, TOP_K)]
    new, launched, _ = _serve(monkeypatch, BASE, waves)
    # calibration: the census is on under the interpreter and saw the step kernels
    for kernel in ("_gumbel_argmax_kernel", "_prepare_inputs_kernel", "_advance_kernel"):
        assert launched.get(kernel), (kernel, launched)
    _assert_none(new)


def test_a_batch_of_one_launches_nothing_new(monkeypatch):
    config = dataclasses.replace(BASE, max_num_seqs=1)
    new, _, _ = _serve(monkeypatch, config, [[(p, MIXED) for p in _prompts(2)]])
    _assert_none(new)


def test_chunked_prefill_and_preemption_launch_nothing_new(monkeypatch):
    config = dataclasses.replace(BASE, num_kv_blocks=11, max_num_batched_tokens=24)
    params = [GREEDY, MIXED]
    requests = [(p, dataclasses.replace(params[i % 2], max_tokens=6)) for i, p in
                enumerate(_prompts(5, (20, 27, 33, 18)))]  # fmt: skip
    new, _, engine = _serve(monkeypatch, config, [requests])
    assert engine.scheduler.num_preemptions > 0
    _assert_none(new)


def test_ngram_speculation_launches_nothing_new(monkeypatch):
    """spec_decode.yaml's ngram cell: greedy, two speculative tokens, drafts on the device."""
    spec = SpecDecodeConfig(method="ngram", num_speculative_tokens=2)
    config = dataclasses.replace(BASE, spec_decode=spec)
    repeated = [5, 6, 7, 8, 9, 10, 11, 12] * 3  # a repeated segment: the n-gram lookup drafts
    requests = [(repeated[i:], dataclasses.replace(GREEDY, max_tokens=6)) for i in range(3)]
    new, launched, _ = _serve(monkeypatch, config, [requests])
    assert launched.get("_walk_kernel") and launched.get("_ngram_step_kernel"), launched
    _assert_none(new)


@pytest.mark.parametrize("decode_gemv", ["plain", "fused_onepass"])
def test_the_kernels_off_until_measured_launch_nothing_new_either(monkeypatch, decode_gemv):
    """With the batch-1 GEMV's one-pass fused path, RoPE folded into decode attention and the
    decode GEMM switched on by the runner's settings (not the defaults on the CPU): a prompt of 21
    tokens alone (a row count of the GEMM's 17-32 class, which no other warm-up shape of an
    80-token budget has), then a greedy wave of three (decode batches of 3, 2 and 1), launch
    nothing the warm-up did not, and the calibration sees both new kernels."""
    from mrv2_prof.runner.model import attention_decode_rope_triton, projections_triton

    config = dataclasses.replace(
        BASE, max_num_batched_tokens=80, max_model_len=96,
        decode_gemv=decode_gemv, decode_gemm="triton", rope_in_attention=True,
    )  # fmt: skip
    waves = [[(list(range(5, 26)), GREEDY)], [(p, GREEDY) for p in _prompts(3)]]
    new, _, _ = _serve(monkeypatch, config, waves)
    seen = interpreter_census.specializations()
    assert {"_paged_decode_rope_kernel", "_gemm_decode_kernel"} <= set(seen), sorted(seen)
    # the engine set the kernels' switches from its config (runner/worker/kernel_paths.py)
    assert decode_gemv == projections_triton.DECODE_GEMV
    assert projections_triton.DECODE_GEMM == "triton"
    assert attention_decode_rope_triton.ROPE_IN_DECODE_ATTENTION
    _assert_none(new)


def test_a_prompt_past_the_decode_gemms_rows_launches_nothing_new(monkeypatch):
    """With the decode GEMM serving 2-256 rows, the batch-1 GEMV's one-pass path and the o
    projection's add + norm after the GEMM, no warm shape under 257 rows launches the add +
    norm kernel (the GEMV serves one row, the GEMM two to 256): a prompt of 260 tokens alone
    does, so the warm-up runs the fewest rows the GEMM does not serve
    (``projections_triton.warm_rows``)."""
    from mrv2_prof.runner.model import projections_triton

    monkeypatch.setattr(projections_triton, "O_ADD_NORM", True)
    config = dataclasses.replace(
        BASE, max_num_seqs=1, max_num_batched_tokens=264, max_model_len=272,
        decode_gemv="fused_onepass", decode_gemm="triton",
    )  # fmt: skip
    new, _, _ = _serve(monkeypatch, config, [[(list(range(5, 265)), GREEDY)]])
    assert "_splits_add_rmsnorm_kernel" in interpreter_census.specializations()  # the switch is on
    _assert_none(new)


def test_the_gemv_at_two_to_four_rows_launches_nothing_new(monkeypatch):
    """With the decode path giving the GEMV up to four rows (``gemv_triton.GEMV_ROWS``, the
    one-pass prologues) beside the decode GEMM: a greedy wave of three finishing one after the
    other (decode batches of 3, 2 and 1) launches no GEMV variant the warm-up did not (its 2-row
    shape; 3 rows take the 4-row variant, which its 4-token shape compiles)."""
    from mrv2_prof.runner.model import gemv_triton

    monkeypatch.setattr(gemv_triton, "GEMV_ROWS", 4)
    config = dataclasses.replace(
        BASE, max_num_batched_tokens=80, max_model_len=96,
        decode_gemv="fused_onepass", decode_gemm="triton",
    )  # fmt: skip
    step_rows, serving, kernel = [], [], gemv_triton.gemv_triton

    def gemv(x, *a, **k):
        if serving:
            step_rows.append(x.shape[0])
        return kernel(x, *a, **k)

    add_request = Engine.add_request
    monkeypatch.setattr("mrv2_prof.runner.model.projections_triton.gemv_triton", gemv)
    monkeypatch.setattr(
        Engine, "add_request", lambda *a, **k: serving.append(1) or add_request(*a, **k)
    )
    wave = [
        (p, dataclasses.replace(GREEDY, max_tokens=n))
        for p, n in zip(_prompts(3), (6, 4, 2), strict=True)
    ]
    new, _, _ = _serve(monkeypatch, config, [wave])
    assert {1, 2, 3} <= set(step_rows), sorted(set(step_rows))  # the decode batches took it
    _assert_none(new)
