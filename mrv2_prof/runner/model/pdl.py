"""Programmatic dependent launch (PDL) for the model's Triton kernels: the switch and its rules.

On Hopper and later (compute capability 9.0+) a kernel launched with PDL (triton's
``launch_pdl``) may start while the kernel before it in the stream, or in the CUDA graph, is
still running: as soon as every program of that kernel has called ``gdc_launch_dependents``
(griddepcontrol.launch_dependents) or exited. The new kernel's launch and its prologue (loading
model weights, the step's metadata) then overlap the previous kernel's tail; ``gdc_wait``
(griddepcontrol.wait) blocks until the previous kernel is complete and its writes visible. At
batch 1 a decode step is a chain of some 200 small kernels, so the gaps between them are a large
part of the step (the issue's "launch-bound" small models).

A kernel taking ``USE_GDC`` keeps three rules, which make PDL safe whatever kernel comes before
or after it (a kernel launched without PDL starts after the previous one is complete, as ever):

1. Before its first ``gdc_wait`` it reads only what no kernel of the step writes: the model's
   weights, the RoPE tables, and the step's metadata (positions, slot mapping, block table,
   query start and sequence lengths, written before the first layer by the input preparation).
   Every read of an activation, of the KV cache, and every write comes after a ``gdc_wait`` in the
   same or an enclosing block of code.
2. It calls ``gdc_launch_dependents`` only after a ``gdc_wait`` (so when the kernel after it starts,
   the kernel before it is complete: rule 1's "written before" holds across the chain).
3. A ``gdc_wait`` inside a loop is followed by one at the top level before anything after the
   loop (a loop may run no iteration; a second wait is a no-op).

``tests/runner/test_pdl_order.py`` checks the three on each kernel's compiled code (compiled for
sm_90 on the CPU, no GPU needed), and a GPU test checks that a PDL-launched decode step gives the
same output as the ordinary launches.

``LAUNCH_PDL`` (set from the ``runner.pdl`` setting when a runner is built:
``runner/worker/kernel_paths.py``; ``auto`` by default, on from compute capability 9.0, where
``benchmarks/decode_roofline.py`` measured it faster at every preset). It is read at each
launch, so it must be set before a CUDA graph is captured.
The interpreter and GPUs before compute capability 9.0 launch as ever.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

LAUNCH_PDL = False  # the module docstring: off until measured on the H200


@functools.cache
def _supports_pdl(device: torch.device) -> bool:
    """A CUDA device of compute capability 9.0 or more (never the interpreter's CPU tensors)."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def use_pdl(device: torch.device) -> bool:
    """Whether kernels launched now on ``device`` take PDL (``USE_GDC`` and ``launch_pdl``)."""
    return LAUNCH_PDL and _supports_pdl(device)


def launch_options(pdl: bool) -> dict[str, Any]:
    """The launch keywords for a kernel taking ``USE_GDC``: the constexpr and, with PDL, the
    launch attribute."""
    return {"USE_GDC": True, "launch_pdl": True} if pdl else {"USE_GDC": False}
