"""The scheduler's side of speculative decoding: drafts, lookahead slots, accepted runs.

A decoding request (one token to compute) gets up to ``k`` drafts: n-gram lookups over its host
token history, or with ``method: draft_model`` the draft model's tokens for it that came back
with its last step's output (``take_model_drafts``; kept only while the request is at the length
they were drafted from, and never across a preemption: its draft probabilities are its slot's);
the scheduler then schedules ``1 + len(drafts)`` tokens for it and allocates their KV
slots (the lookahead), so the verify forward can write every draft's KV. When the step's output
comes back the request's emitted run (accepted drafts plus one token) is appended, with its
logprobs when the request asked for them, and its ``num_computed_tokens`` rolled back by the
rejected count, as the runner does on the device.

k is capped so that every emitted token fits: ``budget - 1``, the request's remaining
``max_tokens`` minus one, and ``max_model_len`` minus its tokens minus one.

**Padding to one k.** When every scheduled request decodes (a uniform decode batch) and FULL
verify graphs were captured (``pad_capacity``: k -> the largest batch such a graph holds), every
request is padded up to the step's k: after its real drafts (fewer than k, or none: no n-gram
match, or capped by ``max_tokens``) come ``PAD_DRAFT`` placeholder slots, scheduled and given KV
slots like drafts. The rejection sampler compares only the real drafts, so a placeholder is
never accepted and emits nothing: the rollback is by the rejected plus the padded slots. The
step's shape is then (B, 1 + k) and it replays a FULL verify graph (a step in which nobody
drafted stays a plain decode: its FULL decode graph is cheaper). Padding must fit: every
placeholder's position inside ``max_model_len`` (its KV slot must exist in the request's block
table), B x (1 + k) inside the token budget, B inside a captured size. When the step's k does
not fit, the largest captured smaller k that does becomes the step's k (its drafts cut to it);
when none does the step is not padded. Both are counted by reason and reported as a note on the
run (``notes``). A step that also admits a waiting request is mixed anyway: its verifies were
padded before the admission was known.

**Drafts on the device** (``on_device``, the default: worker/spec_decode/device_drafts.py). The
host schedules each decoding request ``1 + s`` slots (``DEVICE_DRAFT``; s = the step's k, capped as
above) without knowing its drafts: the device drafted them at the end of the request's last step
and the verify reads them there; a slot past the drafts it has is a placeholder. Under async
scheduling that step may still be in flight: the request is scheduled anyway, optimistically,
with its in-flight slots counted as computed (``num_output_placeholders``), so its KV slots and
positions are reserved for every draft of the step in flight being accepted. The device's
counts are the truth (its positions and ``num_computed_tokens`` come from what it accepted); the
host learns the accepted count with the tokens at the one designed wait and rolls its count back
then, one step later, reclaiming the rejected slots (counted: ``num_reclaimed``); the KV blocks
they reserved stay with the request for its next tokens and go back to the pool with it. Caps
read the optimistic count: the positions of every slot must fit ``max_model_len`` even if every
draft in flight was accepted (``num_tokens + placeholders``), and ``max_tokens`` counts the one
token a step in flight surely emits.

**Drafts on the host** (``draft_on: host``). With async scheduling the host learns a verify's
accepted count only with its tokens, one step later, and drafts from the request's complete
history; so a request with tokens in flight sits out the step (counted: ``num_sat_out``). A plain
decode with a token in flight also sits out while k > 0, so that it can draft next time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mrv2_prof.runner.config import DEVICE_DRAFT, PAD_DRAFT, SpecDecodeConfig
from mrv2_prof.runner.core.ngram_proposer import NgramIndex
from mrv2_prof.runner.core.request import Request, RequestStatus


@dataclass
class SpecStepStats:
    """What the verifies did since the run began (vLLM's spec-decode counters)."""

    num_drafts: int = 0  # requests that verified at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [max k]
    # (req_id, accepted drafts), one entry per verify
    accepted_lengths: list[tuple[str, int]] = field(default_factory=list)
    num_padded_slots: int = 0  # placeholder draft slots scheduled (never accepted)
    # uniform decode steps not padded, or padded to a smaller k, by reason
    unpadded: Counter = field(default_factory=Counter)
    capped: Counter = field(default_factory=Counter)


class SpecScheduling:
    def __init__(
        self,
        config: SpecDecodeConfig,
        async_scheduling: bool,
        pad_capacity: dict[int, int] | None = None,
        on_device: bool = False,
    ) -> None:
        self.config = config
        self.async_scheduling = async_scheduling
        self.on_device = on_device  # drafts made and kept on the device (see the module doc)
        self.num_reserved = 0  # draft slots in the step last scheduled
        self.num_reclaimed = 0  # draft slots rolled back since the last ``take_verifies``
        self.num_sat_out = 0  # requests that sat out the step last scheduled
        self.max_k: int | None = None  # a cap on the step's k (dynamic k's decision), None: none
        # (slots, accepted) of every verify since the last ``take_verifies``, drafts or none
        self.outcomes: list[tuple[int, int]] = []
        # k -> the largest batch a FULL verify graph of 1 + k holds; empty: never pad
        self.pad_capacity = dict(pad_capacity or {})
        self.k = 0  # this step's k
        self.tokens: dict[str, list[int]] = {}  # this step's drafts (and placeholders), by request
        self.num_drafted = 0  # real drafts in the step last scheduled
        self.num_padded = 0  # placeholder slots in it
        self._pad: int | None = None  # the k this step pads to (0: none), once decided
        self._decodes = 0  # requests that decode this step (and do not sit out)
        self._room = 0  # the fewest positions any of them has left before max_model_len
        self._uniform = False  # no running request computes more than one token
        self._verifying: set[str] = set()  # async: verifies in flight
        self._proposals: dict[str, list[int]] | None = None  # ``draft``'s, until the step ends
        # draft_model: req_id -> (drafts, num_tokens, num_preemptions) when they were drafted
        self._model_drafts: dict[str, tuple[list[int], int, int]] = {}
        # ngram: req_id -> (the request, its lookup index); a reused id gets a new index
        self._ngrams: dict[str, tuple[Request, NgramIndex]] = {}
        self.stats = SpecStepStats()
        self.verifies: list[tuple[str, int, int]] = []  # (req_id, drafted, accepted) to report

    def draft(self, running: list[Request], max_model_len: int) -> None:
        """Propose the drafts of the step about to be scheduled, for every running request
        that is about to compute its last token and does not sit out (the engine times this
        as the ``draft`` phase; ``schedule`` calls it when nobody did)."""
        self.k = self.config.k_for(len(running))
        if self.max_k is not None:
            self.k = min(self.k, self.max_k)
        self._proposals = {}
        self._pad, self._decodes, self._room, self._uniform = None, 0, max_model_len, True
        self.num_sat_out = 0
        if self.k == 0:
            return
        cfg = self.config
        for request in running:
            pending = request.num_output_placeholders
            n = request.num_tokens + pending - request.num_computed_tokens
            if n != 1:
                self._uniform &= n <= 0  # a prefill chunk: a mixed batch, padding buys nothing
                continue
            if self.sits_out(request):
                continue
            self._decodes += 1
            # every slot in flight accepted: the furthest the request can be (module doc)
            length = request.num_tokens + pending
            self._room = min(self._room, max_model_len - length)
            params = request.sampling_params
            k = min(
                self.k,
                params.max_tokens - request.num_output_tokens - min(pending, 1) - 1,
                max_model_len - length - 1,
            )
            if k > 0:
                drafts = [DEVICE_DRAFT] * k if self.on_device else self._propose(request, k)
                if drafts:
                    self._proposals[request.request_id] = drafts
        if cfg.method == "draft_model":  # a request not running now drafts again first
            live = {r.request_id for r in running}
            self._model_drafts = {r: d for r, d in self._model_drafts.items() if r in live}
        elif len(self._ngrams) > len(running):  # finished or preempted: rebuilt if it returns
            live = {r.request_id for r in running}
            self._ngrams = {r: i for r, i in self._ngrams.items() if r in live}

    def _propose(self, request: Request, k: int) -> list[int]:
        cfg = self.config
        if cfg.method != "draft_model":
            entry = self._ngrams.get(request.request_id)
            if entry is None or entry[0] is not request:
                entry = (request, NgramIndex(cfg.ngram_min, cfg.ngram_max))
                self._ngrams[request.request_id] = entry
            return entry[1].propose(request.all_token_ids, k)
        entry = self._model_drafts.get(request.request_id)
        if entry is None or entry[1:] != (request.num_tokens, request.num_preemptions):
            return []
        return entry[0][:k]

    def take_model_drafts(
        self, req_ids: list[str], drafts: list[list[int]], updated: list[Request]
    ) -> None:
        """A step's draft-model output (per batch row), for the requests that received tokens
        in it (``updated``): their proposals for the next step that verifies them."""
        row = {rid: b for b, rid in enumerate(req_ids)}
        for r in updated:
            b = row.get(r.request_id)
            if b is not None and not r.is_finished:
                self._model_drafts[r.request_id] = (drafts[b], r.num_tokens, r.num_preemptions)

    def begin_step(self, running: list[Request], max_model_len: int) -> None:
        """A step is being scheduled over ``running``."""
        self.tokens = {}
        if self._proposals is None:
            self.draft(running, max_model_len)

    def end_step(self, num_scheduled: dict[str, int]) -> dict[str, list[int]]:
        """The step's drafts (``SchedulerOutput.scheduled_spec_decode_tokens``), of the requests
        still in it (``num_scheduled``: a request preempted after drafting is not)."""
        self.tokens = {rid: d for rid, d in self.tokens.items() if rid in num_scheduled}
        self._proposals = None
        self.num_padded = sum(d.count(PAD_DRAFT) for d in self.tokens.values()) if self._pad else 0
        self.num_reserved = sum(map(len, self.tokens.values()))
        self.num_drafted = self.num_reserved - self.num_padded
        if self.on_device:  # the real drafts are known once the verify's tokens are back
            self.num_drafted = 0
        self.stats.num_padded_slots += self.num_padded
        if self.async_scheduling and not self.on_device:
            self._verifying.update(self.tokens)
        return self.tokens

    def sits_out(self, request: Request) -> bool:
        """Async with drafts on the host: the request's tokens in flight are not known yet (see
        the module doc)."""
        if not self.async_scheduling or self.on_device:
            return False
        if request.num_output_placeholders == 0:  # nothing in flight (a verify was dropped)
            self._verifying.discard(request.request_id)
            return False
        return self.k > 0 or request.request_id in self._verifying

    def num_new_tokens(self, request: Request, budget: int) -> int:
        """The tokens to schedule for a request about to compute its last token: 1 + its
        drafts (as many as ``budget`` leaves room for), or 0 when it sits out."""
        if self.sits_out(request):
            self.num_sat_out += 1
            return 0
        if self._pad is None:  # the first decode of the step: nothing of the budget spent yet
            self._pad = self._padding(budget)
        drafts = self._proposals.get(request.request_id, [])
        if self._pad and budget > self._pad:
            drafts = drafts[: self._pad]
            pad = DEVICE_DRAFT if self.on_device else PAD_DRAFT  # the device pads its own
            self.tokens[request.request_id] = drafts + [pad] * (self._pad - len(drafts))
            return 1 + self._pad
        drafts = drafts[: budget - 1]
        if drafts:
            self.tokens[request.request_id] = drafts
        return 1 + len(drafts)

    def _padding(self, budget: int) -> int:
        """The k this step's verifies are padded to, 0 for none (see the module doc); a cap
        to a smaller k becomes the step's k."""
        if self.k == 0 or not self.pad_capacity or not self._uniform or not self._proposals:
            return 0  # nobody drafted: a plain decode step (its FULL decode graph is cheaper)
        b = self._decodes

        def why_not(k: int) -> str | None:
            if k not in self.pad_capacity:
                return "no FULL verify graph for the step's k"
            if b > self.pad_capacity[k]:
                return "more requests than the largest FULL verify graph holds"
            if b * (1 + k) > budget:
                return "the token budget is below requests x (1 + k)"
            if k > self._room:
                return "a request within k positions of max_model_len"
            return None

        reason = why_not(self.k)
        if reason is None:
            return self.k
        fits = [k for k in self.pad_capacity if k < self.k and why_not(k) is None]
        if not fits:
            self.stats.unpadded[reason] += 1
            return 0
        self.stats.capped[reason] += 1
        self.k = max(fits)
        return self.k

    def accept(
        self,
        request: Request,
        drafts: list[int],
        emitted: list[int],
        logprobs: list | None = None,
        row: int = 0,
        num_real: int | None = None,
    ) -> list[tuple[int, list[tuple[int, float]] | None]]:
        """The verify of ``drafts`` (real drafts, then any ``PAD_DRAFT`` slots; or
        ``DEVICE_DRAFT`` slots, of which the device had ``num_real``) emitted ``emitted``
        (accepted drafts, then one token): roll ``request`` back by the rejected and padded
        slots, count the step, return the tokens to append with their logprobs
        (``logprobs[row]``: one entry per emitted token; None when the request asked for none)."""
        num_slots = len(drafts)
        num_accepted = len(emitted) - 1
        if num_real is None:
            num_real = num_slots - drafts.count(PAD_DRAFT)
            assert emitted[:num_accepted] == drafts[:num_accepted], "accepted are the drafts"
        else:  # drafts on the device: the placeholders are known now
            self.stats.num_padded_slots += num_slots - num_real
        assert 0 <= num_accepted <= num_real, f"{request.request_id}: {emitted} for {drafts}"
        self.num_reclaimed += num_slots - num_accepted
        self.outcomes.append((num_slots, num_accepted))
        self._verifying.discard(request.request_id)
        if self.async_scheduling:
            request.num_output_placeholders -= 1 + num_slots
        if request.status is RequestStatus.RUNNING:  # a preempted request starts from 0
            request.num_computed_tokens -= num_slots - num_accepted
        if num_real:
            self._count(request.request_id, num_real, num_accepted)
        entries = None
        if logprobs is not None and request.sampling_params.logprobs:
            entries = logprobs[row]
            assert len(entries) == len(emitted), f"{request.request_id}: logprobs per token"
        return [(t, entries[i] if entries else None) for i, t in enumerate(emitted)]

    def _count(self, req_id: str, num_drafts: int, num_accepted: int) -> None:
        s = self.stats
        s.num_drafts += 1
        s.num_draft_tokens += num_drafts
        s.num_accepted_tokens += num_accepted
        if len(s.accepted_per_position) < num_drafts:
            s.accepted_per_position.extend([0] * (num_drafts - len(s.accepted_per_position)))
        for j in range(num_accepted):
            s.accepted_per_position[j] += 1
        s.accepted_lengths.append((req_id, num_accepted))
        self.verifies.append((req_id, num_drafts, num_accepted))

    def notes(self) -> list[str]:
        """The run's note on uniform decode steps that were not padded to their k (so ran
        without a FULL verify graph) or were padded to a smaller one, by reason."""
        parts = [f"{n} not padded ({why})" for why, n in sorted(self.stats.unpadded.items())] + [
            f"{n} padded to a smaller k ({why})" for why, n in sorted(self.stats.capped.items())
        ]
        if not parts:
            return []
        return [f"runner.spec_decode: uniform decode steps: {'; '.join(parts)}"]

    def take_verifies(self) -> list[tuple[str, int, int]]:
        """The verifies accepted since the previous call, as ``(req_id, drafted, accepted)``."""
        verifies, self.verifies = self.verifies, []
        self.num_reclaimed, self.outcomes = 0, []
        return verifies
