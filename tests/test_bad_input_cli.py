"""Bad input through the real command line: one line naming the field or file, exit code 2, no
traceback, no hang, and the run database left byte for byte as it was (no run row, no file
written beside it).

One case (at least) per class of bad input: strict types, non-finite numbers, seeds, bounds
that come from the model, checkpoints, memory, upper bounds, duplicate keys, input files
(type, size, encoding, YAML aliases and depth), markup and control characters in what is
echoed, and output files that would overwrite the database.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.runner.model import PRESETS
from mrv2_prof.store import Store

runner = CliRunner()
TINY = "model: {preset: llama-tiny}\n"
RUNNER = "runner: {device: cpu, kernels: torch, num_kv_blocks: 64, max_model_len: 256}\n"
OK = "name: ok\n" + TINY + RUNNER  # a scenario that would run
VOCAB = PRESETS["llama-tiny"].vocab_size
ESC = "\x1b"


@dataclass
class Case:
    args: list[str]  # {dir} and {db} are replaced
    expect: list[str]  # parts of the one line
    files: dict[str, str | bytes] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None


def bomb(levels: int = 9) -> str:
    """A YAML "billion laughs": 9 ** levels values from a few hundred bytes."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def flow_bomb(levels: int = 9) -> str:
    """The same bomb on one line, as a ``--set`` value."""
    items = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    items += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def trace_text(*lines: dict) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def _fifo(name: str) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        os.mkfifo(d / name)

    return make


def _checkpoint(**config_edits) -> Callable[[Path], None]:
    """A llama-tiny-shaped checkpoint (zeros) in ``ckpt/``, its config edited; ``drop`` removes
    a tensor, ``truncate`` cuts the file to that many bytes."""
    drop = config_edits.pop("drop", None)
    truncate = config_edits.pop("truncate", None)

    def make(d: Path) -> None:
        import torch
        from safetensors.torch import save_file

        from mrv2_prof.runner.model.checkpoint_args import expected_tensors

        args = PRESETS["llama-tiny"]
        out = d / "ckpt"
        out.mkdir()
        tensors = {n: torch.zeros(s) for n, s in expected_tensors(args).items() if n != drop}
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
        if truncate is not None:
            with open(out / "model.safetensors", "r+b") as f:
                f.truncate(truncate)
        (out / "config.json").write_text(json.dumps({**args.to_hf_config(), **config_edits}))

    return make


def _links(d: Path) -> None:
    os.symlink(d / "runs.duckdb", d / "link.json")
    os.link(d / "runs.duckdb", d / "hard.json")
    (d / "sub").mkdir()


LOGNORMAL_INF = "{dist: lognormal, mean: 9, sigma: .inf}"
DEEP = "[" * 30000 + "]" * 30000
DB = "runs.duckdb"
LINE = '{"prompt_len": 2, "max_tokens": 1}\n'
CKPT = "name: c\nmodel: {path: {dir}/ckpt}\n" + RUNNER
RUN = ["run", "{dir}/s.yaml", "--db", "{db}", "--headless"]

CASES: dict[str, Case] = {
    # --- strict types, finite numbers --------------------------------------------------------
    "bool-for-int": Case(RUN, ["s.yaml: runner.max_num_seqs", "valid integer", "True"],
                         {"s.yaml": "name: b\n" + TINY + "runner: {max_num_seqs: true}\n"}),
    "str-for-int": Case([*RUN, "--set", "runner.max_num_seqs='8'"],
                        ["s.yaml: runner.max_num_seqs", "valid integer", "'8'"], {"s.yaml": OK}),
    "inf-temperature": Case([*RUN, "--set", "workload.sampling.temperature=.inf"],
                            ["workload.sampling.temperature", "finite"], {"s.yaml": OK}),
    "inf-mean": Case([*RUN, "--set", "workload.prompt_len={dist: normal, mean: .inf, std: 1}"],
                     ["workload.prompt_len.mean", "finite"], {"s.yaml": OK}),
    "inf-sigma": Case([*RUN, "--set", "workload.output_len=" + LOGNORMAL_INF],
                      ["workload.output_len.sigma", "finite"], {"s.yaml": OK}),
    # --- seeds -------------------------------------------------------------------------------
    "seed": Case([*RUN, "--set", f"seed={2**63}"], ["s.yaml: seed: must be < 2147483648"],
                 {"s.yaml": OK}),
    "model-seed": Case([*RUN, "--set", f"model.seed={2**63}"], ["model.seed: must be <"],
                       {"s.yaml": OK}),
    "sampling-seed": Case([*RUN, "--set", f"workload.sampling.seed={2**64}"],
                          ["workload.sampling.seed", "64-bit"], {"s.yaml": OK}),
    "trace-seed": Case(RUN, ["t.jsonl: line 1: seed: must be <="],
                       {"s.yaml": OK + "workload: {trace: t.jsonl}\n",
                        "t.jsonl": trace_text({"prompt_len": 2, "max_tokens": 2, "seed": 2**63})}),
    # --- bounds from the model ---------------------------------------------------------------
    "logprobs-over-vocab": Case([*RUN, "--set", f"workload.sampling.logprobs={VOCAB + 1}"],
                                ["workload.sampling.logprobs", f"vocabulary size {VOCAB}"],
                                {"s.yaml": OK}),
    "top-k-huge": Case([*RUN, "--set", "workload.sampling.top_k=100000000000000000000"],
                       ["workload.sampling.top_k", "vocabulary"], {"s.yaml": OK}),
    "trace-prompt-logprobs": Case(RUN, ["t.jsonl: line 2: prompt_logprobs", "vocabulary"],
                                  {"s.yaml": OK + "workload: {trace: t.jsonl}\n",
                                   "t.jsonl": trace_text({"prompt_len": 2, "max_tokens": 1},
                                                    {"prompt_len": 2, "max_tokens": 1,
                                                     "prompt_logprobs": VOCAB + 1})}),
    "max-model-len": Case([*RUN, "--set", "runner.max_model_len=8192",
                           "--set", "runner.num_kv_blocks=1024"],
                          ["s.yaml: runner.max_model_len", "max_position_embeddings 4,096"],
                          {"s.yaml": OK}),
    # --- checkpoints -------------------------------------------------------------------------
    "ckpt-zero-layers": Case(RUN, ["config.json", "num_hidden_layers", ">= 1, got 0"],
                             {"s.yaml": CKPT}, _checkpoint(num_hidden_layers=0)),
    "ckpt-zero-heads": Case(RUN, ["config.json", "num_attention_heads", "got 0"],
                            {"s.yaml": CKPT}, _checkpoint(num_attention_heads=0)),
    "ckpt-vocab-string": Case(RUN, ["config.json", "vocab_size", "'512'"],
                              {"s.yaml": CKPT}, _checkpoint(vocab_size="512")),
    "ckpt-missing-tensor": Case(RUN, ["ckpt: tensor 'model.norm.weight' is missing"],
                                {"s.yaml": CKPT}, _checkpoint(drop="model.norm.weight")),
    "ckpt-corrupt-header": Case(RUN, ["model.safetensors: not a valid safetensors file"],
                                {"s.yaml": CKPT}, _checkpoint(truncate=100)),
    "ckpt-truncated-data": Case(RUN, ["model.safetensors", "past the end of the file"],
                                {"s.yaml": CKPT}, _checkpoint(truncate=20_000)),
    # --- memory ------------------------------------------------------------------------------
    "kv-cache-memory": Case([*RUN, "--set", "runner.num_kv_blocks=1000000000"],
                            ["s.yaml: runner.num_kv_blocks", "the KV cache", "free on the host"],
                            {"s.yaml": OK}),
    "request-state-memory": Case([*RUN, "--set", "runner.max_num_reqs=1000000000"],
                                 ["runner.max_num_reqs", "request state", "free on the host"],
                                 {"s.yaml": OK}),
    # --- upper bounds with the reason ----------------------------------------------------------
    "num-requests": Case([*RUN, "--set", f"workload.num_requests={10**12}"],
                         ["workload.num_requests", "must be <= 1,000,000", "in memory"],
                         {"s.yaml": OK}),
    "prefix-len": Case([*RUN, "--set", f"workload.shared_prefix.len={10**9}"],
                       ["workload.shared_prefix.len", "<= 10,000,000"], {"s.yaml": OK}),
    "prefix-groups": Case([*RUN, "--set", f"workload.shared_prefix.groups={10**9}"],
                          ["workload.shared_prefix.groups", "<= 1,000,000"], {"s.yaml": OK}),
    "trace-arrival": Case(RUN, ["t.jsonl: line 1: arrival_s", "86,400", "wall time"],
                          {"s.yaml": OK + "workload: {trace: t.jsonl}\n",
                           "t.jsonl": trace_text({"prompt_len": 2, "max_tokens": 1,
                                             "arrival_s": 1e12})}),
    "slow-rate": Case([*RUN, "--set", "workload.arrival={pattern: constant, rate: 1.0e-9}"],
                      ["workload.arrival.rate", "more than a day"], {"s.yaml": OK}),
    "matrix-size": Case(RUN, ["s.yaml: matrix", "1,000,000 combinations", "one run"],
                        {"s.yaml": OK + "matrix:\n" + "".join(
                            f"  runner.{k}: [{', '.join(map(str, range(1, 101)))}]\n"
                            for k in ("block_size", "max_num_seqs", "max_num_batched_tokens"))}),
    # --- duplicate keys ------------------------------------------------------------------------
    "duplicate-key": Case(RUN, ["s.yaml: line 4", "key runner given twice"],
                          {"s.yaml": OK + "runner: {uva: false}\n"}),
    # --- input files ---------------------------------------------------------------------------
    "scenario-fifo": Case(["run", "{dir}/f.yaml", "--db", "{db}"], ["f.yaml", "FIFO"],
                          setup=_fifo("f.yaml")),
    "scenario-device": Case(["run", "/dev/zero", "--db", "{db}"], ["/dev/zero", "a device"]),
    "scenario-directory": Case(["run", "{dir}", "--db", "{db}"], ["is a directory"]),
    "scenario-too-big": Case(RUN, ["s.yaml", "over the limit of 1,048,576 bytes"],
                             {"s.yaml": OK + "# " + "x" * (1 << 20) + "\n"}),
    "invalid-utf8": Case(RUN, ["s.yaml: line 2: not valid UTF-8 (byte 0xff)"],
                         {"s.yaml": b"name: x\n# caf\xff\n"}),
    "utf16-bom": Case(RUN, ["s.yaml", "UTF-16", "save it as UTF-8"],
                      {"s.yaml": OK.encode("utf-16")}),
    "binary": Case(RUN, ["s.yaml", "NUL byte"], {"s.yaml": b"name: x\n\x00\x01\x02"}),
    "alias-bomb-name": Case(RUN, ["s.yaml", "expands to more than 100,000 values"],
                            {"s.yaml": bomb() + "name: *a8\n"}),
    "alias-bomb-set": Case([*RUN, "--set", "runner.cudagraph_capture_sizes=" + flow_bomb()],
                           ["s.yaml: runner.cudagraph_capture_sizes", "expands to more than"],
                           {"s.yaml": OK}),
    "deep-set": Case([*RUN, "--set", "runner.cudagraph_capture_sizes=" + "[" * 80 + "]" * 80],
                     ["runner.cudagraph_capture_sizes", "nested more than 64"], {"s.yaml": OK}),
    "deep-nesting": Case(RUN, ["s.yaml: line 4: nested more than 64 levels deep"],
                         {"s.yaml": OK + "matrix: {runner.uva: " + DEEP + "}"}),
    "huge-name": Case(RUN, ["s.yaml: name", "at most 200 characters", "nnn...nnn"],
                      {"s.yaml": OK.replace("name: ok", "name: " + "n" * (1 << 19))}),
    "huge-set": Case([*RUN, "--set", "name=" + "n" * (1 << 20)],
                     ["s.yaml: name: override of 1,048,581 characters"], {"s.yaml": OK}),
    "trace-fifo": Case(RUN, ["t.jsonl", "FIFO"], {"s.yaml": OK + "workload: {trace: t.jsonl}\n"},
                       _fifo("t.jsonl")),
    "trace-utf16": Case(RUN, ["t.jsonl", "UTF-16"],
                        {"s.yaml": OK + "workload: {trace: t.jsonl}\n",
                         "t.jsonl": LINE.encode("utf-16")}),
    "db-fifo": Case(["runs", "--db", "{dir}/fifo.duckdb"], ["fifo.duckdb", "regular file"],
                    setup=_fifo("fifo.duckdb")),
    "thresholds-fifo": Case(["gate", "--baseline", "aaa111", "--candidate", "aaa111", "--db",
                             "{db}", "--thresholds", "{dir}/g.yaml"], ["g.yaml", "FIFO"],
                            setup=_fifo("g.yaml")),
    "thresholds-bomb": Case(["gate", "--baseline", "aaa111", "--candidate", "aaa111", "--db",
                             "{db}", "--thresholds", "{dir}/g.yaml"],
                            ["g.yaml", "expands to more than"],
                            {"g.yaml": bomb() + "p99_itl: *a8\n"}),
    # --- markup and control characters in what is echoed -------------------------------------
    "markup-unknown-key": Case(RUN, ["s.yaml: [/x]: unknown key"],
                               {"s.yaml": OK + "'[/x]': 1\n"}),
    "markup-in-set": Case([*RUN, "--set", "runner.[bold]x[/bold]=1"],
                          ["runner.[bold]x[/bold]: unknown key"], {"s.yaml": OK}),
    "ansi-in-key": Case(RUN, ["s.yaml: [31mred: unknown key"],
                        {"s.yaml": OK + '"\\e[31mred": 1\n'}),
    "markup-db-path": Case(["runs", "--db", "{dir}/[/x]"], ["[/x]: is a directory"],
                           setup=lambda d: (d / "[/x]").mkdir(parents=True)),
    "markup-trace-id": Case(RUN, ["t.jsonl: line 2: id: duplicate id '[/x]'"],
                            {"s.yaml": OK + "workload: {trace: t.jsonl}\n",
                             "t.jsonl": trace_text({"id": "[/x]", "prompt_len": 2, "max_tokens": 1},
                                              {"id": "[/x]", "prompt_len": 2, "max_tokens": 1})}),
    # --- output files that would destroy the database ------------------------------------------
    "report-o-db": Case(["report", "aaa111", "--db", "{db}", "-o", "{db}"],
                        ["is the run database"]),
    "report-o-hard-link": Case(["report", "aaa111", "--db", "{db}", "-o", "{dir}/hard.json"],
                               ["hard.json: is the run database"], setup=_links),
    "export-o-relative": Case(["export", "aaa111", "--db", "{db}", "-o", "{dir}/sub/../" + DB],
                              ["is the run database"], setup=_links),
    "export-o-symlink": Case(["export", "aaa111", "--db", "{db}", "-o", "{dir}/link.json"],
                             ["link.json: is the run database"], setup=_links),
    "export-o-db-symlinked": Case(["export", "aaa111", "--db", "{dir}/link.json", "-o", "{db}"],
                                  ["runs.duckdb: is the run database"], setup=_links),
    "export-o-wal": Case(["export", "aaa111", "--db", "{db}", "-o", "{db}.wal"],
                         ["runs.duckdb.wal: is the run database"]),
    "export-o-dev-full": Case(["export", "aaa111", "--db", "{db}", "-o", "/dev/full"],
                              ["/dev/full: is not a regular file"]),
    "export-o-directory": Case(["export", "aaa111", "--db", "{db}", "-o", "{dir}"],
                               ["is a directory"]),
    "report-o-missing-dir": Case(["report", "aaa111", "--db", "{db}", "-o", "{dir}/no/r.html"],
                                 ["cannot write the report", "not found"]),
}  # fmt: skip


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _UnblockFifos:
    """If a regression opened a FIFO for reading, open its writing end (and close it) so the
    read returns and the test fails instead of hanging."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.done = directory, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.done.wait(0.5):
            for p in self.directory.iterdir():
                if p.is_fifo():
                    with contextlib.suppress(OSError):  # no reader: nothing blocks on it
                        os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))

    def __enter__(self) -> _UnblockFifos:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_and_the_database_unchanged(
    name: str, tmp_path: Path, base_db: Path
) -> None:
    check_case(CASES[name], tmp_path, base_db)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device")
def test_cuda_requested_without_a_device(tmp_path: Path, base_db: Path) -> None:
    case = Case([*RUN, "--set", "runner.device=cuda"], ["s.yaml: runner.device", "no CUDA"],
                {"s.yaml": OK})  # fmt: skip
    check_case(case, tmp_path, base_db)


def test_a_trace_of_too_many_requests(tmp_path: Path, base_db: Path, monkeypatch) -> None:
    from mrv2_prof.workload import trace

    monkeypatch.setattr(trace, "MAX_NUM_REQUESTS", 3)
    lines = trace_text(*[{"prompt_len": 2, "max_tokens": 1}] * 4)
    case = Case(RUN, ["t.jsonl: line 4: more than 3 requests"],
                {"s.yaml": OK + "workload: {trace: t.jsonl}\n", "t.jsonl": lines})  # fmt: skip
    check_case(case, tmp_path, base_db)


def check_case(case: Case, tmp_path: Path, base_db: Path) -> None:
    """Run ``case`` in ``tmp_path`` (a copy of ``base_db`` as runs.duckdb) and check it."""
    db = tmp_path / "runs.duckdb"
    shutil.copyfile(base_db, db)
    for file, content in case.files.items():
        text = content if isinstance(content, str) else None
        data = content if text is None else text.replace("{dir}", str(tmp_path)).encode()
        (tmp_path / file).write_bytes(data)
    if case.setup is not None:
        case.setup(tmp_path)
    before_files = sorted(p.name for p in tmp_path.iterdir())
    before = _digest(db)
    args = [a.replace("{dir}", str(tmp_path)).replace("{db}", str(db)) for a in case.args]
    with _UnblockFifos(tmp_path):
        result = runner.invoke(app, args)
    output = result.output
    assert result.exit_code == 2, (result.exit_code, output, result.exception)
    assert "Traceback" not in output and ESC not in output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    assert len(lines[0]) < 1200
    for part in case.expect:
        assert part in lines[0], (part, lines[0])
    assert _digest(db) == before  # no run row, no schema change, not overwritten
    assert sorted(p.name for p in tmp_path.iterdir()) == before_files  # nothing written


def test_hostile_labels_and_errors_print_as_they_read(tmp_path: Path, base_db: Path) -> None:
    """A stored run whose label and error hold markup and escape sequences: listed and shown
    literally (no MarkupError, no escape sequence reaches the terminal)."""
    db = tmp_path / "runs.duckdb"
    shutil.copyfile(base_db, db)
    with Store.open(db) as store:
        store.begin_run("bad001", scenario_name="[/x]", label=f"[/x]{ESC}[31mred[bold]",
                        matrix_combo=None, scenario_yaml="name: x\n", device="cpu",
                        versions={}, started_ns=1)  # fmt: skip
        store.finish_run("bad001", "failed", ended_ns=2, error=f"[/oops] {ESC}[2J boom\\")
    for args in (["runs"], ["show", "bad001"]):
        result = runner.invoke(app, [*args, "--db", str(db)])
        assert result.exit_code == 0, result.output
        assert ESC not in result.output
        assert "[/x][31mred[bold]" in result.output
        assert "[/oops] [2J boom\\" in result.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_kv_cache_larger_than_the_gpu(tmp_path: Path, base_db: Path) -> None:
    """llama-1b: 2 x 16 tokens x 8 KV heads x 64 x 2 bytes x 16 layers = 512 KiB a block, so
    10^8 blocks are 47.7 TiB: more than any GPU has free, found from NVML before the run."""
    case = Case([*RUN, "--set", "runner.num_kv_blocks=100000000"],
                ["s.yaml: runner.num_kv_blocks", "47.7 TiB", "free on the GPU"],
                {"s.yaml": "name: g\nmodel: {preset: llama-1b}\n"})  # fmt: skip
    check_case(case, tmp_path, base_db)
