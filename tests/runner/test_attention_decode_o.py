"""The o projection folded into batch-1 decode attention (``attention_decode_o_triton``) and the
GEMV's partial sums (``gemv_triton``'s ``parts``), against their torch references: the RoPE
kernel's, the KV write's and paged attention's references one after the other, then each kv
head's group times its columns of ``W_o`` in float32; a decoder forward with the fold against the
same model without it and against the torch ops. Without CUDA the kernels run in Triton's
interpreter at small sizes; the ``gpu`` tests at real sizes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_attention_decode_rope import TOLS, _case
from test_fused_model import paged_batch

import mrv2_prof.runner.model.attention_decode_o_triton as o_fold
import mrv2_prof.runner.model.attention_decode_rope_triton as rope_fold
import mrv2_prof.runner.model.attention_split_kv_triton as split_kv
from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model import kv_cache_shape, projections_triton
from mrv2_prof.runner.model.gemv_triton import gemv_ref, gemv_triton
from mrv2_prof.runner.model.loader import load_model
from mrv2_prof.runner.model.model_kernels import triton_model_kernels
from tests.runner.attention_batches import DEVICE, assert_close_verbose

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def _o_weight(hidden, kvh, group, head_dim, dtype, seed=3):
    gen = torch.Generator(DEVICE).manual_seed(seed)
    w = torch.randn(hidden, kvh * group * head_dim, generator=gen, device=DEVICE)
    return (w / (group * head_dim) ** 0.5).to(dtype)


@pytest.mark.parametrize("sms", [1, 1000], ids=["few-programs", "many-programs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(2, 1, 64, 16, 80), (1, 4, 32, 8, 48), (3, 3, 32, 16, 100)])
def test_fold_matches_attention_then_each_groups_share_of_o(shape, dtype, sms, monkeypatch):
    """Partial sums [kv_heads, hidden] and the cache left behind; hidden sizes that no tile
    divides; one program a kv head's features or several (``o_rows`` halves its tile while the
    grid has fewer programs than SMs)."""
    monkeypatch.setattr(o_fold, "num_sms", lambda device: sms)
    kvh, group, head_dim, bs, hidden = shape
    args, _, _, _ = _case([(2 * bs + 5, 1)], kvh, group, head_dim, bs, dtype, norm=group == 3)
    w = _o_weight(hidden, kvh, group, head_dim, dtype)
    ref_args = (*args[:9], args[9].clone(), *args[10:])
    want = o_fold.rope_attend_o_ref(*ref_args, w)
    got = o_fold.rope_attend_o_triton(*args, w)
    atol, rtol = TOLS[dtype]
    assert got.shape == (kvh, hidden) and got.dtype == torch.float32
    assert_close_verbose(got, want, 2 * atol, rtol)
    assert_close_verbose(args[9], ref_args[9], atol, rtol)  # the token's k/v at its slot
    # the sum over kv heads is the o projection of the attention output
    attn = rope_fold.paged_decode_rope_triton(*ref_args)  # the cache already holds the token
    full = (attn.reshape(1, -1).float() @ w.float().T)[0]
    assert_close_verbose(got.sum(0), full, 4 * atol, rtol)


def test_without_prefetch_the_same_sums(monkeypatch):
    args, _, _, _ = _case([(21, 1)], 2, 2, 32, 8, torch.float32, norm=False)
    w = _o_weight(40, 2, 2, 32, torch.float32)
    first = o_fold.rope_attend_o_triton(*args, w).clone()
    monkeypatch.setattr(o_fold, "PREFETCH_O", False)
    assert torch.equal(o_fold.rope_attend_o_triton(*args, w), first)


def test_a_token_without_a_slot_writes_nothing():
    args, _, _, _ = _case([(20, 1)], 2, 2, 32, 8, torch.float32, norm=False)
    meta, cache = args[10], args[9]
    meta.slot_mapping[0] = -1
    before = cache.clone()
    o_fold.rope_attend_o_triton(*args, _o_weight(40, 2, 2, 32, torch.float32))
    assert torch.equal(cache, before)


def test_more_than_one_token_is_refused():
    args, _, _, _ = _case([(20, 1), (9, 1)], 2, 2, 32, 8, torch.float32, norm=False)
    with pytest.raises(ValueError, match="one token of one request"):
        o_fold.rope_attend_o_triton(*args, _o_weight(40, 2, 2, 32, torch.float32))


def test_o_rows_keeps_the_tile_and_fills_the_sms():
    assert o_fold.o_rows(2048, 8, 4 * 64, 132) == 64  # llama-1b: 8 x 32 programs
    assert o_fold.o_rows(576, 3, 4 * 64, 132) == 16  # SmolLM2: 3 x 36, the smallest tile
    assert o_fold.o_rows(4096, 8, 4 * 128, 132) == 32  # 16,384 weights a program at most
    assert o_fold.o_rows(1024, 8, 2 * 128, 132) == 32  # qwen3-0.6b: 8 x 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("one_pass", [False, True])
def test_gemv_adds_the_partial_sums_into_its_input_row(dtype, one_pass):
    gen = torch.Generator(DEVICE).manual_seed(0)
    x, w = torch.randn(1, 96, generator=gen, device=DEVICE), torch.randn(40, 96, device=DEVICE)
    g, parts = torch.randn(96, device=DEVICE), torch.randn(3, 96, generator=gen, device=DEVICE)
    x, w, g = x.to(dtype), (w / 8).to(dtype), g.to(dtype)
    before = x.clone()
    got = gemv_triton(x, w, norm=(g, 1e-6), one_pass=one_pass, parts=parts)
    want = gemv_ref(x, w, norm=(g, 1e-6), parts=parts)
    # one_pass keeps g * x in float32 (gemv_triton's docstring): an ulp of the dtype apart
    atol = {torch.float32: 1e-5, torch.float16: 2e-3 if one_pass else 1e-5}[dtype]
    assert_close_verbose(got, want, atol, 1e-4)
    assert torch.equal(x, before)  # the input row is read, not written
    unfolded = gemv_ref((x.float() + parts.sum(0)).to(dtype), w, norm=(g, 1e-6))
    assert torch.equal(want, unfolded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_down_gemv_adds_the_partial_sums_into_the_residual_stream(dtype):
    """``residual = (residual + sum(parts)) + silu_and_mul(gate_up) @ W.T``, each rounded once:
    what the o GEMV's residual epilogue and the down GEMV's round, one after the other."""
    gen = torch.Generator(DEVICE).manual_seed(1)
    gate_up, w = torch.randn(1, 192, generator=gen, device=DEVICE), torch.randn(40, 96)
    res, parts = torch.randn(1, 40, generator=gen, device=DEVICE), torch.randn(2, 40)
    gate_up, w, res, parts = gate_up.to(dtype), (w / 8).to(DEVICE, dtype), res.to(dtype), parts
    stream = res.clone()
    got = gemv_triton(gate_up, w, residual=stream, silu_mul=True, parts=parts.to(DEVICE))
    assert got is stream
    after_o = (res.float() + parts.to(DEVICE).sum(0)).to(dtype)
    want = gemv_ref(gate_up, w, residual=after_o, silu_mul=True)
    assert_close_verbose(got, want, {torch.float32: 1e-5, torch.float16: 2e-3}[dtype], 1e-4)


def test_gemv_refuses_partial_sums_that_do_not_fit():
    x, w = torch.randn(2, 32, device=DEVICE), torch.randn(8, 32, device=DEVICE)
    with pytest.raises(ValueError, match="parts"):
        gemv_triton(x, w, parts=torch.zeros(2, 32, device=DEVICE))  # two rows
    with pytest.raises(ValueError, match="parts"):
        gemv_triton(x[:1], w, parts=torch.zeros(2, 8, device=DEVICE))  # the output's width


def _tiny(monkeypatch, fold: bool, calls: list | None = None):
    """fp32 llama-tiny on the Triton ops, the one-pass fused GEMVs and the RoPE fold; the o fold
    on where ``fold``; ``calls`` gets an entry at each folded attention."""
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", "fused_onepass")
    monkeypatch.setattr(rope_fold, "ROPE_IN_DECODE_ATTENTION", True)
    monkeypatch.setattr(o_fold, "O_FOLD", fold)
    kernels = triton_model_kernels()

    def counted(*a):
        calls.append(1)
        return o_fold.rope_attend_o_triton(*a)

    if calls is not None:
        kernels = replace(kernels, o_fold=replace(kernels.o_fold, rope_attend_o=counted))
    return load_model(ModelSpec(preset="llama-tiny"), DEVICE, torch.float32, kernels=kernels)


def test_folds_o_only_for_one_token_on_the_one_pass_gemvs(monkeypatch):
    model, args = _tiny(monkeypatch, fold=False)
    layer = model.model.layers[0]
    cache = torch.zeros(kv_cache_shape(args, 64, 4), device=DEVICE)
    weights = (layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight)
    one, _ = paged_batch([(9, 1)], 4)
    two, _ = paged_batch([(9, 1), (3, 1)], 4)
    x1, x2 = torch.zeros(1, args.hidden_size, device=DEVICE), torch.zeros(2, args.hidden_size)
    assert not o_fold.folds_o(x1, one, cache, None, *weights)  # off by default
    monkeypatch.setattr(o_fold, "O_FOLD", True)
    assert o_fold.folds_o(x1, one, cache, None, *weights)
    assert not o_fold.folds_o(x2.to(DEVICE), two, cache, None, *weights)  # two tokens
    assert not o_fold.folds_o(x1, one, cache, torch.zeros(args.hidden_size), *weights)  # o bias
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", 2)  # the keys split: the split kernel's
    assert not o_fold.folds_o(x1, one, cache, None, *weights)
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", None)
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", "plain")  # no partial sums there
    assert not o_fold.folds_o(x1, one, cache, None, *weights)
    monkeypatch.setattr(rope_fold, "ROPE_IN_DECODE_ATTENTION", False)
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", "fused_onepass")
    assert not o_fold.folds_o(x1, one, cache, None, *weights)  # no RoPE fold


def _decode(model, args):
    """A batch-1 decode over a cache holding 13 tokens: hidden states, caches."""
    gen = torch.Generator().manual_seed(5)
    shape = kv_cache_shape(args, 64, 4)
    caches = [torch.randn(shape, generator=gen).to(DEVICE) for _ in range(2)]
    meta, positions = paged_batch([(13, 1)], 4)
    with torch.no_grad():
        return model(torch.tensor([77], device=DEVICE), positions, caches, meta), caches


def test_a_decoder_forward_with_the_fold_is_the_forward_without_it(monkeypatch):
    """fp32 llama-tiny, a batch-1 decode step: every layer takes the fold (two calls), and the
    hidden states and caches equal the unfolded Triton path's and the torch ops' ones."""
    calls: list[int] = []
    model, args = _tiny(monkeypatch, fold=True, calls=calls)
    got, got_caches = _decode(model, args)
    assert len(calls) == args.num_hidden_layers
    monkeypatch.setattr(o_fold, "O_FOLD", False)
    want, want_caches = _decode(model, args)
    assert len(calls) == args.num_hidden_layers  # not called without the fold
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(got_caches, want_caches, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    torch_model, _ = load_model(ModelSpec(preset="llama-tiny"), DEVICE, torch.float32)
    ref, _ = _decode(torch_model, args)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_an_engine_serving_one_request_takes_the_fold_and_gives_the_same_tokens(monkeypatch):
    """CPU, the interpreter: fp32 llama-tiny, one request greedy with the runner's decode paths
    set as the fold needs them (one-pass fused GEMVs, the RoPE fold): every batch-1 decode
    step's layers take the fold, and the tokens are the torch ops' ones."""
    if CUDA:
        pytest.skip("the GPU version is test_gpu_an_engine_serving_one_request_...")
    import mrv2_prof.runner.worker.model_runner as model_runner
    from mrv2_prof.runner.worker.kernel_set import triton_kernels

    calls: list[int] = []
    real = o_fold.rope_attend_o_triton
    monkeypatch.setattr(o_fold, "rope_attend_o_triton", lambda *a: calls.append(1) or real(*a))
    want = _serve_one("cpu", "none")
    monkeypatch.setattr(model_runner, "resolve_kernels", lambda r, c: (triton_kernels(), None))
    monkeypatch.setattr(o_fold, "O_FOLD", True)
    assert _serve_one("cpu", "none") == want
    # two layers at each of the nine decode steps after the prefill's token (and the warm-up's)
    assert len(calls) >= 2 * 9 and len(calls) % 2 == 0


def _serve_one(device: str, graphs: str, kernels: str = "torch", tokens: int = 10) -> list[int]:
    """fp32 llama-tiny serving one request greedy: its tokens."""
    from test_kernel_set import cfg

    from mrv2_prof.runner.core.request import SamplingParams
    from mrv2_prof.runner.engine import Engine

    paths = dict(decode_gemv="fused_onepass", rope_in_attention=True, split_kv=False)
    if device == "cuda":
        paths["pdl"] = True
    engine = Engine(
        cfg(device=device, kernels=kernels, cudagraph_mode=graphs, **paths),
        ModelSpec(preset="llama-tiny", dtype="float32"),
    )
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    req = engine.add_request("r", list(range(3, 40)), params)
    while engine.has_unfinished_requests():
        engine.step()
    return req.output_token_ids


# --------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("prefetch", [True, False], ids=["w-before-wait", "w-after-attention"])
@pytest.mark.parametrize(
    "model",
    [
        ("llama-1b", 8, 4, 64, 2048, False),
        ("qwen3-0.6b", 8, 2, 128, 1024, True),
        ("smollm2-135m", 3, 3, 64, 576, False),
    ],  # fmt: skip
    ids=lambda m: m[0],
)
def test_gpu_fold_at_real_sizes(model, prefetch, monkeypatch):
    """bf16 at the presets' head shapes and widths, a 1,000-key context: the partial sums and the
    cache against the references, and their sum against the unfused path's o projection."""
    monkeypatch.setattr(o_fold, "PREFETCH_O", prefetch)
    _, kvh, group, head_dim, hidden, norm = model
    dtype = torch.bfloat16
    args, _, _, _ = _case([(1000, 1)], kvh, group, head_dim, 16, dtype, norm=norm)
    w = _o_weight(hidden, kvh, group, head_dim, dtype)
    ref_args = (*args[:9], args[9].clone(), *args[10:])
    want = o_fold.rope_attend_o_ref(*ref_args, w)
    got = o_fold.rope_attend_o_triton(*args, w)
    torch.cuda.synchronize()
    assert_close_verbose(got, want, 2e-2, 2e-2)
    assert_close_verbose(args[9], ref_args[9], 2e-2, 2e-2)
    attn = rope_fold.paged_decode_rope_triton(*ref_args)
    full = gemv_triton(attn.reshape(1, -1), w)[0].float()  # the unfused o GEMV, rounded
    assert_close_verbose(got.sum(0), full, 3e-2, 2e-2)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("graphs", ["none", "full"])
def test_gpu_an_engine_serving_one_request_gives_the_same_tokens_with_the_fold(graphs, monkeypatch):
    """fp32 llama-tiny, one request greedy (batch-1 decode steps), the one-pass fused GEMVs, PDL
    and the RoPE fold, eagerly and under FULL graphs: the fold is taken at every decode step's
    layers and the tokens are those of the same engine without it and of the torch ops."""

    calls: list[int] = []
    real = o_fold.rope_attend_o_triton
    monkeypatch.setattr(o_fold, "rope_attend_o_triton", lambda *a: calls.append(1) or real(*a))
    want = _serve_one("cuda", graphs, "torch", 24)
    assert _serve_one("cuda", graphs, "triton", 24) == want and calls == []
    monkeypatch.setattr(o_fold, "O_FOLD", True)
    assert _serve_one("cuda", graphs, "triton", 24) == want
    assert len(calls) >= 2 * 23 or graphs == "full"  # eagerly: every layer of 23 decode steps
    assert calls  # under FULL graphs: at the capture (and warm-up) at least


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("preset", ["llama-1b", "qwen3-0.6b"])
def test_gpu_a_batch_1_layer_with_the_fold_is_four_launches(preset, monkeypatch):
    """bf16, the one-pass fused GEMVs and the RoPE fold: a decoder layer at batch 1 runs QKV,
    the fold, gate/up and down (four kernels, five without the fold), and its residual stream
    is the unfolded layer's to bf16 rounding."""
    from test_fused_model import device_kernels

    monkeypatch.setattr(projections_triton, "DECODE_GEMV", "fused_onepass")
    monkeypatch.setattr(rope_fold, "ROPE_IN_DECODE_ATTENTION", True)
    model, args = load_model(
        ModelSpec(preset=preset), DEVICE, torch.bfloat16, kernels=triton_model_kernels()
    )
    cache = torch.randn(kv_cache_shape(args, 64, 16), device=DEVICE).to(torch.bfloat16)
    meta, positions = paged_batch([(150, 1)], 16)
    layer = model.model.layers[3]
    x0 = model.model.embed_tokens(torch.tensor([11], device=DEVICE))
    rope = model.model.rotary_emb.tables(positions, x0.dtype)
    got = {}
    for fold in (False, True):
        monkeypatch.setattr(o_fold, "O_FOLD", fold)
        x, c, x2, c2 = x0.clone(), cache.clone(), x0.clone(), cache.clone()
        with torch.no_grad():
            layer(x, rope, c, meta)  # compile, and the result
            names = device_kernels(lambda: layer(x2, rope, c2, meta))  # noqa: B023
        got[fold] = (x, c, names)
    print(*got[True][2], sep="\n  ")
    assert len(got[False][2]) == 5 and len(got[True][2]) == 4, got
    assert any(n.startswith("_decode_rope_o_kernel") for n in got[True][2])
    torch.testing.assert_close(got[True][1], got[False][1], atol=0, rtol=0)  # the same k/v
    torch.testing.assert_close(got[True][0], got[False][0], atol=0.05, rtol=0.02)
