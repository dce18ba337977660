"""The async output: a queued step's tokens come back at the one designed wait, which the
probe records with its site; an empty step waits for nothing. On CUDA every step in flight
keeps its own pinned buffer."""

from __future__ import annotations

import pytest
import torch

from mrv2_prof.probes.api import G_END, PHASES
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.runner.worker.async_output import OUTPUT_WAIT_SITE, AsyncOutput, PendingOutput
from mrv2_prof.runner.worker.block_table import BlockTables
from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.input_batch import dummy_batch
from mrv2_prof.runner.worker.sampler import SamplerOutput
from mrv2_prof.runner.worker.staged_write import WriteStats
from mrv2_prof.runner.worker.uva import PINNED_RING_DEPTH


def batch_of(num_reqs: int, device: torch.device):
    return dummy_batch(num_reqs, num_reqs, num_reqs, device, BlockTables(num_reqs, 2, device, True))


def tokens(ids: list[int], device: str = "cpu") -> SamplerOutput:
    return SamplerOutput(torch.tensor(ids, device=device), None, None)


def test_the_wait_reads_the_tokens_and_is_recorded_once_with_its_site():
    probe = RecordingProbe()
    output = AsyncOutput(4, False, CopyAudit(probe), probe)
    stats = {"block_table": WriteStats(1, 1, 2, 40, 80)}
    pending = output.queue(batch_of(3, torch.device("cpu")), tokens([7, 8, 9]), stats)
    result = output.wait(pending)
    assert result.req_ids == ["dummy-0", "dummy-1", "dummy-2"]
    assert result.sampled_token_ids == [7, 8, 9]
    assert result.write_stats == stats and result.logprobs is None
    syncs = probe.drain()["syncs"]
    assert list(syncs["kind"]) == ["output_wait"] and list(syncs["site"]) == [OUTPUT_WAIT_SITE]
    assert syncs["blocked_ns"][0] == result.output_wait_ns


def test_an_empty_step_waits_for_nothing():
    probe = RecordingProbe()
    output = AsyncOutput(4, False, CopyAudit(probe), probe)
    stats = {"num_computed_tokens": WriteStats(1, 1, 1, 20, 16)}
    result = output.wait(PendingOutput(None, stats))
    assert (result.req_ids, result.sampled_token_ids, result.write_stats) == ([], [], stats)
    assert len(probe.drain()["syncs"]["kind"]) == 0


def test_the_probe_gets_its_turn_before_the_wait_and_the_gpu_timeline_resolves_there():
    calls = []

    class Ready:  # the step's output event, still running on the device
        def query(self):
            calls.append("query")
            return False

        def synchronize(self):
            calls.append("synchronize")

    class Timeline:  # what the recording probe hands the turn to
        def mark(self, step, mark, prep_start_ns):
            return None  # no event of its own: the output records its own ready event

        def poll_while(self, ready):
            calls.append("poll_while")
            return 0 if ready.query() else 1

    class Probe(RecordingProbe):
        def begin(self, phase):
            calls.append(f"begin {PHASES[phase]}")
            super().begin(phase)

    probe = Probe()
    probe.timeline = Timeline()
    output = AsyncOutput(4, False, CopyAudit(probe), probe)
    pending = output.queue(batch_of(2, torch.device("cpu")), tokens([3, 4]), {})
    pending.ready = Ready()
    assert output.wait(pending).sampled_token_ids == [3, 4]
    # the timeline's work is outside the timed wait, which then blocks on the event
    assert calls == ["poll_while", "query", "begin output_wait", "synchronize"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_steps_in_flight_keep_their_own_pinned_buffers():
    probe = RecordingProbe()
    output = AsyncOutput(4, True, CopyAudit(probe), probe)
    dev = torch.device("cuda")
    pendings = [
        output.queue(batch_of(2, dev), tokens([k, k + 1], "cuda"), {})
        for k in range(0, 2 * PINNED_RING_DEPTH, 2)
    ]  # queued, none waited for
    assert all(p.sampled.is_pinned() and p.ready is not None for p in pendings)
    assert len({p.sampled.data_ptr() for p in pendings}) == PINNED_RING_DEPTH
    got = [output.wait(p).sampled_token_ids for p in pendings]
    assert got == [[k, k + 1] for k in range(0, 2 * PINNED_RING_DEPTH, 2)]


class _Event:  # a CUDA event stand-in: counts its records, always complete
    def __init__(self):
        self.records = 0

    def record(self, stream=None):
        self.records += 1

    def query(self):
        return True

    def synchronize(self):
        pass


def _cuda_like_output(probe):
    """The CUDA branch of ``queue`` on the CPU: the ring's events are stand-ins."""
    output = AsyncOutput(4, False, CopyAudit(probe), probe)
    output.is_cuda, output._stream = True, None
    output._ready = [_Event() for _ in range(PINNED_RING_DEPTH)]
    return output


@pytest.mark.parametrize("probe_event", [True, False])
def test_the_output_waits_on_the_probes_end_mark_instead_of_recording_its_own(probe_event):
    marks, mine = [], _Event()

    class Probe(RecordingProbe):
        def gpu_mark(self, mark):
            marks.append(mark)
            return mine if probe_event else None

    probe = Probe()
    output = _cuda_like_output(probe)
    pending = output.queue(batch_of(2, torch.device("cpu")), tokens([5, 6]), {})
    assert marks == [G_END]  # the step's last mark is the output's, after its copies
    ring = output._ready[0]
    if probe_event:  # one record a step: the probe's
        assert pending.ready is mine and ring.records == 0
    else:  # no probe event (probes off, or a step the timeline does not measure)
        assert pending.ready is ring and ring.records == 1
    assert output.wait(pending).sampled_token_ids == [5, 6]
