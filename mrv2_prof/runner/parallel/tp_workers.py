"""The ranks of a tensor-parallel runner: one process each, rank 0 the runner's own.

Rank 0 (``ModelRunner`` with ``tensor_parallel_size`` N) starts ranks 1..N-1 as spawned processes
(``worker_main``; each builds its runner with the ``build`` its rank 0 was given, the worker's
``startup.rank_runner``: this package imports nothing of the worker) and joins them in one
``torch.distributed`` group (gloo, a rendezvous file in a fresh temporary directory). Every rank
loads the model, keeps its shard and runs the same start-up (KV cache for its KV heads, warm-up),
so their collectives pair up. Each step rank 0 broadcasts the scheduler's output (``send_step``)
before it queues its own part; a worker queues the same step, waits for its tokens and times it.
Sampling is replicated: the logits are gathered on every rank, the seeds are the same, so every
rank samples the same tokens; each keeps a digest of them, and at the end (``close``) rank 0
gathers the workers' step times, collective times and digests. A digest that differs from rank 0's
becomes a run note. ``NCCL_NVLS_ENABLE=0`` is set before any rank starts (NVLink multicast stays
off on multi-GPU hosts). A collective waits at most ``TIMEOUT_S`` for a rank that died; the run
then fails with the error.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

from mrv2_prof.runner.config import ConfigError
from mrv2_prof.runner.parallel.shard import shard_model
from mrv2_prof.runner.parallel.tensor_parallel import TPGroup, tp_problem

TIMEOUT_S = 120


def init_group(rank: int, world: int, rendezvous: str) -> TPGroup:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    return TPGroup(rank, world)


class TokenDigest:
    """A running digest of the tokens one rank sampled, step by step."""

    def __init__(self) -> None:
        self._h = hashlib.blake2b(digest_size=16)

    def add(self, tokens: list[int]) -> None:
        if tokens:  # an empty step may be waited for on one rank and not on another
            self._h.update(repr(tokens).encode())

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class TPWorkers:
    """Rank 0's handle on ranks 1..N-1."""

    def __init__(self, world: int, config, model_spec, build: Callable) -> None:
        self.world = world
        # NVLink multicast stays off in this process and every rank it starts (inherited)
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        self._dir = tempfile.mkdtemp(prefix="mrv2-tp-")
        rendezvous = os.path.join(self._dir, "rendezvous")
        ctx = mp.get_context("spawn")
        self._procs = [
            ctx.Process(
                target=worker_main,
                args=(rank, world, rendezvous, build, config, model_spec),
                name=f"mrv2-tp-rank{rank}",
                daemon=True,
            )
            for rank in range(1, world)
        ]
        for p in self._procs:
            p.start()
        self.tp = init_group(0, world, rendezvous)
        self.closed = False

    def send_step(self, so) -> None:
        dist.broadcast_object_list([("step", so)], src=0)

    def close(self, digest: str) -> tuple[list[tuple[int, int, int, int, int]], list[str]]:
        """Stop the workers; their ``(rank, step, start_ns, end_ns, comm_ns)`` rows, and a note
        for each rank whose tokens differ from rank 0's (``digest``)."""
        if self.closed:
            return [], []
        self.closed = True
        try:
            dist.broadcast_object_list([("stop", None)], src=0)
            gathered: list = [None] * self.world
            dist.gather_object(None, gathered, dst=0)
        finally:
            dist.destroy_process_group()
            for p in self._procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
            shutil.rmtree(self._dir, ignore_errors=True)
        rows, notes = [], []
        for rank, reply in enumerate(gathered[1:], start=1):
            worker_rows, worker_digest = reply
            rows.extend(worker_rows)
            if worker_digest != digest:
                notes.append(
                    f"runner.tensor_parallel_size: rank {rank} sampled other tokens than rank 0"
                )
        return rows, notes


def start_tensor_parallel(runner, model_spec, tp: TPGroup | None, build: Callable | None) -> None:
    """Set ``runner`` (a ``ModelRunner`` with its model loaded) up as one rank: with
    ``tensor_parallel_size`` N > 1 rank 0 (``tp`` None) starts ranks 1..N-1, each building its
    runner with ``build(config, model_spec, tp)`` (picklable: a module-level function), and every
    rank keeps its shard of the model (``parallel/shard.py``)."""
    world = runner.config.tensor_parallel_size
    runner.tp_workers, runner.tp_digest, runner.tp = None, None, TPGroup()
    if world == 1:
        return
    spec = runner.config.spec_decode.method
    problem = tp_problem(world, runner.model_args, runner.is_cuda, spec)
    if problem is not None:
        raise ConfigError(f"runner.tensor_parallel_size: {problem}")
    if tp is None:
        if build is None:
            raise ConfigError("runner.tensor_parallel_size: rank 0 needs the ranks' runner build")
        runner.tp_workers = TPWorkers(world, runner.config, model_spec, build)
        tp = runner.tp_workers.tp
    runner.tp, runner.tp_digest = tp, TokenDigest()
    runner.model = shard_model(runner.model, tp)
    runner.model_args = runner.model.args  # the rank's heads: its KV cache is sized by them
    runner.info.notes.append(
        f"runner.tensor_parallel_size: {world} ranks over gloo; the output and down "
        "projections' all-reduce runs with the torch ops"
    )


def close_tensor_parallel(runner) -> list[str]:
    """Rank 0: stop the workers, hand their step rows to the probe; the notes of the close."""
    if runner.tp_workers is None or runner.tp_digest is None:
        return []
    rows, notes = runner.tp_workers.close(runner.tp_digest.hexdigest())
    for row in rows:
        runner.probe.rank_step(*row)
    runner.info.notes.extend(notes)
    return notes


def worker_main(
    rank: int, world: int, rendezvous: str, build: Callable, config, model_spec
) -> None:
    """A worker rank: its runner (``build``: the model shard and the start-up), then the steps
    rank 0 broadcasts."""
    tp = init_group(rank, world, rendezvous)
    runner = build(config, model_spec, tp)
    rows: list[tuple[int, int, int, int, int]] = []
    step = 0
    while True:
        message: list = [None]
        dist.broadcast_object_list(message, src=0)
        kind, so = message[0]
        if kind == "stop":
            break
        t0, c0 = time.perf_counter_ns(), tp.comm_ns[0]
        runner.wait_output(runner.queue_step(so))  # its tokens go into runner.tp_digest
        rows.append((rank, step, t0, time.perf_counter_ns(), tp.comm_ns[0] - c0))
        step += 1
    dist.gather_object((rows, runner.tp_digest.hexdigest()), None, dst=0)
    dist.destroy_process_group()
