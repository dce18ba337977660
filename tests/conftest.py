"""Shared fixtures: small Hugging Face checkpoints built on the fly in a temporary directory.

Without CUDA, Triton kernels run in the interpreter: Triton reads ``TRITON_INTERPRET`` when its
functions are decorated (at import), so it is set here, before any test module imports triton.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The runs the tests start leave Python's bytecode settings as the environment has them (no
# bytecode written under ~/.cache/mrv2-prof where writing is off); the tests of the runner's own
# bytecode cache (test_bytecode_cache.py) turn it on in the runs they start.
os.environ.setdefault("MRV2_PROF_BYTECODE_CACHE", "off")
# The commands the tests start spawn their runner once the job exists, on a GPU host as on the
# CPU (the start-up phases and the signal timings they check are that path's); test_standby.py
# starts the standby runner itself.
os.environ.setdefault("MRV2_PROF_STANDBY", "off")


@pytest.fixture
def make_hf_checkpoint() -> Callable[..., Path]:
    """A function that saves a small random transformers Llama or Qwen2 model and returns its dir.

    Biases and norm weights are perturbed away from HF's zeros/ones so that every parameter
    changes the output. ``initializer_range`` is large enough that greedy generations vary.
    """

    def make(
        tmp_dir: str | Path,
        arch: str = "llama",
        tied: bool = False,
        num_kv_heads: int = 2,
        seed: int = 0,
        vocab_size: int = 256,
        *,
        hidden_size: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        intermediate_size: int = 128,
        max_position_embeddings: int = 512,
        rope_theta: float = 10000.0,
        rope_scaling: dict[str, Any] | None = None,
        eos_token_id: int | list[int] | None = 2,
        bos_token_id: int | None = 1,
        initializer_range: float = 0.08,
        max_shard_size: str | None = None,
        name: str | None = None,
    ) -> Path:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers

        config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
        model_cls = {
            "llama": transformers.LlamaForCausalLM,
            "qwen2": transformers.Qwen2ForCausalLM,
        }[arch]
        config = config_cls(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            max_position_embeddings=max_position_embeddings,
            rope_theta=rope_theta,
            rope_scaling=dict(rope_scaling) if rope_scaling else None,  # HF mutates it
            tie_word_embeddings=tied,
            eos_token_id=eos_token_id,
            bos_token_id=bos_token_id,
            initializer_range=initializer_range,
        )
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = model_cls(config).to(torch.float32)
            with torch.no_grad():
                for param_name, param in model.named_parameters():
                    if param_name.endswith(".bias"):
                        param.normal_(0.0, initializer_range)
                    elif param_name.endswith("norm.weight"):
                        param.add_(torch.randn_like(param), alpha=0.1)
        out = Path(tmp_dir) / (name or f"{arch}-{'tied' if tied else 'untied'}-kv{num_kv_heads}")
        kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
        model.save_pretrained(out, safe_serialization=True, **kwargs)
        return out

    return make


@pytest.fixture
def make_gguf_checkpoint() -> Callable[..., Path]:
    """A function that writes a Hugging Face checkpoint directory (``make_hf_checkpoint``'s) as
    a GGUF file, as llama.cpp's converter does, in a folder of its own beside it; returns the
    file. Keywords: ``tests/runner/gguf_checkpoint.py``'s ``write_gguf``."""
    from tests.runner.gguf_checkpoint import write_gguf

    def make(hf_dir: Path, name: str | None = None, **kwargs: Any) -> Path:
        folder = hf_dir.parent / f"gguf-{name or hf_dir.name}"
        folder.mkdir(exist_ok=True)
        return write_gguf(hf_dir, folder / f"{name or hf_dir.name}.gguf", **kwargs)

    return make


@pytest.fixture
def quickstart_job(tmp_path):
    """A ``RunJob`` of the shipped quickstart with ``--set`` overrides, writing to tmp_path."""
    from mrv2_prof.pipeline.job import RunJob
    from mrv2_prof.scenario import load_scenario, scenario_yaml

    def make(*sets: str) -> RunJob:
        s = load_scenario(Path(__file__).resolve().parents[1] / "scenarios/quickstart.yaml", sets)
        data = s.model_dump(mode="json")
        return RunJob(data, scenario_yaml(data), s.name, None, str(tmp_path / "runs.duckdb"))

    return make


@pytest.fixture
def run_in_process(quickstart_job):
    """Run the quickstart (``--set`` overrides) through ``runner_main`` in this process.
    Returns the job and the messages it sent, in order."""
    import queue
    import signal
    import threading

    from mrv2_prof.pipeline.harness import runner_main

    def run(*sets: str):
        job = quickstart_job(*sets)
        messages: queue.Queue = queue.Queue()
        sigint = signal.getsignal(signal.SIGINT)
        try:
            runner_main(job, messages, threading.Event())
        finally:
            signal.signal(signal.SIGINT, sigint)  # runner_main took SIGINT over, as in its process
        sent = []
        while not messages.empty():
            sent.append(messages.get())
        return job, sent

    return run


@pytest.fixture(scope="module")
def base_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database holding one completed base run (``aaa111``, ``tests.report.gate_runs``), made
    once per module for the CLI tests that run against it."""
    from mrv2_prof.store import Store
    from tests.report.gate_runs import add_base

    path = tmp_path_factory.mktemp("base") / "runs.duckdb"
    with Store.open(path) as store:
        add_base(store)
    return path


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 CPUs and 2 ``gpu_slot``s (a custom resource standing in for a
    GPU per cell: ``MRV2_PROF_RAY_CELL_RESOURCE``), its GCS address; one per test process,
    shared by the Ray tests. Skips the test where Ray is not installed."""
    ray = pytest.importorskip("ray")
    ray.init(
        address="local",  # a cluster of its own, never one already running on the host
        num_cpus=2,
        resources={"gpu_slot": 2},
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True)
def _kernel_path_switches():
    """The model kernels' process-wide path switches (``runner/worker/kernel_paths.py``: an
    engine built with non-default ``runner.decode_gemv`` etc. sets them) are put back after
    every test, so no test runs on the paths an earlier one chose."""
    from mrv2_prof.runner.model import pdl, projections_triton

    switches = [(projections_triton, "DECODE_GEMV"), (projections_triton, "DECODE_GEMM"),
                (projections_triton, "GEMM_MAX_FEATURES"), (projections_triton, "GEMM_ROWS"),
                (projections_triton, "FUSED_MLP"), (pdl, "LAUNCH_PDL")]  # fmt: skip
    try:
        from mrv2_prof.runner.model import attention_decode_rope_triton, attention_split_kv_triton
    except ImportError:  # no triton: nothing can set them
        pass
    else:
        switches += [(attention_decode_rope_triton, "ROPE_IN_DECODE_ATTENTION"),
                     (attention_split_kv_triton, "SPLIT_KV_ENABLED")]  # fmt: skip
    saved = [(module, name, getattr(module, name)) for module, name in switches]
    yield
    for module, name, value in saved:
        setattr(module, name, value)


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    """After a test that used the GPU, the garbage it left collected and torch's cached blocks
    returned: an engine or a model in a reference cycle holds its weights, KV cache and graph
    pools until a full collection, and one GPU test process holds every test's in turn (the
    later ones ran out of memory with 78 GiB held that way). CPU-only tests pay nothing."""
    yield
    if torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()
