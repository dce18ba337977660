"""Dynamic k that never loses: the step's k from measured acceptance and measured step times.

``dynamic_k`` gives the most drafts a step may verify for its batch size; with ``adaptive`` the
engine asks ``AdaptiveK.choose`` before each step's drafts whether speculation pays for the
batch at all, and at which k. Two measurements, both decayed so that they follow the workload:

* **acceptance per position**: of the verifying request-steps that had a j-th draft slot, the
  share whose j-th draft was accepted (placeholder slots and requests with no drafts count as
  not accepted: they cost a slot and emit nothing). A verifying request then emits
  ``expected_tokens(k) = 1 + sum_{j <= k} rate_j`` tokens a step, against 1 for a plain decode.
* **step time** per (batch-size bucket, k): the host's wall time from one step's start to the
  next, for steps that only decode (no prefill chunk, no admission), the first of each key left
  out (it carries first-use costs: a kernel compiled or loaded for a new shape). Under async
  scheduling and a device-bound loop that is the device's time per step; in any case it is what
  a step costs.

Speculation at k pays when ``expected_tokens(k) / cost_ratio(k) > 1`` with ``cost_ratio(k) =
time(bucket, k) / time(bucket, 0)``; the k with the largest ratio wins, 0 (no drafts) when none
beats 1. A k whose time is not measured yet for the bucket is tried first (``WARMUP`` steps each,
so the first steps of a run speculate at the table's k); and while k is 0, every ``PROBE_EVERY``
decode-only steps one step speculates at the best k, so that the acceptance it would get keeps
being measured (its cost is bounded: one step in ``PROBE_EVERY``). The decision and its inputs
(``expected_tokens`` and ``cost_ratio`` of the best k > 0) go to the probe every step.
"""

from __future__ import annotations

DECAY = 0.98  # each new observation's weight against the history's
WARMUP = 4  # steps timed per (bucket, k) before the time is trusted
PROBE_EVERY = 32  # while k is 0: one speculating step this often, to keep measuring acceptance


def bucket(batch_size: int) -> int:
    """Batch sizes share a time when they round up to the same power of two."""
    return 1 << max(0, batch_size - 1).bit_length()


class AdaptiveK:
    def __init__(self, max_k: int) -> None:
        self.max_k = max_k
        self.slots = [0.0] * (max_k + 1)  # [j]: decayed count of verifies with a j-th slot
        self.accepted = [0.0] * (max_k + 1)  # [j]: of those, with the j-th draft accepted
        self.times: dict[tuple[int, int], tuple[float, int]] = {}  # (bucket, k) -> (ns, n)
        self._seen: set[tuple[int, int]] = set()  # keys whose first (uncounted) step was seen
        self._since_probe = 0
        self.expected_tokens: float | None = None  # the last decision's inputs (best k > 0)
        self.cost_ratio: float | None = None
        self.num_off = 0  # decisions that turned speculation off (k 0 where the table had k)

    def observe_verifies(self, outcomes: list[tuple[int, int]]) -> None:
        """``(slots, accepted)`` of each verifying request-step read since the last call."""
        if not outcomes:
            return
        decay = DECAY ** len(outcomes)
        self.slots = [s * decay for s in self.slots]
        self.accepted = [a * decay for a in self.accepted]
        for slots, accepted in outcomes:
            for j in range(1, min(slots, self.max_k) + 1):
                self.slots[j] += 1.0
                self.accepted[j] += j <= accepted

    def observe_time(self, batch_size: int, k: int, ns: int) -> None:
        """A decode-only step of ``batch_size`` requests at ``k`` took ``ns`` (step to step).
        The first step of each (bucket, k) is not counted: it carries first-use costs (kernels
        compiled or loaded for a new shape) that the following steps do not."""
        key = (bucket(batch_size), k)
        if key not in self._seen:
            self._seen.add(key)
            return
        mean, n = self.times.get(key, (0.0, 0))
        weight = 1.0 / (n + 1) if n < WARMUP else 1.0 - DECAY
        self.times[key] = (mean + weight * (ns - mean), n + 1)

    def expected(self, k: int) -> float:
        """Tokens a verifying request emits per step at ``k`` (1 at k 0)."""
        return 1.0 + sum(
            self.accepted[j] / self.slots[j] for j in range(1, k + 1) if self.slots[j] > 0
        )

    def choose(self, batch_size: int, table_k: int, ks: list[int]) -> int:
        """The step's k for ``batch_size`` running requests: 0 or one of ``ks`` (the ks a
        step may take, each <= ``table_k``, the table's k for the batch)."""
        self.expected_tokens = self.cost_ratio = None
        ks = [k for k in ks if 0 < k <= table_k]
        if table_k == 0 or not ks:
            return 0
        b = bucket(batch_size)
        for k in (*ks, 0):  # measure every k, and k 0, before trusting a ratio
            if self.times.get((b, k), (0.0, 0))[1] < WARMUP:
                return k
        base = self.times[(b, 0)][0]

        def ratio(k: int) -> float:
            return self.times[(b, k)][0] / base if base > 0 else float("inf")

        top = max(ks, key=lambda k: self.expected(k) / ratio(k))  # the best k > 0
        self.expected_tokens, self.cost_ratio = self.expected(top), ratio(top)
        if self.expected_tokens > self.cost_ratio:
            return top
        self._since_probe += 1
        if self._since_probe >= PROBE_EVERY:  # keep measuring the acceptance
            self._since_probe = 0
            return top
        self.num_off += 1
        return 0
