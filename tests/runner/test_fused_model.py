"""The decoder with the fused Triton ops (``ModelKernels``) against the torch path: merged QKV and
gate/up weights that keep Hugging Face's state-dict names, the same greedy tokens, the same
logits with Qwen2's biases and a per-head QK norm, PIECEWISE segments that write the KV cache
themselves, and on the GPU the same tokens in every graph mode, bf16 parity with transformers,
and at most ten kernels per decoder layer.

CPU tests run the kernels in Triton's interpreter (``tests/conftest.py``); the ``gpu`` tests use
the real kernels and the presets' shapes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_async_scheduling import assert_same_tokens, run_drive
from test_kernel_set import cfg

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.model import RMSNorm, kv_cache_shape, projections_triton
from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.loader import load_model
from mrv2_prof.runner.model.model_kernels import (
    TORCH_MODEL_KERNELS,
    triton_model_kernels,
)
from mrv2_prof.runner.worker.cudagraph_bodies import PiecewiseBody
from mrv2_prof.runner.worker.kernel_set import TORCH

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def paged_batch(
    reqs: list[tuple[int, int]],  # (context already cached, tokens this step) per request
    block_size: int,
    device: torch.device = DEVICE,
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Metadata of one step over a paged cache (request i owns blocks i*64...), and positions."""
    qlens = [q for _, q in reqs]
    qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    seq = np.array([c + q for c, q in reqs], dtype=np.int32)
    width = int(-(-seq.max() // block_size))
    table = [[64 * i + b for b in range(width)] for i in range(len(reqs))]
    positions = [p for c, q in reqs for p in range(c, c + q)]
    slots = [
        table[i][p // block_size] * block_size + p % block_size
        for i, (c, q) in enumerate(reqs)
        for p in range(c, c + q)
    ]
    meta = AttentionMetadata(
        len(reqs),
        int(qsl[-1]),
        torch.from_numpy(qsl).to(device),
        torch.from_numpy(seq).to(device),
        torch.tensor(table, dtype=torch.int32, device=device),
        torch.tensor(slots, dtype=torch.int64, device=device),
        qsl,
        seq,
        block_size,
    )
    return meta, torch.tensor(positions, dtype=torch.int64, device=device)


def logits_through_cache(model, args, prompts: list[torch.Tensor], dtype=torch.float32):
    """Logits of every prompt token: the first halves as prefill chunks, then the second halves
    in one mixed batch over the paged cache."""
    bs = 4
    num_blocks = 64 * len(prompts)
    caches = [
        torch.zeros(kv_cache_shape(args, num_blocks, bs), dtype=dtype, device=DEVICE)
        for _ in range(args.num_hidden_layers)
    ]
    out = []
    halves = [len(p) // 2 for p in prompts]
    with torch.no_grad():
        for step in ("first", "second"):
            reqs = [
                (0, h) if step == "first" else (h, len(p) - h)
                for p, h in zip(prompts, halves, strict=True)
            ]
            meta, positions = paged_batch(reqs, bs)
            ids = torch.cat(
                [p[:h] if step == "first" else p[h:] for p, h in zip(prompts, halves, strict=True)]
            ).to(DEVICE)
            out.append(model.compute_logits(model(ids, positions, caches, meta)))
    return torch.cat(out)


def prompts_for(vocab_size: int, lengths=(11, 6, 9), seed=0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=gen) for n in lengths]


# --------------------------------------------------------------------------------------------
# CPU (the interpreter) and GPU


def test_merged_weights_keep_hugging_face_names(make_hf_checkpoint, tmp_path):
    """One QKV and one gate/up weight per layer (biases too), while the state dict names and
    holds the checkpoint's tensors, and a state dict loads back into a fresh model."""
    path = make_hf_checkpoint(tmp_path, "qwen2", tied=False, num_kv_heads=2)
    hf_state = load_file(str(path / "model.safetensors"))
    model, args = load_model(
        ModelSpec(preset=None, path=str(path)), torch.device("cpu"), torch.float32
    )
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    d = args.head_dim
    assert attn.qkv_proj.weight.shape == (
        (args.num_attention_heads + 2 * args.num_key_value_heads) * d,
        args.hidden_size,
    )
    assert (
        attn.qkv_proj.bias is not None
        and mlp.gate_up_proj.weight.shape[0] == 2 * args.intermediate_size
    )
    names = {n for n, _ in model.named_parameters()}
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert not any(".q_proj." in n or ".up_proj." in n for n in names)
    state = model.state_dict()
    assert state.keys() == hf_state.keys()
    assert all(torch.equal(state[k], hf_state[k]) for k in hf_state)
    assert sum(p.numel() for p in model.parameters()) == sum(t.numel() for t in hf_state.values())
    fresh, _ = load_model(
        ModelSpec(preset=None, path=str(path)), torch.device("cpu"), torch.float32
    )
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(state)
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True)
    )


def test_the_torch_kernel_set_carries_the_torch_model_ops():
    assert TORCH.model is TORCH_MODEL_KERNELS and TORCH.write_kv is TORCH_MODEL_KERNELS.write_kv


@pytest.mark.parametrize("arch", ["llama-qk-norm", "qwen2"])
def test_triton_model_gives_the_torch_logits(make_hf_checkpoint, tmp_path, arch):
    """Chunked prefill and a mixed batch over a paged cache: Qwen2's q/k/v biases, and a
    per-head QK norm (Qwen3's) fitted onto a Llama checkpoint, through both op bundles."""
    path = make_hf_checkpoint(tmp_path, "qwen2" if arch == "qwen2" else "llama")
    spec = ModelSpec(preset=None, path=str(path))
    models = {}
    for name, kernels in (("torch", TORCH_MODEL_KERNELS), ("triton", triton_model_kernels())):
        model, args = load_model(spec, DEVICE, torch.float32, kernels=kernels)
        if arch == "llama-qk-norm":
            gen = torch.Generator().manual_seed(5)
            for layer in model.model.layers:
                for norm in ("q_norm", "k_norm"):
                    module = RMSNorm(args.head_dim, args.rms_norm_eps, kernels.rmsnorm)
                    module.weight.data = (1 + 0.3 * torch.randn(args.head_dim, generator=gen)).to(
                        DEVICE
                    )
                    setattr(layer.self_attn, norm, module)
        models[name] = model
    prompts = prompts_for(args.vocab_size)
    want = logits_through_cache(models["torch"], args, prompts)
    got = logits_through_cache(models["triton"], args, prompts)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


DECODE_PATHS = {  # every decode path on, auto or not (runner/worker/kernel_paths.py)
    "decode_gemv": "fused_onepass", "decode_gemm": "triton", "pdl": True,
    "rope_in_attention": True, "fused_mlp": True,
}  # fmt: skip
PROMPTS = {f"r{i}": list(range(3 + 11 * i, 8 + 21 * i)) for i in range(6)}  # 5..55 tokens


def _greedy_on_cpu(monkeypatch, kernels=None, **runner) -> tuple[Engine, dict[str, list[int]]]:
    """fp32 llama-tiny on the CPU, ``PROMPTS`` greedy through chunked prefill and preemption:
    the engine and each prompt's tokens. ``kernels``: the kernel set forced in (None: the
    torch set the CPU resolves to)."""
    import mrv2_prof.runner.worker.model_runner as model_runner

    if kernels is not None:
        monkeypatch.setattr(model_runner, "resolve_kernels", lambda r, c: (kernels, None))
    engine = Engine(
        cfg(device="cpu", kernels="torch", max_model_len=96, num_kv_blocks=12, uva=False,
            **runner),
        ModelSpec(preset="llama-tiny"),
    )  # fmt: skip
    reqs = {
        rid: engine.add_request(rid, ids, SamplingParams(max_tokens=6, ignore_eos=True))
        for rid, ids in PROMPTS.items()
    }
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.num_preemptions > 0
    return engine, {rid: r.output_token_ids for rid, r in reqs.items()}


def test_triton_model_ops_give_the_torch_greedy_tokens_in_the_interpreter(monkeypatch):
    """CPU, TRITON_INTERPRET=1: the engine with only the model's ops switched to Triton (the
    fused per-layer ops, the KV write and attention) generates the torch path's greedy tokens
    through chunked prefill and preemption, fp32 llama-tiny."""
    if CUDA:
        pytest.skip("the GPU version is test_gpu_triton_model_gives_torch_tokens_in_every_mode")
    _, want = _greedy_on_cpu(monkeypatch)
    engine, got = _greedy_on_cpu(monkeypatch, replace(TORCH, model=triton_model_kernels()))
    assert engine.runner.model.kernels.name == "triton"
    assert got == want


def test_every_decode_path_gives_the_torch_greedy_tokens_in_the_interpreter(monkeypatch):
    """CPU, TRITON_INTERPRET=1: the whole Triton kernel set with every decode path that is off by
    default switched on by the runner's settings (the one-pass fused GEMV at batch 1, the decode
    GEMM for 2-256 rows, RoPE folded into decode attention, the batch-1 MLP in one launch)
    generates the torch path's greedy
    tokens through chunked prefill and preemption, fp32 llama-tiny."""
    if CUDA:
        pytest.skip("the GPU version is test_gpu_triton_model_gives_torch_tokens_in_every_mode")
    from mrv2_prof.runner.worker.kernel_set import triton_kernels

    paths = {k: v for k, v in DECODE_PATHS.items() if k != "pdl"}  # PDL: a GPU's launches
    _, want = _greedy_on_cpu(monkeypatch)
    mlp, fused = projections_triton.mlp_decode_triton, []
    monkeypatch.setattr(projections_triton, "mlp_decode_triton",
                        lambda *a, **k: fused.append(1) or mlp(*a, **k))  # fmt: skip
    _, got = _greedy_on_cpu(monkeypatch, triton_kernels(), **paths)
    assert projections_triton.DECODE_GEMM == "triton"  # the settings reached the kernels
    assert fused, "no batch-1 step ran the MLP in one launch"
    assert got == want


@pytest.mark.parametrize("pad", [0, 5], ids=["exact", "padded"])
def test_piecewise_segments_writing_the_kv_cache_are_the_forward_pass(pad):
    """With the Triton ops and the static slot buffer, the PIECEWISE segments write each layer's
    k/v themselves (padding slots -1 write nothing) and only attention is left between them:
    the hidden states and the KV cache are the forward pass's."""
    model, args = load_model(
        ModelSpec(preset="llama-tiny"), DEVICE, torch.float32, kernels=triton_model_kernels()
    )
    bs = 4
    meta, positions = paged_batch([(5, 4), (0, 3), (8, 1)], bs)
    t, size = meta.num_tokens, meta.num_tokens + pad
    ids = torch.randint(0, args.vocab_size, (t,), generator=torch.Generator().manual_seed(2))

    def caches() -> list[torch.Tensor]:
        shape = kv_cache_shape(args, 3 * 64, bs)
        gens = [torch.Generator().manual_seed(i) for i in range(args.num_hidden_layers)]
        return [torch.randn(shape, generator=g).to(DEVICE) for g in gens]

    want_caches = caches()
    with torch.no_grad():
        want = model(ids.to(DEVICE), positions, want_caches, meta)
    static = {
        name: torch.full((size,), fill, dtype=torch.int64, device=DEVICE)
        for name, fill in (("ids", 0), ("positions", 0), ("slots", -1))
    }
    static["ids"][:t], static["positions"][:t] = ids, positions
    static["slots"][:t] = meta.slot_mapping
    got_caches = caches()
    body = PiecewiseBody(model, got_caches, max_tokens=size, slot_mapping=static["slots"])
    assert body.kv_in_segments
    assert not PiecewiseBody(
        load_model(ModelSpec(preset="llama-tiny"), DEVICE, torch.float32)[0],
        got_caches,
        size,
        static["slots"],
    ).kv_in_segments
    with torch.no_grad():
        segments = body.segments(static["ids"], static["positions"], size)
        hidden = body.run(segments, t, meta)
    if pad == 0:
        assert torch.equal(hidden, want)
        assert all(torch.equal(a, b) for a, b in zip(got_caches, want_caches, strict=True))
    else:  # GEMMs over more rows: the same values up to their blocking
        torch.testing.assert_close(hidden, want, atol=1e-5, rtol=1e-5)
        for got, expected in zip(got_caches, want_caches, strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    "paths",
    [{}, DECODE_PATHS, {**DECODE_PATHS, "decode_gemm": "narrow"}],
    ids=["default-paths", "all-decode-paths", "narrow-gemm"],
)
def test_gpu_triton_model_gives_torch_tokens_in_every_mode(paths):
    """fp32 llama-tiny, a seeded workload with chunked prefill, preemption and aborts: the Triton
    set (fused model ops included) gives the torch set's tokens eagerly and under FULL,
    PIECEWISE and both kinds of graphs; with the default decode paths, with every path
    switched on, and with the decode GEMM held to its narrow bounds (llama-tiny's projections
    all under 1,024 outputs: the Triton GEMM at 2-64 rows, cuBLAS at the others)."""
    _, want = run_drive("cuda", "float32", kernels="torch", cudagraph_mode="none")
    for mode in ("none", "full", "piecewise", "full_and_piecewise"):
        engine, got = run_drive("cuda", "float32", kernels="triton", cudagraph_mode=mode, **paths)
        assert engine.runner.model.kernels.name == "triton"
        if mode != "none":
            assert sum(engine.runner.graphs.replays.values()) > 0, mode
        assert_same_tokens(got, want)


@pytest.mark.gpu
@needs_cuda
def test_gpu_bfloat16_triton_model_matches_hf(make_hf_checkpoint, tmp_path):
    """The fused bf16 path against transformers' bf16 eager model, within the tolerance the torch
    path is held to (tests/runner/test_model.py)."""
    from transformers import AutoModelForCausalLM

    path = make_hf_checkpoint(tmp_path, "llama", num_kv_heads=2)
    model, args = load_model(
        ModelSpec(preset=None, path=str(path)),
        DEVICE,
        torch.bfloat16,
        kernels=triton_model_kernels(),
    )
    hf = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation="eager"
    ).to(DEVICE)
    prompt = prompts_for(args.vocab_size, lengths=(32,), seed=1)[0]
    with torch.no_grad():
        expected = hf(input_ids=prompt[None].to(DEVICE)).logits[0].float()
    got = logits_through_cache(model, args, [prompt], torch.bfloat16)
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0.02)


def device_kernels(fn) -> list[str]:
    """Names of the device activities (kernels, copies) ``fn`` runs, in order."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [e.name for e in sorted(events, key=lambda e: e.time_range.start)]


MAX_KERNELS_PER_LAYER = 10


def layer_and_forward_launches(preset: str, num_reqs: int):
    """bf16, Triton ops, a uniform decode batch of ``num_reqs`` at context ~100: the model's
    args and the device kernels of one decoder layer, of the eager forward and of its FULL
    graph's replay (the paths as the module switches stand)."""
    model, args = load_model(
        ModelSpec(preset=preset), DEVICE, torch.bfloat16, kernels=triton_model_kernels()
    )
    bs = 16
    caches = [
        torch.zeros(kv_cache_shape(args, 64 * num_reqs, bs), dtype=torch.bfloat16, device=DEVICE)
        for _ in range(args.num_hidden_layers)
    ]
    meta, positions = paged_batch([(100 + 7 * i, 1) for i in range(num_reqs)], bs)
    ids = torch.randint(0, args.vocab_size, (num_reqs,), device=DEVICE)

    def forward():
        return model(ids, positions, caches, meta)

    layer = model.model.layers[3]
    x = model.model.embed_tokens(ids)  # the layer adds into it in place, call after call
    rope = model.model.rotary_emb.tables(positions, x.dtype)

    def one_layer():
        layer(x, rope, caches[3], meta)

    with torch.no_grad():
        forward(), one_layer()  # compile and warm up outside the counts
        per_layer = device_kernels(one_layer)
        eager = device_kernels(forward)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
        replay = device_kernels(graph.replay)
    return args, per_layer, eager, replay


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    ("preset", "num_reqs"),
    [
        *((p, n) for p in ("llama-1b", "qwen2-0.5b", "qwen3-0.6b", "llama-3-8b") for n in (1, 64)),
    ],
)
@pytest.mark.parametrize("decode_gemv", ["plain", "fused", "fused_onepass", "hybrid"])
def test_gpu_kernels_per_decoder_layer_in_a_full_graph_decode_step(
    preset, num_reqs, decode_gemv, monkeypatch
):
    """bf16, Triton ops, a uniform decode batch: each decoder layer launches at most ten kernels
    (nine: the KV write is fused into the RoPE kernel), and the captured forward
    (a FULL graph's model part) holds exactly the eager launches: those of every layer, the
    embedding and the final norm."""
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", decode_gemv)
    args, per_layer, eager, replay = layer_and_forward_launches(preset, num_reqs)
    print(f"\n{preset} B={num_reqs}: {len(per_layer)} kernels per layer:", *per_layer, sep="\n  ")
    print(f"forward: {len(eager)} eager, {len(replay)} in the graph replay")
    assert len(per_layer) <= MAX_KERNELS_PER_LAYER, per_layer
    if num_reqs == 1 and decode_gemv != "plain":  # the elementwise ops inside the GEMVs
        wide = 2 * args.intermediate_size > projections_triton.PLAIN_MAX_FEATURES
        # hybrid: a wide gate/up on cuBLAS, after the residual add + norm kernel
        assert len(per_layer) == (7 if decode_gemv == "hybrid" and wide else 6), per_layer
    assert len(eager) == args.num_hidden_layers * len(per_layer) + 2, eager[:24]
    assert len(replay) == len(eager), replay[:24]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("preset", ["llama-1b", "qwen3-0.6b"])
def test_gpu_the_fused_mlp_makes_a_batch_one_layer_one_launch_shorter(preset, monkeypatch):
    """``FUSED_MLP`` on the one-pass fused path: a batch-1 layer is five launches (QKV with the
    norm, RoPE + KV write, attention, o into the residual, the MLP kernel) where it was six,
    the MLP kernel among them, and the FULL graph holds the same launches."""
    monkeypatch.setattr(projections_triton, "DECODE_GEMV", "fused_onepass")
    monkeypatch.setattr(projections_triton, "FUSED_MLP", True)
    args, per_layer, eager, replay = layer_and_forward_launches(preset, 1)
    assert len(per_layer) == 5, per_layer
    assert sum(name.startswith("_mlp_decode_kernel") for name in per_layer) == 1, per_layer
    assert len(eager) == args.num_hidden_layers * 5 + 2 and len(replay) == len(eager)


@pytest.mark.gpu
@needs_cuda
def test_gpu_a_fused_mlp_the_model_is_too_wide_for_is_a_note_or_under_strict_an_error(
    monkeypatch,
):
    """Under ``plain`` an o projection wider than ``PLAIN_MAX_FEATURES`` takes cuBLAS, so the
    MLP in one launch (which follows the o GEMV) cannot run: the runner says so once the model
    is read and records the path off, or refuses under ``strict``. llama-tiny's 64 hidden
    features against a bound of 32 stand in for a model wider than 8,192."""
    from mrv2_prof.runner.config import ConfigError

    monkeypatch.setattr(projections_triton, "PLAIN_MAX_FEATURES", 32)
    kw = dict(device="cuda", kernels="triton", decode_gemv="plain", fused_mlp=True)
    engine = Engine(cfg(**kw), ModelSpec(preset="llama-tiny"))
    (note,) = [n for n in engine.info.notes if n.startswith("runner.fused_mlp:")]
    assert "64 outputs take cuBLAS under runner.decode_gemv: plain" in note
    assert engine.runner.kernel_paths["fused_mlp"] is False and not projections_triton.FUSED_MLP
    with pytest.raises(ConfigError, match=r"runner.fused_mlp: .* \(strict: true\)"):
        Engine(cfg(strict=True, **kw), ModelSpec(preset="llama-tiny"))
