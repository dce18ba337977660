"""Drafts made and kept on the device (``draft_on: device``): the step after reads them there.

MRV2's input preparation runs on the device so that the device can use what the host does not
know yet, such as speculative decoding's results. With drafts on the device the scheduler gives
each decoding request ``1 + k`` slots (``DEVICE_DRAFT``) without knowing its drafts or how many
of its last drafts were accepted; this module holds what the device knows instead, per request
slot:

* ``tokens`` [R + 1, K] and ``num`` [R + 1]: the slot's drafts for its next verify (row R is a
  sink for padding rows);
* with ``method: ngram``, ``history`` [R + 1, L + 1]: the slot's tokens at their positions (its
  known tokens when the runner first sees it, then every emitted token; column L is a sink).

``after_step`` runs at the end of every step's device work, after the state advance: each row
that emitted tokens past its prompt (a decode, a verify, a prefill's last chunk) appends them to
its history at their positions, and drafts for the next step (the n-gram lookup of
``ngram_device.py``, the Triton kernel on CUDA; or a draft model's proposals as they come out of
it). A prompt chunk that leaves one prompt token, which the scheduler verifies next, drafts
too with ``ngram``, from the whole prompt; any other row (a prompt chunk before that) gets no
drafts. ``apply`` writes a
verify's drafts into its input ids from ``tokens`` and gives the rejection sampler the real
count, ``min(num, slots)``: slots past the drafts a request has are placeholders, never
accepted. Nothing here waits for the device.

A new request's slot gets its history and ``num = 0``; its first verify can only follow a step
of its own, which drafted for it.
"""

from __future__ import annotations

import numpy as np
import torch

from mrv2_prof.runner.config import ConfigError, SpecDecodeConfig
from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.request_states import RequestStates
from mrv2_prof.runner.worker.spec_decode.ngram_device import ngram_step


class DeviceDrafts:
    def __init__(
        self,
        spec: SpecDecodeConfig,
        max_num_reqs: int,
        max_model_len: int,
        device: torch.device,
        copies: CopyAudit,
        triton: bool,
    ) -> None:
        self.spec, self.device, self.copies, self.triton = spec, device, copies, triton
        r, k = max_num_reqs, spec.max_k
        self.sink = r  # the row padding rows write to
        self.tokens = torch.zeros((r + 1, k), dtype=torch.int64, device=device)
        self.num = torch.zeros(r + 1, dtype=torch.int32, device=device)
        self.max_model_len = max_model_len
        self.history = (
            torch.zeros((r + 1, max_model_len + 1), dtype=torch.int32, device=device)
            if spec.method == "ngram"
            else None
        )
        self.bytes = sum(
            t.numel() * t.element_size()
            for t in (self.tokens, self.num, self.history)
            if t is not None
        )

    def add_requests(self, new_reqs, slot_of: dict[str, int]) -> None:
        """New requests (``NewRequestData``): no drafts yet; their known tokens into the history
        (one copy each)."""
        for new in new_reqs:
            slot = slot_of[new.req_id]
            self.num[slot] = 0
            if self.history is not None:
                ids = torch.from_numpy(np.asarray(new.token_ids, dtype=np.int32))
                self.history[slot, : len(new.token_ids)] = self.copies.to_device(ids, self.device)

    def apply(self, batch: InputBatch, inputs) -> None:
        """A verify's drafts (``VerifyInputs`` of ``Verifier.prepare`` over ``DEVICE_DRAFT``
        slots): the rejection sampler's draft tokens and real counts, and the slots' input ids."""
        slots = batch.idx_mapping.long()
        drafts = inputs.drafts
        tokens = self.tokens[slots]  # [B, K]
        drafts.draft_token_ids = tokens
        drafts.num_draft = torch.minimum(self.num[slots], drafts.num_slots)
        # draft_tokens holds each slot's flat index into tokens [B, K]
        values = tokens.view(-1).index_select(0, inputs.draft_tokens)
        batch.input_ids.index_copy_(0, inputs.draft_index, values)
        batch.logits_indices = inputs.logits_indices

    def after_step(
        self,
        batch: InputBatch,
        rs: RequestStates,
        emitted: torch.Tensor,  # [B] (a plain step's tokens) or [B, 1 + K] (a verify's)
        num_accepted: torch.Tensor | None,  # [B] a verify's accepted drafts
        num_slots: torch.Tensor | None,  # [B] a verify's draft slots
        k: int,
        model_drafts: torch.Tensor | None = None,  # [B, k] a draft model's proposals
    ) -> None:
        """Append each row's emitted tokens to its history and draft its next ``k``: with
        ``ngram`` one launch (``ngram_device.ngram_step``: its torch reference spells it out)."""
        n = batch.num_reqs
        counts = batch.num_scheduled_tokens[:n]
        slots = batch.idx_mapping[:n]
        if self.history is not None:
            if num_slots is None:  # one token each
                emitted = emitted[:n, None]
            ngram_step(
                self.history, self.tokens, self.num, slots, counts, batch.seq_lens[:n],
                rs.num_prefill_tokens.gpu, emitted[:n], num_accepted, num_slots,
                min(k, self.tokens.shape[1]), self.spec.ngram_min, self.spec.ngram_max,
                self.triton,
            )  # fmt: skip
            return
        # a draft model's rows: those that emitted past their prompt draft; padding writes
        # nothing (its row is the sink)
        seq = batch.seq_lens[:n].long()
        first = seq if num_slots is None else seq - num_slots.long()
        real = counts > 0
        active = (first >= rs.num_prefill_tokens.gpu[slots.long()].long()) & real
        target = torch.where(real, slots.long(), self.sink)
        if model_drafts is not None:
            m = model_drafts.shape[1]
            self.tokens[target, :m] = model_drafts[:n]
            self.num[target] = torch.where(active, m, 0).to(torch.int32)
        else:  # no proposals this step (k 0): none for the next
            self.num[target] = 0


def make_device_drafts(runner) -> DeviceDrafts | None:
    """The device's drafts of ``runner`` (a ``ModelRunner``), or None where the host drafts
    (``draft_on: host``, or what forces it: ``RunnerConfig.drafts_on_device``, whose note the
    runner's switch check adds). Sets ``runner._device_lengths``: the host's sequence lengths
    may run ahead of the device's (async scheduling schedules before the accepted counts are
    back), so a consumer that needs them on the host (the torch attention, the draft model's
    with torch kernels) reads the device's."""
    c, spec = runner.config, runner.config.spec_decode
    runner._device_lengths = False
    if not spec.enabled:
        return None
    on_device = c.drafts_on_device
    runner.info.spec_drafts_on = "device" if on_device else "host"
    if not on_device:
        return None
    triton = runner.kernels.name == "triton"
    runner._device_lengths = c.async_scheduling and not triton
    if runner._device_lengths and runner.is_cuda:
        note = (
            "runner.spec_decode: kernels: torch reads each verify's sequence lengths from the "
            "device under async scheduling (the torch attention needs them): one sync per step"
        )
        if c.strict:
            raise ConfigError(f"{note} (strict: true)")
        runner.info.notes.append(note)
    return DeviceDrafts(spec, c.max_num_reqs, c.max_model_len, runner.device, runner.copies, triton)
