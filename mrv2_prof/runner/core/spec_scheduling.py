"""The scheduler's side of speculative decoding: drafts, lookahead slots, accepted runs.

A decoding request (one token to compute) gets up to ``k`` n-gram drafts from its host token
history; the scheduler then schedules ``1 + len(drafts)`` tokens for it and allocates their KV
slots (the lookahead), so the verify forward can write every draft's KV. When the step's output
comes back the request's emitted run (accepted drafts plus one token) is appended and its
``num_computed_tokens`` rolled back by the rejected count, as the runner does on the device.

k is capped so that every emitted token fits: ``budget - 1``, the request's remaining
``max_tokens`` minus one, and ``max_model_len`` minus its tokens minus one. A request that asks
for logprobs is not speculated (its verify rows would need a logprob per accepted token).

With async scheduling the host learns a verify's accepted count only with its tokens, one step
later, and the reference attention needs each request's exact length on the host; so a request
with tokens in flight sits out the step (its next step drafts from its complete history). A plain
decode with a token in flight also sits out while k > 0, so that it can draft next time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mrv2_prof.runner.core.request import Request, RequestStatus
from mrv2_prof.runner.spec_decode.config import SpecDecodeConfig
from mrv2_prof.runner.spec_decode.ngram_proposer import propose


@dataclass
class SpecStepStats:
    """What the verifies did since the run began (vLLM's spec-decode counters)."""

    num_drafts: int = 0  # requests that verified at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [max k]
    # (req_id, accepted drafts), one entry per verify
    accepted_lengths: list[tuple[str, int]] = field(default_factory=list)


class SpecScheduling:
    def __init__(self, config: SpecDecodeConfig, async_scheduling: bool) -> None:
        self.config = config
        self.async_scheduling = async_scheduling
        self.k = 0  # this step's k
        self.tokens: dict[str, list[int]] = {}  # this step's drafts, by request
        self._verifying: set[str] = set()  # async: verifies in flight
        self._proposals: dict[str, list[int]] | None = None  # ``draft``'s, until the step ends
        self.stats = SpecStepStats()
        self.verifies: list[tuple[str, int, int]] = []  # (req_id, drafted, accepted) to report

    def draft(self, running: list[Request], max_model_len: int) -> None:
        """Propose the drafts of the step about to be scheduled, for every running request
        that is about to compute its last token and does not sit out (the engine times this
        as the ``draft`` phase; ``schedule`` calls it when nobody did)."""
        self.k = self.config.k_for(len(running))
        self._proposals = {}
        if self.k == 0:
            return
        cfg = self.config
        for request in running:
            n = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
            params = request.sampling_params
            if n != 1 or self.sits_out(request) or params.logprobs:
                continue
            k = min(
                self.k,
                params.max_tokens - request.num_output_tokens - 1,
                max_model_len - request.num_tokens - 1,
            )
            if k > 0:
                drafts = propose(request.all_token_ids, k, cfg.ngram_min, cfg.ngram_max)
                if drafts:
                    self._proposals[request.request_id] = drafts

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
        if self.async_scheduling:
            self._verifying.update(self.tokens)
        return self.tokens

    def sits_out(self, request: Request) -> bool:
        """Async: the request's tokens in flight are not known yet (see the module doc)."""
        if not self.async_scheduling:
            return False
        if request.num_output_placeholders == 0:  # nothing in flight (a verify was dropped)
            self._verifying.discard(request.request_id)
            return False
        return self.k > 0 or request.request_id in self._verifying

    def num_new_tokens(self, request: Request, budget: int) -> int:
        """The tokens to schedule for a request about to compute its last token: 1 + its
        drafts (as many as ``budget`` leaves room for), or 0 when it sits out."""
        if self.sits_out(request):
            return 0
        drafts = self._proposals.get(request.request_id, [])[: budget - 1]
        if drafts:
            self.tokens[request.request_id] = drafts
        return 1 + len(drafts)

    def accept(self, request: Request, drafts: list[int], emitted: list[int]) -> list[int]:
        """The verify of ``drafts`` emitted ``emitted`` (accepted drafts, then one token): roll
        ``request`` back by the rejected count, count the step, return the tokens to append."""
        num_accepted = len(emitted) - 1
        assert 0 <= num_accepted <= len(drafts), f"{request.request_id}: {emitted} for {drafts}"
        assert emitted[:num_accepted] == drafts[:num_accepted], "accepted tokens are the drafts"
        self._verifying.discard(request.request_id)
        if self.async_scheduling:
            request.num_output_placeholders -= 1 + len(drafts)
        if request.status is RequestStatus.RUNNING:  # a preempted request starts from 0
            request.num_computed_tokens -= len(drafts) - num_accepted
        s = self.stats
        s.num_drafts += 1
        s.num_draft_tokens += len(drafts)
        s.num_accepted_tokens += num_accepted
        if len(s.accepted_per_position) < len(drafts):
            s.accepted_per_position.extend([0] * (len(drafts) - len(s.accepted_per_position)))
        for j in range(num_accepted):
            s.accepted_per_position[j] += 1
        s.accepted_lengths.append((request.request_id, num_accepted))
        self.verifies.append((request.request_id, len(drafts), num_accepted))
        return emitted

    def take_verifies(self) -> list[tuple[str, int, int]]:
        """The verifies accepted since the previous call, as ``(req_id, drafted, accepted)``."""
        verifies, self.verifies = self.verifies, []
        return verifies
