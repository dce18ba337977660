"""NVTX ranges for Nsight Systems: one domain ``mrv2``, a range per step and per phase.

Every span the ``RecordingProbe`` records on the CPU clock is also an NVTX push/pop, so an
Nsight Systems capture of the same run shows the same ranges on its timeline:

* domain ``mrv2``; a category per subsystem (scheduler, input prep, forward, sampler, state
  update, harness);
* message = the phase's range name, following vLLM's ``gpu_model_runner: <phase>`` names where
  vLLM has one, so existing nsys filters work (``NVTX_NAMES``; the trace export uses the same);
* payload = the step index; a ``step`` range around each step, and at its end a mark with the
  step's batch shape (requests, prefill and decode tokens);
* at run start, a mark carrying the run id and the ``perf_counter_ns`` value taken at the same
  moment, so the capture's clock can be aligned exactly with the run's stored timestamps.

Event attributes are built once per phase; a push only sets the payload (an integer) and calls
the NVTX C API. Without a tool attached (no ``nsys``), the ``nvtx`` package hands out a dummy
domain and every call returns at once. Ranges are pushed by the host: for a replayed CUDA graph
the ``forward`` range spans the replay launch (ranges pushed while capturing do not replay).
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from mrv2_prof.probes.api import PHASES, STEP
from mrv2_prof.probes.recording import RecordingProbe

DOMAIN = "mrv2"
# The run-start mark's message; the trace export writes the same text, nsys import parses it.
RUN_START_MARK = "mrv2 run {run_id} perf_counter_ns={t_ns}"

NVTX_NAMES = {
    "step": "step",
    "schedule": "scheduler: schedule",
    "execute": "gpu_model_runner: execute_model",
    "prepare": "gpu_model_runner: preprocess",
    "forward": "gpu_model_runner: forward",
    "sample": "gpu_model_runner: sample",
    "output_wait": "gpu_model_runner: output_wait",
    "update": "scheduler: update_from_output",
    "flush": "harness: flush",
    "draft": "spec_decode: propose",
}
CATEGORIES = {
    "step": "scheduler",
    "schedule": "scheduler",
    "execute": "forward",
    "prepare": "input prep",
    "forward": "forward",
    "sample": "sampler",
    "output_wait": "state update",
    "update": "state update",
    "flush": "harness",
    "draft": "scheduler",
}


def get_domain(name: str = DOMAIN) -> Any:
    import nvtx

    return nvtx.get_domain(name)


class NvtxRecordingProbe(RecordingProbe):
    """``RecordingProbe`` that also pushes every span as an NVTX range of ``domain``."""

    def __init__(self, domain: Any | None = None, capacity: int = 1 << 14) -> None:
        super().__init__(capacity)
        self.domain = domain if domain is not None else get_domain()
        d = self.domain
        self._attrs = [
            d.get_event_attributes(
                message=NVTX_NAMES[p], category=d.get_category_id(CATEGORIES[p]), payload=0
            )
            for p in PHASES
        ]
        # No tool attached: the dummy domain builds no attributes and records nothing, and
        # the hooks are the recording probe's own (no extra frame per hook on the step loop).
        self.active = all(a is not None for a in self._attrs)
        if not self.active:
            for name in ("step_begin", "_step_recorded", "begin", "end", "switch"):
                setattr(self, name, getattr(super(), name))

    def mark_run_start(self, run_id: str) -> int:
        """The alignment mark: run id and the ``perf_counter_ns`` it was emitted at."""
        t_ns = perf_counter_ns()
        self.domain.mark(message=RUN_START_MARK.format(run_id=run_id, t_ns=t_ns), payload=t_ns)
        return t_ns

    def _push(self, phase: int) -> None:
        if self.active:
            attrs = self._attrs[phase]
            attrs.payload = self.step
            self.domain.push_range(attrs)

    def _pop(self) -> None:
        if self.active:
            self.domain.pop_range()

    def step_begin(self, step: int) -> None:
        super().step_begin(step)
        self._push(STEP)

    def _step_recorded(
        self, num_reqs: int, num_tokens: int, num_prefill_tokens: int, graph_mode: str
    ) -> None:
        if self.active:
            self.domain.mark(
                message=batch_shape(num_reqs, num_tokens, num_prefill_tokens, graph_mode),
                payload=self.step,
            )
        self._pop()

    def begin(self, phase: int) -> None:
        super().begin(phase)
        self._push(phase)

    def end(self, phase: int) -> None:
        self._pop()
        super().end(phase)

    def switch(self, ending: int, beginning: int) -> None:
        self._pop()
        super().switch(ending, beginning)
        self._push(beginning)


def batch_shape(num_reqs: int, num_tokens: int, num_prefill_tokens: int, graph_mode: str) -> str:
    """The step mark's message, e.g. ``batch 64 reqs: 0 prefill + 64 decode tokens, full``."""
    decode = num_tokens - num_prefill_tokens
    return (
        f"batch {num_reqs} reqs: {num_prefill_tokens} prefill + {decode} decode tokens, "
        f"{graph_mode}"
    )
