"""Workspaces the Triton kernels keep between launches, safe under CUDA graphs.

Three kernels reduce across programs in one launch through buffers they keep: split-KV decode
attention (``split_kv_workspace.py``: each split's partials and the rows' counters), the
sampler's split scan (``runner/worker/gumbel_argmax_triton.py``: the splits' partials and
counters) and the batch-1 MLP (``mlp_decode_triton.py``: the float32 sum row and its counter).
Each keeps one ``KernelWorkspace``: per device, buffers that

* grow to fit a launch, each size at least doubled, and never shrink: a batch no larger than an
  earlier one reuses its buffers, so steady serving allocates nothing;
* never grow during a CUDA graph capture (a capture runs its body once eagerly first,
  ``cudagraph_runner._capture``): growing there is an error that names the workspace and the
  eager launch that would have sized it;
* are kept once grown out, as a captured graph may still read them.

The kernels leave the counters (and the MLP's sum row) at zero after each launch; a workspace's
``make`` allocates them zeroed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class KernelWorkspace:
    """Per device: the buffers ``make(device, *sizes)`` returns, for the largest ``sizes`` asked
    so far (at least doubled at each growth), never grown during a CUDA graph capture."""

    def __init__(
        self, what: str, eager_first: str, make: Callable[..., tuple[torch.Tensor, ...]]
    ) -> None:
        self.what = what  # "the split-KV attention workspace": the capture error names it
        self.eager_first = eager_first  # what sizes it outside a capture
        self.make = make
        self._sizes: dict[torch.device, tuple[int, ...]] = {}
        self._buffers: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        self._kept: list[torch.Tensor] = []

    def get(self, device: torch.device, *need: int) -> tuple[torch.Tensor, ...]:
        """``device``'s buffers, grown so that each size is at least its ``need``."""
        had = self._sizes.get(device)
        if had is not None and all(n <= h for n, h in zip(need, had, strict=True)):
            return self._buffers[device]
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{self.what} grows during a CUDA graph capture: {self.eager_first} before "
                "capturing"
            )
        sizes = need
        if had is not None:
            sizes = tuple(max(n, 2 * h) for n, h in zip(need, had, strict=True))
            self._kept += self._buffers[device]
        self._buffers[device] = self.make(device, *sizes)
        self._sizes[device] = sizes
        return self._buffers[device]

    def buffers(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """``device``'s current buffers (after a ``get``)."""
        return self._buffers[device]
