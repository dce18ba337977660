"""A checkpoint's ``*.safetensors`` headers against the tensors its ``config.json`` implies.

Run before a run starts (and again by the loader): the number of decoder layers the files hold
is compared with ``num_hidden_layers`` first (by their names, so a config that declares far more
layers than the files hold is named at once), then every tensor the model loads must be present
with its shape and a floating-point dtype the loader casts from. Extra tensors (rotary buffers,
an unused ``lm_head.weight``) are allowed, as the loader ignores them; extra layers are not.
"""

from __future__ import annotations

import re
from pathlib import Path

from mrv2_prof.runner.model.args import CheckpointError
from mrv2_prof.runner.model.safetensors_header import TensorEntry, read_header

# The dtypes the loader reads weights from (each is cast to the run's dtype); integer data
# labelled as weights, or FP8 without its scales, would load as garbage.
WEIGHT_DTYPES = ("F32", "F16", "BF16", "F64")
_LAYER = re.compile(r"model\.layers\.(\d{1,9})\.")


def check_tensors(
    directory: Path,
    files: list[Path],
    expected: dict[str, tuple[int, ...]],
    num_hidden_layers: int | None = None,
) -> None:
    """Every expected tensor present with its shape and a weight dtype in the files' headers
    (the first file holding a name wins, as in the loader); ``num_hidden_layers`` (the
    config's) against the layers the files hold."""
    found: dict[str, tuple[TensorEntry, Path]] = {}
    for file in files:
        for name, entry in read_header(file).items():
            found.setdefault(name, (entry, file))
    if num_hidden_layers is not None:
        _check_layers(directory, found, num_hidden_layers)
    missing = [name for name in expected if name not in found]
    if missing:
        more = f" (and {len(missing) - 1:,} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{directory}: tensor {missing[0]!r} is missing{more}")
    for name, shape in expected.items():
        entry, file = found[name]
        if entry.shape != shape:
            raise CheckpointError(
                f"{file}: tensor {name!r} has shape {list(entry.shape)}, expected {list(shape)}"
            )
        if entry.dtype not in WEIGHT_DTYPES:
            raise CheckpointError(
                f"{file}: tensor {name!r} has dtype {entry.dtype}, expected a floating-point "
                f"weight dtype ({', '.join(WEIGHT_DTYPES)})"
            )


def _check_layers(directory: Path, found: dict, num_hidden_layers: int) -> None:
    """The layer indices the tensor names hold are exactly 0 .. num_hidden_layers - 1."""
    held = {int(m.group(1)) for name in found if (m := _LAYER.match(name))}
    if not held:
        return  # no layer tensors at all: the missing-tensor check names the first
    config = directory / "config.json"
    top = max(held)
    if top >= num_hidden_layers:
        raise CheckpointError(
            f"{config}: num_hidden_layers is {num_hidden_layers:,}, but the *.safetensors "
            f"files hold layer model.layers.{top} ({len(held):,} layers)"
        )
    if len(held) < num_hidden_layers:
        gap = next(i for i in range(num_hidden_layers) if i not in held)
        raise CheckpointError(
            f"{config}: num_hidden_layers is {num_hidden_layers:,}, but the *.safetensors "
            f"files hold {len(held):,} layers (no tensor of model.layers.{gap})"
        )
