"""Request lifecycle: what the scheduler and engine track per request (vLLM's ``Request``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters. ``temperature == 0`` is greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int | None = None  # None: derived from the engine seed and the request id
    max_tokens: int = 16
    logprobs: int = 0  # top-k logprobs to return per output token
    prompt_logprobs: int | None = None  # None: off; k: each prompt token's logprob + top-k
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}")


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"  # EOS or a stop token
    FINISHED_LENGTH = "length"  # max_tokens or max_model_len
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self._value_ in _FINISHED_VALUES  # a str test: an enum member hashes slowly


_FINISHED_VALUES = frozenset(("stop", "length", "abort"))


@dataclass
class Request:
    """One request: its tokens so far and how much of them has been computed into the KV cache.

    ``all_token_ids`` = prompt + outputs. ``num_computed_tokens`` counts tokens whose KV is in
    the cache; with async scheduling it may include ``num_output_placeholders`` tokens that were
    sampled on the GPU but have not reached the host yet. Lower ``priority`` values are served
    first; ties by arrival.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    priority: int = 0
    eos_token_ids: tuple[int, ...] = ()
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # prompt_logprobs[i]: prompt token i + 1 and the top-k, given prompt tokens 0..i
    prompt_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    all_token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    # Async scheduling: tokens sampled by steps still in flight (known to the GPU, not yet here).
    num_output_placeholders: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit on first scheduling (-1: not yet)
    num_preemptions: int = 0
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(
        self, token_id: int, logprobs: list[tuple[int, float]] | None = None
    ) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)

    def add_prompt_logprobs(self, start: int, entries: list) -> None:
        """Prompt logprobs from position ``start`` on; those already known (positions computed
        again after a preemption) are kept."""
        known = len(self.prompt_logprobs) - start
        assert known >= 0, f"{self.request_id}: prompt logprobs from {start} leave a gap"
        self.prompt_logprobs.extend(entries[known:])

    def stop_status(self, token: int, max_model_len: int) -> RequestStatus | None:
        """The finished status ``token`` (just appended) gives the request, if any."""
        params = self.sampling_params
        if not params.ignore_eos and token in self.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if self.num_output_tokens >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    @property
    def schedule_key(self) -> tuple[int, float]:
        """Order of service: smaller first. The largest key is preempted first."""
        return (self.priority, self.arrival_time)
