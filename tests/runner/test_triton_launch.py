"""The cached-kernel launcher: its key is at least as fine as triton's own specialization, a
repeated launch is a cache hit that calls the compiled kernel's launcher with every argument in
signature order, and every JIT-path launch has a recorded reason.

On the CPU the real kernels are interpreted; the fast path is driven here with a stand-in for
the JIT function (its real parameter list) and for the compiled kernel. The key is checked
against triton's binder for the CUDA backend, built without a device.
"""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from triton.runtime.jit import JITFunction

from mrv2_prof.runner.worker import triton_launch
from mrv2_prof.runner.worker.gumbel_argmax_triton import (
    _gumbel_argmax_kernel,
    _reduce_splits_kernel,
)
from mrv2_prof.runner.worker.input_batch_triton import _prepare_inputs_kernel
from mrv2_prof.runner.worker.staged_write_triton import _apply_packed_writes_kernel
from mrv2_prof.runner.worker.triton_launch import Launcher

KERNELS = (
    _prepare_inputs_kernel,
    _apply_packed_writes_kernel,
    _gumbel_argmax_kernel,
    _reduce_splits_kernel,
)


def jit_of(kernel) -> JITFunction:
    """The kernel as a ``JITFunction`` (under the interpreter it is decorated otherwise)."""
    if isinstance(kernel, JITFunction):
        return kernel
    opts = ("do_not_specialize", "do_not_specialize_on_alignment")
    return JITFunction(kernel.fn, **{k: kernel.kwargs[k] for k in opts if k in kernel.kwargs})


def cuda_binder(fn: JITFunction):
    """Triton's own argument binder for the CUDA backend (no device needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(
        fn.signature, fn.params, make_backend(GPUTarget("cuda", 90, 32))
    )


INTS = (0, 1, 2, 15, 16, 17, 32, 4096, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**40)
DTYPES = (torch.int32, torch.int64, torch.float32, torch.bfloat16)


def random_args(fn: JITFunction, rng: np.random.Generator) -> list:
    """Runtime arguments of every kind triton specialises on, one of them changed from a base
    (aligned int32 tensors, the integer 64): tensors at aligned and unaligned offsets of several
    dtypes, integers around 1, 16 and the 32-bit bounds. Changing few arguments at a time makes
    many launches share a key, so a key that misses a distinction triton makes shows up."""
    pool = torch.zeros(64, dtype=torch.int64)
    runtime = [p for p in fn.params if not p.is_constexpr]
    changed = set(rng.choice(len(runtime), size=1, replace=False).tolist())
    args = []
    for i, p in enumerate(runtime):
        tensor = p.name.endswith("_ptr")
        if i not in changed:
            args.append(pool.view(torch.int32) if tensor else 64)
        elif tensor:
            flat = pool.view(DTYPES[rng.integers(len(DTYPES))])
            args.append(flat[int(rng.integers(0, 9)) :])  # offsets 0..8 elements
        else:
            args.append(int(INTS[rng.integers(len(INTS))]))
    return args


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_key_is_at_least_as_fine_as_triton_specialization(kernel):
    """Two launches with one key are launches triton specialises identically."""
    fn = jit_of(kernel)
    binder = cuda_binder(fn)
    launcher = Launcher(fn)
    rng = np.random.default_rng(0)
    spec_of_key: dict = {}
    constexprs = {p.name: 16 for p in fn.params if p.is_constexpr}
    keys = set()
    for _ in range(400):
        args = random_args(fn, rng)
        key = launcher.key(args, constexprs)
        spec = tuple(binder(*args, **constexprs)[1])
        assert spec_of_key.setdefault(key, spec) == spec, (key, spec, spec_of_key[key])
        keys.add(key)
    assert len(keys) >= 10  # the random arguments reached many specializations
    assert len(keys) < 300  # and many launches shared a key


def test_key_separates_what_triton_separates():
    """Alignment, ``== 1`` and ``% 16`` of specialised arguments are in the key; an argument the
    kernel does not specialise (``n``) keeps one key for every 32-bit value."""
    fn = jit_of(_apply_packed_writes_kernel)  # (base_ptr, base_row_stride, buf_ptr, n)
    launcher = Launcher(fn)
    base = torch.zeros(32, dtype=torch.int32)
    buf = torch.zeros(32, dtype=torch.int32)
    kw = {"BLOCK": 256}

    def key(b=base, stride=64, n=5):
        return launcher.key((b, stride, buf, n), kw)

    assert key() == key(n=7) == key(n=16) == key(n=1)
    assert key() != key(b=base[1:])  # 4-byte offset: not 16-byte aligned
    assert key() == key(b=base[4:])  # 16-byte offset
    assert key() != key(stride=1) and key() != key(stride=17) and key() == key(stride=32)
    assert key() != key(b=base.view(torch.float32))
    assert key() != launcher.key((base, 64, buf, 5), {"BLOCK": 128})
    with pytest.raises(TypeError, match="runtime parameters"):
        launcher.key((base, 64, buf), kw)


class FakeCompiled:
    function, packed_metadata = "function-handle", "packed-metadata"

    def __init__(self) -> None:
        self.runs: list[tuple] = []

    def run(self, *a) -> None:
        self.runs.append(a)

    def launch_metadata(self, grid, stream, *args):
        return ("meta", grid, stream)


class FakeJIT:
    """A JIT function's launch interface over a real kernel's parameters."""

    def __init__(self, fn: JITFunction) -> None:
        self.params, self.__name__ = fn.params, fn.__name__
        self.jit_calls: list[tuple] = []
        self.compiled: dict[tuple, FakeCompiled] = {}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            return self.compiled.setdefault(tuple(sorted(kwargs.items())), FakeCompiled())

        return run


@pytest.fixture
def fake_runtime(monkeypatch):
    knobs = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(triton_launch, "_runtime", lambda: (lambda: 0, lambda d: 7000 + d, knobs))
    triton_launch.set_fast_launch(True)
    yield knobs
    triton_launch.set_fast_launch(True)


def test_second_launch_hits_the_cache_and_runs_the_compiled_kernel(fake_runtime):
    fake = FakeJIT(jit_of(_apply_packed_writes_kernel))
    launcher = Launcher(fake, "apply")
    base, buf = torch.zeros(8, 4, dtype=torch.int32), torch.zeros(32, dtype=torch.int32)
    launcher((3,), base, 4, buf, 3, BLOCK=256)
    assert (launcher.calls, launcher.hits, launcher.misses, launcher.slow) == (1, 0, 1, 1)
    assert len(fake.jit_calls) == 1  # the miss compiled and launched through the JIT
    launcher((5,), base, 4, buf, 5, BLOCK=256)
    launcher((2, 3), base, 4, buf, 2, BLOCK=256)
    assert (launcher.calls, launcher.hits, launcher.misses, launcher.slow) == (3, 2, 1, 1)
    assert len(fake.jit_calls) == 1
    (compiled,) = fake.compiled.values()
    # grid padded to 3-D, the current stream, the handles, no hooks, every argument in order
    head = (5, 1, 1, 7000, "function-handle", "packed-metadata", None, None, None)
    assert compiled.runs[0] == (*head, base, 4, buf, 5, 256)
    assert compiled.runs[1][:3] == (2, 3, 1) and compiled.runs[1][-2:] == (2, 256)
    # another constexpr: another specialization, compiled apart
    launcher((1,), base, 4, buf, 1, BLOCK=128)
    assert launcher.misses == 2 and len(fake.compiled) == 2
    assert launcher.fallback is None


def test_launch_hook_gets_its_metadata(fake_runtime):
    fake = FakeJIT(jit_of(_apply_packed_writes_kernel))
    launcher = Launcher(fake, "apply")
    base, buf = torch.zeros(8, 4, dtype=torch.int32), torch.zeros(32, dtype=torch.int32)
    launcher((3,), base, 4, buf, 3, BLOCK=256)
    fake_runtime.launch_enter_hook = hook = object()
    launcher((3,), base, 4, buf, 3, BLOCK=256)
    (compiled,) = fake.compiled.values()
    assert compiled.runs[-1][6:8] == (("meta", (3,), 7000), hook)


def test_turned_off_takes_the_jit_path_and_says_so(fake_runtime):
    fake = FakeJIT(jit_of(_apply_packed_writes_kernel))
    launcher = Launcher(fake, "apply_off_test")
    base, buf = torch.zeros(8, 4, dtype=torch.int32), torch.zeros(32, dtype=torch.int32)
    triton_launch.set_fast_launch(False)
    for _ in range(3):
        launcher((3,), base, 4, buf, 3, BLOCK=256)
    assert (launcher.calls, launcher.hits, launcher.slow) == (3, 0, 3)
    assert len(fake.jit_calls) == 3
    lines = [n for n in triton_launch.notes() if "apply_off_test" in n]
    assert lines == [
        "runner.kernels: Triton kernel apply_off_test launches through the JIT "
        "(fast launch turned off: MRV2_TRITON_FAST_LAUNCH=0 or set_fast_launch(False))"
    ]


def test_compiled_kernel_without_a_launcher_falls_back_with_a_note(fake_runtime):
    fake = FakeJIT(jit_of(_apply_packed_writes_kernel))
    fake.compiled[(("BLOCK", 256),)] = SimpleNamespace(function=1)  # no run / metadata
    launcher = Launcher(fake, "apply_old_triton")
    base, buf = torch.zeros(8, 4, dtype=torch.int32), torch.zeros(32, dtype=torch.int32)
    launcher((3,), base, 4, buf, 3, BLOCK=256)
    launcher((3,), base, 4, buf, 3, BLOCK=256)
    assert launcher.hits == 0 and launcher.slow == 2 and len(fake.jit_calls) == 2
    assert "no run, packed_metadata, launch_metadata" in launcher.fallback
    assert any("apply_old_triton" in n for n in triton_launch.notes())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only without CUDA")
def test_interpreted_kernel_takes_the_jit_path_with_a_note():
    """Under TRITON_INTERPRET=1 the real kernel runs through the interpreter, correctly."""
    launcher = Launcher(_apply_packed_writes_kernel)
    assert "interpreter" in launcher.fallback
    assert any(_apply_packed_writes_kernel.__name__ in n for n in triton_launch.notes())
    base = torch.zeros(2, 4, dtype=torch.int32)
    buf = torch.tensor([1, 0, 2, 0, 7, 8], dtype=torch.int32)  # row 1, start 0, len 2, off 0
    launcher((1,), base, base.stride(0), buf, 1, BLOCK=256)
    assert base.tolist() == [[0, 0, 0, 0], [7, 8, 0, 0]]
    assert (launcher.calls, launcher.hits, launcher.slow) == (1, 0, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fast_launch_hits_and_writes_what_the_jit_writes():
    triton_launch.set_fast_launch(True)
    launcher = Launcher(_apply_packed_writes_kernel)
    assert launcher.fallback is None
    dev = torch.device("cuda")
    for step, (row, n) in enumerate(itertools.product(range(3), (1, 5, 40))):
        base = torch.zeros(4, 64, dtype=torch.int32, device=dev)
        want = base.clone()
        vals = torch.arange(n, dtype=torch.int32) + step
        buf = torch.cat([torch.tensor([row, 2, n, 0], dtype=torch.int32), vals]).to(dev)
        launcher((1,), base, base.stride(0), buf, 1, BLOCK=256)
        want[row, 2 : 2 + n] = vals.to(dev)
        assert torch.equal(base, want)
    assert launcher.misses == 1 and launcher.hits == launcher.calls - 1


def interpreted_triton_engine(monkeypatch, **overrides):
    """A small CPU engine with the Triton kernels forced in (they run in the interpreter);
    ``overrides``: runner settings that differ from these."""
    import mrv2_prof.runner.worker.model_runner as model_runner
    from mrv2_prof.runner.config import ModelSpec, RunnerConfig
    from mrv2_prof.runner.engine import Engine
    from mrv2_prof.runner.worker.kernel_set import triton_kernels

    monkeypatch.setattr(model_runner, "resolve_kernels", lambda r, c: (triton_kernels(), None))
    config = RunnerConfig(
        device="cpu",
        max_num_reqs=8,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=64,
        num_kv_blocks=16,
        async_scheduling=False,
        uva=False,
        cudagraph_mode="none",
    )
    config = dataclasses.replace(config, **overrides)
    return Engine(config, ModelSpec(preset="llama-tiny"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only without CUDA")
def test_the_runner_records_the_jit_path_notes_after_warm_up(monkeypatch):
    """Forced-in Triton kernels under the interpreter: the run's notes say which kernels took
    the JIT path and why (no silent fallback)."""
    engine = interpreted_triton_engine(monkeypatch)
    notes = [n for n in engine.info.notes if "launches through the JIT" in n]
    assert any("_prepare_inputs_kernel" in n and "TRITON_INTERPRET=1" in n for n in notes)
    assert any("_gumbel_argmax_kernel" in n for n in notes)
    assert len(notes) == len(set(notes))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engine_steps_launch_through_the_cache():
    """A CUDA run with the Triton kernels and FULL graphs: after warm-up every step-path launch
    is a cache hit (misses only for specializations first met in a step), and no kernel took
    the JIT path."""
    from mrv2_prof.runner.config import ModelSpec, RunnerConfig
    from mrv2_prof.runner.core.request import SamplingParams
    from mrv2_prof.runner.engine import Engine

    triton_launch.set_fast_launch(True)
    config = RunnerConfig(
        device="cuda",
        max_num_reqs=16,
        max_num_seqs=4,
        max_model_len=256,
        num_kv_blocks=64,
        kernels="triton",
        cudagraph_mode="full_and_piecewise",
        cudagraph_capture_sizes=(1, 2, 4),
        full_step_graph=False,  # the step path's kernels launched each step, around the graph
    )
    engine = Engine(config, ModelSpec(preset="llama-tiny"))
    step_path = {"_prepare_inputs_kernel", "_gumbel_argmax_kernel", "_advance_kernel"}
    # The launchers are process-wide: count only what this run adds to them.
    before = {lnch.name: (lnch.calls, lnch.misses, lnch.hits) for lnch in triton_launch.launchers()}
    params = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.7, seed=1)
    for i in range(4):
        engine.add_request(f"r{i}", list(range(5 + i, 30 + i)), params)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    counted = [lnch for lnch in triton_launch.launchers() if lnch.name in step_path]
    assert {lnch.name for lnch in counted} == step_path
    for lnch in counted:
        assert lnch.fallback is None
        calls0, misses0, hits0 = before.get(lnch.name, (0, 0, 0))
        misses, hits = lnch.misses - misses0, lnch.hits - hits0
        assert lnch.calls - calls0 >= steps - 2, lnch.name
        assert misses <= 4 and hits >= steps - 6, (lnch.name, misses, hits)
    assert not [n for n in engine.info.notes if "launches through the JIT" in n]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only without CUDA")
def test_the_warm_up_launches_each_staged_tensors_apply_and_changes_no_state(monkeypatch):
    """The warm-up compiles the variants a step launches (one staged-write apply per staged
    tensor: its own dtype and row stride; the state advance with and without the count) and
    leaves every request slot's device state as it was."""
    from mrv2_prof.runner.worker import startup
    from mrv2_prof.runner.worker.staged_write import StagedWriteTensor

    runner = interpreted_triton_engine(monkeypatch).runner
    rs = runner.req_states
    staged = [t for t in (*vars(rs).values(), runner.block_tables.table)
              if isinstance(t, StagedWriteTensor)]  # fmt: skip
    assert len(staged) >= 3  # prefill ids, prefill counts, computed counts, block table
    for t in staged:  # give every slot a value the warm-up must not touch
        t.gpu.copy_(torch.arange(t.gpu.numel(), dtype=t.gpu.dtype).view_as(t.gpu) + 7)
    rs.last_sampled_tokens.copy_(torch.arange(rs.last_sampled_tokens.numel()) + 3)
    before = [t.gpu.clone() for t in staged] + [rs.last_sampled_tokens.clone()]

    def calls_by_name() -> dict[str, int]:  # summed: other tests make launchers of a name too
        out: dict[str, int] = {}
        for lnch in triton_launch.launchers():
            out[lnch.name] = out.get(lnch.name, 0) + lnch.calls
        return out

    counts = calls_by_name()
    startup.warm_up(runner)
    after = [t.gpu for t in staged] + [rs.last_sampled_tokens]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    calls = {name: n - counts.get(name, 0) for name, n in calls_by_name().items()}
    assert calls["_apply_packed_writes_kernel"] == len(staged)
    assert calls["_advance_kernel"] == 4  # 1 and 3 rows, with and without the count
