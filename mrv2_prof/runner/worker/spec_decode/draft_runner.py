"""The model runner's draft-model hook: what ``ModelRunner`` calls for ``method: draft_model``.

``DraftRunner.run`` is called at the end of every step's device work, after the target's sample
and the device-side advance: the draft's catch-up over the step's tokens and its k draft steps
(``draft_proposer.py``; a FULL graph replay when ``draft_graph.py`` captured the batch's shape),
timed as the ``draft`` phase on the host. It returns the drafts [B, k] on the device; they go to
the host with the step's sampled tokens (``AsyncOutput``) and become the scheduler's proposals
(``SpecScheduling.take_model_drafts``). k is the config's k for the batch size (dynamic k: the
next step's k is chosen from the running requests, usually this batch). ``attach_probs`` gives
a verify the draft probabilities its drafts were drawn from when some request samples (greedy
rows never read them).
"""

from __future__ import annotations

import numpy as np
import torch

from mrv2_prof.probes import api as probes
from mrv2_prof.probes.api import Probe
from mrv2_prof.runner.config import ConfigError, SpecDecodeConfig
from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.request_states import RequestStates
from mrv2_prof.runner.worker.sampler import GREEDY_TEMPERATURE
from mrv2_prof.runner.worker.spec_decode.draft_proposer import DraftState, draft_steps
from mrv2_prof.runner.worker.spec_decode.verify import VerifyInputs
from mrv2_prof.runner.worker.uva import take


class DraftRunner:
    def __init__(
        self,
        model,
        spec: SpecDecodeConfig,
        max_num_reqs: int,
        max_model_len: int,
        block_size: int,
        device: torch.device,
        triton: bool,
        copies: CopyAudit,
        probe: Probe,
    ) -> None:
        self.spec, self.device, self.copies, self.probe = spec, device, copies, probe
        self.state = DraftState(
            model, spec.max_k, max_num_reqs, max_model_len, block_size, device, not triton
        )
        self.qsl = torch.arange(max_num_reqs + 2, dtype=torch.int32, device=device)
        self.graphs = None  # DraftGraphs after the capture (draft_graph.py, CUDA)
        self.notes: list[str] = []  # why the draft graph did not replay, once per reason
        self.num_eager = 0  # draft rounds run eagerly

    @staticmethod
    def sampled(rs: RequestStates, batch: InputBatch) -> bool:
        """Some request of the batch samples (host arrays: no device read)."""
        return not bool((rs.temperature_np[batch.idx_mapping_np] < GREEDY_TEMPERATURE).all())

    def attach_probs(self, verify: VerifyInputs, batch: InputBatch, rs: RequestStates) -> None:
        """The verify's draft probabilities [B, K, V] (a gather by slot), when some row samples."""
        if self.sampled(rs, batch):
            verify.drafts.draft_probs = self.state.probs[batch.idx_mapping.long()]

    def add_requests(self, new_reqs, slot_of: dict[str, int]) -> None:
        """New requests with a prefix-cache hit: the draft computes their cached tokens."""
        for new in new_reqs:
            c = new.num_computed_tokens
            if c > 0:
                ids = np.asarray(new.token_ids[:c], dtype=np.int64)
                tokens = self.copies.to_device(torch.from_numpy(ids), self.device)
                self.state.prefill_cached(slot_of[new.req_id], tokens)

    def run(
        self,
        batch: InputBatch,
        rs: RequestStates,
        last_tokens: torch.Tensor,  # [B] int64
        start: torch.Tensor,  # [B]: each request's length after the step (rejections out)
    ) -> torch.Tensor | None:
        """Catch-up and k draft steps; the drafts [B, k] (None when k is 0 for this batch)."""
        k = self.spec.k_for(batch.num_reqs)
        if k == 0:
            return None
        p = self.probe
        p.begin(probes.DRAFT)
        p.gpu_mark(probes.G_DRAFT)  # the device span "draft" runs from here to the step's end
        slots = batch.idx_mapping.long()
        temperature, seeds = take(rs.temperature, batch.idx_mapping), take(rs.seeds, slots)
        sampled = self.sampled(rs, batch)
        drafts, graphs = None, self.graphs
        q = self.uniform_q(batch)
        if graphs is not None and q and k in graphs.qs and q in graphs.qs[k]:
            n = batch.num_reqs
            catch_up = (batch.input_ids[: n * q], batch.positions[: n * q], q)
            drafts, reason = graphs.replay(
                last_tokens, start.long(), slots, temperature, seeds, k, sampled, catch_up
            )  # the catch-up inside the graph
            if drafts is None:
                self._note(reason)
                self.state.catch_up(batch)
        else:
            self.state.catch_up(batch)
            if graphs is not None:
                drafts, reason = graphs.replay(
                    last_tokens, start.long(), slots, temperature, seeds, k, sampled
                )
                self._note(reason)
        if drafts is None:
            self.num_eager += 1
            drafts = torch.empty((batch.num_reqs, k), dtype=torch.int64, device=self.device)
            n = batch.num_reqs
            draft_steps(
                self.state, last_tokens, start.long(), slots, temperature, seeds,
                self.qsl[: n + 1], k, sampled, drafts,
            )  # fmt: skip
        p.end(probes.DRAFT)
        return drafts

    @staticmethod
    def uniform_q(batch: InputBatch) -> int:
        """q when every request of the batch computes q tokens, else 0 (host arrays only)."""
        n, t = batch.num_reqs, batch.num_tokens
        if n == 0 or t % n:
            return 0
        q = t // n
        return q if q == 1 or bool((batch.num_scheduled_tokens_np == q).all()) else 0

    def _note(self, reason: str | None) -> None:
        if reason is not None and reason not in self.notes:
            self.notes.append(reason)

    def run_dummy(self, batch: InputBatch) -> None:
        """Start-up: the catch-up and the k steps over a dummy batch (compiles the kernels;
        writes only the draft's own cache rows, which no request holds yet)."""
        n, k = batch.num_reqs, self.spec.max_k
        if k == 0:
            return
        self.state.catch_up(batch)
        zeros = torch.zeros(n, dtype=torch.int64, device=self.device)
        temperature = torch.ones(n, dtype=torch.float32, device=self.device)
        out = torch.empty((n, k), dtype=torch.int64, device=self.device)
        slots = batch.idx_mapping.long()
        draft_steps(self.state, zeros, zeros + 1, slots, temperature, zeros,
                    self.qsl[: n + 1], k, True, out)  # fmt: skip


def make_drafter(runner, model_spec) -> DraftRunner | None:
    """The draft-model hook of ``runner`` (a ``ModelRunner`` with its target loaded), or None
    when the method is not ``draft_model``; what it cannot do as asked is a note (``strict``:
    an error)."""
    from mrv2_prof.runner.worker.spec_decode.draft_model import build_draft

    c = runner.config
    spec = c.spec_decode
    if spec.method != "draft_model":
        return None
    triton = runner.kernels.name == "triton"
    notes = []
    if runner.is_cuda and not triton:
        notes.append(
            "runner.spec_decode: draft_model with kernels: torch on CUDA reads the draft's "
            "lengths on the host (the torch attention needs them): one sync per draft step"
        )
    if notes and c.strict:
        raise ConfigError(f"{notes[0]} (strict: true)")
    runner.info.notes.extend(notes)
    model = build_draft(
        spec, runner.model, model_spec, runner.device, runner.dtype, runner.kernels.model
    )
    drafter = DraftRunner(
        model, spec, c.max_num_reqs, c.max_model_len, c.block_size, runner.device, triton,
        runner.copies, runner.probe,
    )  # fmt: skip
    runner.info.draft_kv_cache_bytes = drafter.state.kv_cache_bytes + drafter.state.probs_bytes
    return drafter
