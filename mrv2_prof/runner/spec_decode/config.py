"""Speculative decoding settings (``runner.spec_decode``), validated once and frozen.

``method`` picks the drafter: ``none`` (off), ``ngram`` (prompt lookup over the request's prompt
and output tokens, ``ngram_proposer``) or ``draft_model`` (a second model run on the device,
``draft_model.py``: exactly one of ``draft_preset``, ``draft_path`` or ``draft_target_layers``,
the target's first N layers with its final norm and LM head; the checks that need the models,
the vocabulary and N's range, are ``draft_model.draft_problem``). Each speculating
decode proposes up to ``num_speculative_tokens`` drafts; with ``dynamic_k`` the step's k comes
from the batch size instead: the k of the smallest ``batch_size_upper_bound`` at or above the
number of running requests, and 0 (no drafts) above the largest bound.

``draft_on`` says where the drafts are made and kept: ``device`` (the default through ``auto``)
drafts on the device after each step (the n-gram lookup over a device copy of each request's
tokens, ``ngram_device.py``; a draft model's proposals as they come out of it) and the next verify
reads them there, so the scheduler schedules ``1 + k`` slots per decoding request without knowing
the drafts and, under async scheduling, no request waits for its last tokens; ``host`` drafts
from the host's token history (``NgramIndex``; the draft model's proposals copied back) and
schedules exactly the drafts it has, so under async scheduling a speculating request sits out
every other step. ``adaptive`` (default: on with ``dynamic_k``) lets the measured acceptance and
step times turn the step's k down to 0 where speculation does not pay
(core/adaptive_k.py). Imports no torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

SPEC_METHODS = ("none", "ngram", "draft_model")
DRAFT_ON = ("auto", "device", "host")
MAX_SPECULATIVE_TOKENS = 16  # one verify row per draft: the rows of a request stay small
MAX_NGRAM = 64  # the lookup compares every window of the history: a longer n finds nothing
# A placeholder draft slot (vLLM's -1): a request padded up to the step's k carries it after its
# real drafts; it is scheduled and given a KV slot like a draft, and never accepted.
PAD_DRAFT = -1
# A draft slot whose token the host does not know (``draft_on: device``): the verify reads the
# request slot's drafts on the device; a slot past the drafts it has is a placeholder.
DEVICE_DRAFT = -2


@dataclass(frozen=True)
class SpecDecodeConfig:
    method: str = "none"
    num_speculative_tokens: int = 4
    # ((batch size upper bound, k), ...) sorted by bound; None: always num_speculative_tokens
    dynamic_k: tuple[tuple[int, int], ...] | None = None
    ngram_min: int = 2
    ngram_max: int = 4
    draft_preset: str | None = None
    draft_path: str | None = None
    draft_target_layers: int | None = None
    draft_on: str = "auto"
    adaptive: bool | None = None  # None: on with dynamic_k

    def __post_init__(self) -> None:
        for name, problem in self.problems():
            from mrv2_prof.runner.config import invalid

            raise invalid(f"spec_decode.{name}", problem)

    def problems(self) -> Iterator[tuple[str, str]]:
        """``(field under spec_decode, problem)``, the first to fix first."""
        if self.method not in SPEC_METHODS:
            yield "method", f"{self.method!r} is not one of {', '.join(SPEC_METHODS)}"
        if self.draft_on not in DRAFT_ON:
            yield "draft_on", f"{self.draft_on!r} is not one of {', '.join(DRAFT_ON)}"
        if self.method == "draft_model":
            given = [
                name
                for name, value in (
                    ("preset", self.draft_preset),
                    ("path", self.draft_path),
                    ("target_layers", self.draft_target_layers),
                )
                if value is not None
            ]
            if len(given) != 1:
                found = ", ".join(given) if given else "none"
                yield (
                    "draft",
                    f"method draft_model needs exactly one of preset, path or target_layers "
                    f"(found {found})",
                )
            if self.draft_target_layers is not None and self.draft_target_layers < 1:
                yield "draft.target_layers", f"must be >= 1, got {self.draft_target_layers}"
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            yield (
                "num_speculative_tokens",
                f"must be in [1, {MAX_SPECULATIVE_TOKENS}], got {self.num_speculative_tokens}",
            )
        if not 1 <= self.ngram_min <= self.ngram_max <= MAX_NGRAM:
            yield (
                "ngram.min",
                f"needs 1 <= min <= max <= {MAX_NGRAM}, got [{self.ngram_min}, {self.ngram_max}]",
            )
        bounds = [b for b, _ in self.dynamic_k or ()]
        if self.dynamic_k is not None and not self.dynamic_k:
            yield "dynamic_k", "needs at least one {batch_size_upper_bound: k} entry"
        if bounds != sorted(set(bounds)) or any(b < 1 for b in bounds):
            yield "dynamic_k", f"batch size bounds must be distinct integers >= 1, got {bounds}"
        for bound, k in self.dynamic_k or ():
            if not 0 <= k <= self.num_speculative_tokens:
                yield (
                    "dynamic_k",
                    f"k {k} for batch size {bound} is outside [0, num_speculative_tokens "
                    f"{self.num_speculative_tokens}]",
                )
                break

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def on_device(self) -> bool:
        """Drafts made and kept on the device (``draft_on`` auto or device)."""
        return self.enabled and self.draft_on != "host"

    @property
    def is_adaptive(self) -> bool:
        """Dynamic k may turn a step's k down by the measured acceptance and step times."""
        return self.enabled and (
            self.adaptive if self.adaptive is not None else bool(self.dynamic_k)
        )

    @property
    def max_k(self) -> int:
        """The most drafts any step can propose per request."""
        if not self.enabled:
            return 0
        if self.dynamic_k is None:
            return self.num_speculative_tokens
        return max(k for _, k in self.dynamic_k)

    def k_for(self, batch_size: int) -> int:
        """The step's k for ``batch_size`` running requests."""
        if not self.enabled:
            return 0
        if self.dynamic_k is None:
            return self.num_speculative_tokens
        bounds = [b for b, _ in self.dynamic_k]
        i = bisect.bisect_left(bounds, batch_size)
        return self.dynamic_k[i][1] if i < len(bounds) else 0

    def possible_ks(self, max_batch_size: int) -> list[int]:
        """Every k a step with 1..``max_batch_size`` running requests can choose, ascending."""
        return sorted({self.k_for(b) for b in range(1, max_batch_size + 1)})
