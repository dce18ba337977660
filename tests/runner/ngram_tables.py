"""What the device n-gram tests share: the device the kernels run on (the Triton interpreter's
CPU without CUDA), the n-gram windows, the value ``out_tokens`` holds before a call."""

from __future__ import annotations

import pytest
import torch

INTERPRET = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
WINDOWS = [(1, 1), (2, 4), (1, 3), (3, 3)]
FILL = -7  # what out_tokens holds before a call: positions past the drafts keep it

needs_cuda = pytest.mark.skipif(INTERPRET, reason="needs CUDA")
