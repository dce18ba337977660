"""Hostile checkpoints through the real command line: a FIFO where a checkpoint file should be,
a config.json declaring absurd sizes, safetensors headers that break the format's rules, and
weights of a non-floating dtype. Each is one line naming the file or field, exit code 2, no
traceback, no hang, and the run database byte for byte as it was (no run row).

The header cases are also handed to the safetensors loader itself: each is a file it refuses
too, so the check before the run is as strict as the loader (and no stricter on a valid file).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open

from mrv2_prof.cli import app
from mrv2_prof.runner.model import PRESETS
from mrv2_prof.runner.model.args import MAX_SIZES
from mrv2_prof.runner.model.checkpoint_args import expected_tensors
from mrv2_prof.runner.model.decoder import LlamaForCausalLM
from mrv2_prof.runner.model.model_kernels import TORCH_MODEL_KERNELS
from mrv2_prof.store import Store
from tests.test_bad_input_cli import CKPT, RUN, Case, _checkpoint, check_case, runner

Edit = Callable[[dict, bytes], tuple[dict | bytes, bytes]]


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block runs past ``seconds``: SIGALRM
    interrupts even a blocking ``open`` of a FIFO."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _fifo_in_ckpt(name: str) -> Callable[[Path], None]:
    """A valid checkpoint whose ``name`` is then a FIFO."""

    def make(d: Path) -> None:
        _checkpoint()(d)
        with contextlib.suppress(FileNotFoundError):
            (d / "ckpt" / name).unlink()
        os.mkfifo(d / "ckpt" / name)

    return make


def _fifo_model(d: Path) -> None:
    os.mkfifo(d / "m.gguf")


def _split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(header: dict | bytes, body: bytes, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + body


def _by_offset(header: dict) -> list[str]:
    names = [k for k in header if k != "__metadata__"]
    return sorted(names, key=lambda k: header[k]["data_offsets"])


def _shift(which: int, delta: int) -> Edit:
    """Move the ``which``-th tensor (by offset) ``delta`` bytes: a gap or an overlap."""

    def edit(header: dict, body: bytes) -> tuple[dict, bytes]:
        entry = header[_by_offset(header)[which]]
        entry["data_offsets"] = [o + delta for o in entry["data_offsets"]]
        return header, body

    return edit


def _set(name: str, **fields) -> Edit:
    def edit(header: dict, body: bytes) -> tuple[dict, bytes]:
        header[name] = {**header[name], **fields}
        return header, body

    return edit


def _metadata(value) -> Edit:
    def edit(header: dict, body: bytes) -> tuple[dict, bytes]:
        return {**header, "__metadata__": value}, body

    return edit


def _raw(transform: Callable[[bytes], bytes]) -> Edit:
    """Edit the header's JSON text."""
    return lambda header, body: (transform(json.dumps(header).encode()), body)


def _duplicate(header: dict, body: bytes) -> tuple[bytes, bytes]:
    """The first tensor given again with the second's offsets (the loader keeps the last)."""
    first, second = _by_offset(header)[:2]
    text = json.dumps(header).encode()
    extra = json.dumps({first: header[second]}).encode()[1:-1]
    return text[:-1] + b", " + extra + b"}", body


def _rewritten(edit: Edit, length: int | None = None) -> Callable[[Path], None]:
    """A valid checkpoint whose model.safetensors is rewritten by ``edit`` (header, data)."""

    def make(d: Path) -> None:
        _checkpoint()(d)
        file = d / "ckpt" / "model.safetensors"
        header, body = edit(*_split(file.read_bytes()))
        file.write_bytes(_join(header, body, length))

    return make


NORM = "model.norm.weight"
HEADER_CASES: dict[str, tuple[Edit, list[str]]] = {
    "overlap": (_shift(1, -4), ["model.safetensors", "overlaps the tensor before it"]),
    "gap": (_shift(1, 4), ["model.safetensors", "a gap of 4 bytes"]),
    "trailing-bytes": (lambda h, b: (h, b + bytes(16)), ["16 bytes after the last tensor"]),
    "metadata-int": (_metadata({"format": 1}), ["__metadata__['format'] is a number"]),
    "metadata-list": (_metadata(["pt"]), ["__metadata__ is list"]),
    "unknown-dtype": (_set(NORM, dtype="F32X"), [repr(NORM), "unknown dtype 'F32X'"]),
    "end-before-begin": (_set(NORM, data_offsets=[8, 4]), [repr(NORM), "ends before it begins"]),
    "negative-dim": (_set(NORM, shape=[-64]), [repr(NORM), "not a list of integers"]),
    "float-offset": (_set(NORM, data_offsets=[0.0, 256]), [repr(NORM), "data_offsets"]),
    "three-offsets": (_set(NORM, data_offsets=[0, 4, 8]), [repr(NORM), "not two integers"]),
    "no-shape": (lambda h, b: ({**h, NORM: {"dtype": "F32", "data_offsets": [0, 4]}}, b),
                 [repr(NORM), "has no shape"]),
    "duplicate-key": (_duplicate, ["model.safetensors", "twice"]),
    "nan": (_raw(lambda t: t.replace(b'"pt"', b"NaN")), ["NaN, which is not JSON"]),
    "not-utf8": (_raw(lambda t: t.replace(b'"pt"', b'"p\xff"')), ["not UTF-8"]),
    "bytes-for-shape": (_set(NORM, shape=[65]), [repr(NORM), "its shape and dtype need 260"]),
}  # fmt: skip


def _case(setup: Callable[[Path], None], expect: list[str], args: list[str] = RUN) -> Case:
    return Case(args, expect, {"s.yaml": CKPT}, setup)


GGUF_RUN = [*RUN[:1], "{dir}/g.yaml", *RUN[2:]]
CASES: dict[str, Case] = {
    # --- FIFOs where checkpoint files should be ----------------------------------------------
    "fifo-safetensors": _case(_fifo_in_ckpt("model.safetensors"), ["model.safetensors", "FIFO"]),
    "fifo-second-shard": _case(_fifo_in_ckpt("z.safetensors"), ["z.safetensors", "FIFO"]),
    "fifo-config": _case(_fifo_in_ckpt("config.json"), ["config.json", "FIFO"]),
    "fifo-generation-config": _case(_fifo_in_ckpt("generation_config.json"),
                                    ["generation_config.json", "FIFO"]),
    "fifo-gguf": Case(GGUF_RUN, ["m.gguf", "FIFO"], {"g.yaml": CKPT.replace("ckpt", "m.gguf")},
                      _fifo_model),
    # --- sizes a config declares ---------------------------------------------------------------
    "layers-200k": _case(_checkpoint(num_hidden_layers=200_000),
                         ["config.json", "'num_hidden_layers' is 200,000", "over the limit"]),
    "layers-500-of-2": _case(_checkpoint(num_hidden_layers=500),
                             ["config.json", "num_hidden_layers is 500", "hold 2 layers"]),
    "layers-1-of-2": _case(_checkpoint(num_hidden_layers=1),
                           ["config.json", "num_hidden_layers is 1", "model.layers.1"]),
    "vocab-1000-of-512": _case(_checkpoint(vocab_size=1000),
                               ["'model.embed_tokens.weight' has shape [512, 64]", "[1000, 64]"]),
    **{f"huge-{key}": _case(_checkpoint(**{key: limit + 1}),
                            ["config.json", f"'{key}' is {limit + 1:,}", "over the limit"])
       for key, limit in MAX_SIZES.items()},
    # --- hostile config values -------------------------------------------------------------------
    "architectures-object": _case(_checkpoint(architectures={"a": 1}),
                                  ["config.json", "architecture {'a': 1} is not supported"]),
    "rope-scaling-list": _case(_checkpoint(rope_scaling=[1]), ["config.json", "'rope_scaling'"]),
    "llama3-factor-string": _case(
        _checkpoint(rope_scaling={"rope_type": "llama3", "factor": "8", "low_freq_factor": 1,
                                  "high_freq_factor": 4}),
        ["config.json", "rope_scaling.factor", "finite number"]),
    # --- weights of a non-floating dtype ---------------------------------------------------------
    "f32-labelled-i32": _case(_rewritten(_set(NORM, dtype="I32")),
                              ["model.safetensors", repr(NORM), "dtype I32", "F32, F16, BF16"]),
    # --- header length -------------------------------------------------------------------------
    "header-over-100mb": _case(_rewritten(lambda h, b: (h, b), length=200_000_000),
                               ["model.safetensors", "over the format's 100,000,000"]),
    **{f"header-{name}": _case(_rewritten(edit), expect)
       for name, (edit, expect) in HEADER_CASES.items()},
}  # fmt: skip


def _generation_eos(d: Path) -> None:
    _checkpoint()(d)
    (d / "ckpt" / "generation_config.json").write_text('{"eos_token_id": "two"}')


CASES["generation-eos-string"] = _case(
    _generation_eos, ["generation_config.json", "'eos_token_id'", "token ids in [0, 512)"]
)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_checkpoint_is_one_line_exit_2_and_the_database_unchanged(
    name: str, tmp_path: Path, base_db: Path
) -> None:
    started = time.monotonic()
    with deadline(60):  # a hang guard (a FIFO opened, a config's sizes walked), not a timing
        check_case(CASES[name], tmp_path, base_db)
    assert time.monotonic() - started < 10  # the 200k-layer case took minutes before


@pytest.mark.parametrize("name", list(HEADER_CASES))
def test_the_safetensors_loader_refuses_each_bad_header_too(name: str, tmp_path: Path) -> None:
    _rewritten(HEADER_CASES[name][0])(tmp_path)
    file = str(tmp_path / "ckpt/model.safetensors")
    with pytest.raises(SafetensorError), safe_open(file, "pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            f.get_tensor(key)


def test_a_valid_checkpoint_still_runs(tmp_path: Path) -> None:
    """The positive control: the same checkpoint, unedited, runs to a completed run row."""
    _checkpoint()(tmp_path)
    workload = "workload: {num_requests: 2, prompt_len: {dist: fixed, value: 4}, " + (
        "output_len: {dist: fixed, value: 2}}\n"
    )
    (tmp_path / "s.yaml").write_text(CKPT.replace("{dir}", str(tmp_path)) + workload)
    db = tmp_path / "runs.duckdb"
    args = [a.replace("{dir}", str(tmp_path)).replace("{db}", str(db)) for a in RUN]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    with Store.open(db) as store:
        assert [run["status"] for run in store.list_runs()] == ["completed"]


def test_a_padded_and_reordered_header_is_accepted(tmp_path: Path) -> None:
    """What the format allows stays allowed: header padding, keys in any order, no metadata."""
    from mrv2_prof.runner.model.safetensors_header import read_header

    _checkpoint()(tmp_path)
    file = tmp_path / "ckpt/model.safetensors"
    header, body = _split(file.read_bytes())
    del header["__metadata__"]
    text = json.dumps(dict(reversed(header.items()))).encode()
    file.write_bytes(_join(text + b" " * (8 - len(text) % 8), body))
    assert len(read_header(file)) == len(header)
    with safe_open(str(file), "pt") as f:
        assert len(list(f.keys())) == len(header)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_expected_tensors_are_the_models_state_dict(name: str) -> None:
    """The one-layer template repeated per layer names exactly what the whole model holds."""
    base = PRESETS[name]
    for args in (base, replace(base, tie_word_embeddings=not base.tie_word_embeddings),
                 replace(base, attention_bias=True)):  # fmt: skip
        with torch.device("meta"):
            model = LlamaForCausalLM(args, TORCH_MODEL_KERNELS)
        whole = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
        assert list(expected_tensors(args).items()) == whole


def test_a_fifo_is_refused_with_nobody_writing_to_it(tmp_path: Path, base_db: Path) -> None:
    """A FIFO config.json is refused without being opened: no helper opens the pipe's other
    end here, so a check that opened it would block until the deadline."""
    _fifo_in_ckpt("config.json")(tmp_path)
    (tmp_path / "s.yaml").write_text(CKPT.replace("{dir}", str(tmp_path)))
    db = tmp_path / "runs.duckdb"
    shutil.copyfile(base_db, db)
    args = [a.replace("{dir}", str(tmp_path)).replace("{db}", str(db)) for a in RUN]
    with deadline(60):
        result = runner.invoke(app, args)
    assert result.exit_code == 2 and "FIFO" in result.output, result.output
