"""Numbers too large (or not finite) through the real command line: a 400-digit integer, or
``1e400`` (inf in Python's JSON), in a trace line, a gate thresholds file or flag, a scenario
or an nsys start mark is one line naming the file, the line and the field, exit 2, the
database byte for byte as it was; refused by the rule a scenario's own numbers follow.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests import test_bad_input_cli as bad_input_cli
from tests.report.test_nsys_import import make_capture
from tests.test_bad_input_cli import OK, RUN, Case, check_case

HUGE = "1" + "0" * 400  # overflows float(), and int64 in SQLite and DuckDB
INF = "1e400"  # Python's json reads it as inf
TRACE = OK + "workload: {trace: t.jsonl}\n"
LINE1 = '{"prompt_len": 2, "max_tokens": 1}\n'
GATE = ["gate", "--baseline", "aaa111", "--candidate", "aaa111", "--db", "{db}"]
THRESHOLDS = [*GATE, "--thresholds", "{dir}/g.yaml"]


def trace_case(key: str, value: str, *expect: str, line: str | None = None) -> Case:
    """Line 2 of a trace with ``key`` set to the raw JSON ``value``."""
    line = line or f'{{"prompt_len": 2, "max_tokens": 1, "{key}": {value}}}\n'
    return Case(
        RUN, ["t.jsonl: line 2: " + key, *expect], {"s.yaml": TRACE, "t.jsonl": LINE1 + line}
    )


def _mark(value: str):
    """An nsys export of run aaa111 (the base run) whose start mark carries ``value``."""

    def make(d: Path) -> None:
        path = make_capture(d / "rep.sqlite")
        with sqlite3.connect(path) as con:
            con.execute(
                "UPDATE StringIds SET value = ? WHERE value LIKE 'mrv2 run %'",
                [f"mrv2 run aaa111 perf_counter_ns={value}"],
            )
        con.close()

    return make


VALID = "must be a number a float holds (at most 1.8e+308 in size)"
FINITE = "must be a finite number"
CASES: dict[str, Case] = {
    # --- trace lines: every numeric key ------------------------------------------------------
    "trace-arrival-huge": trace_case("arrival_s", HUGE, VALID),
    "trace-temperature-huge": trace_case("temperature", HUGE, VALID),
    "trace-top-p-huge": trace_case("top_p", HUGE, VALID),
    "trace-arrival-inf": trace_case("arrival_s", INF, FINITE, "inf"),
    "trace-temperature-inf": trace_case("temperature", INF, FINITE),
    "trace-top-p-inf": trace_case("top_p", INF, FINITE),
    "trace-temperature-nan": trace_case("temperature", "NaN", FINITE, "nan"),
    "trace-top-p-negative-huge": trace_case("top_p", "-" + HUGE, VALID),
    "trace-prompt-len-huge": trace_case("prompt_len", HUGE, "must be <= 10,000,000",
                                        line=f'{{"prompt_len": {HUGE}, "max_tokens": 1}}\n'),
    "trace-prompt-len-inf": trace_case("prompt_len", INF, "integer >= 1",
                                       line=f'{{"prompt_len": {INF}, "max_tokens": 1}}\n'),
    "trace-max-tokens-huge": trace_case("max_tokens", HUGE, "must be <= 10,000,000",
                                        line=f'{{"prompt_len": 2, "max_tokens": {HUGE}}}\n'),
    "trace-top-k-huge": trace_case("top_k", HUGE, "vocabulary size"),
    "trace-logprobs-huge": trace_case("logprobs", HUGE, "vocabulary size"),
    "trace-prompt-logprobs-huge": trace_case("prompt_logprobs", HUGE, "vocabulary size"),
    "trace-seed-huge": trace_case("seed", HUGE, "64-bit"),
    "trace-seed-negative-huge": trace_case("seed", "-" + HUGE, "must be >= 0"),
    "trace-id-huge": trace_case("id", HUGE, "must be <= 200, got 401", "characters"),
    "trace-stop-token-huge": trace_case("stop_token_ids", f"[{HUGE}]", "outside the vocabulary"),
    "trace-token-id-huge": trace_case(
        "prompt_token_ids", "", "outside the vocabulary",
        line=f'{{"prompt_token_ids": [1, {HUGE}], "max_tokens": 1}}\n'),
    "trace-token-id-inf": trace_case(
        "prompt_token_ids", "", "list of integers",
        line=f'{{"prompt_token_ids": [1, {INF}], "max_tokens": 1}}\n'),
    # --- the scenario: the same words --------------------------------------------------------
    "set-temperature-huge": Case([*RUN, "--set", f"workload.sampling.temperature={HUGE}"],
                                 ["s.yaml: workload.sampling.temperature",
                                  "Input should be a valid number"], {"s.yaml": OK}),
    "scenario-int-too-long": Case(RUN, ["s.yaml: line 4", "an integer of 5,001 digits"],
                                  {"s.yaml": OK + "seed: 1" + "0" * 5000 + "\n"}),
    # --- gate thresholds ---------------------------------------------------------------------
    "thresholds-huge": Case(THRESHOLDS, ["g.yaml: p99_itl", "bad threshold", VALID],
                            {"g.yaml": f"p99_itl: {HUGE}\n"}),
    "thresholds-inf": Case(THRESHOLDS, ["g.yaml: p99_itl", "bad threshold", FINITE],
                           {"g.yaml": "p99_itl: 1.0e+400\n"}),
    "thresholds-huge-percent": Case(THRESHOLDS, ["g.yaml: p99_itl", "not a finite number"],
                                    {"g.yaml": f"p99_itl: {HUGE}%\n"}),
    "thresholds-int-too-long": Case(THRESHOLDS, ["g.yaml", "line 2", "an integer of 5,001 digits"],
                                    {"g.yaml": "p50_itl: 5%\np99_itl: 1" + "0" * 5000 + "\n"}),
    "max-regression-huge": Case([*GATE, "--max-regression", f"p99_itl={HUGE}"],
                                ["--max-regression", "p99_itl", "not a finite number"]),
    # --- the nsys start mark -----------------------------------------------------------------
    "nsys-mark-huge": Case(["nsys", "import", "aaa111", "{dir}/rep.sqlite", "--db", "{db}"],
                           ["rep.sqlite: start mark 'mrv2 run aaa111'", "perf_counter_ns",
                            "64-bit"], setup=_mark(HUGE)),
    "nsys-mark-negative": Case(["nsys", "import", "aaa111", "{dir}/rep.sqlite", "--db", "{db}"],
                               ["rep.sqlite: start mark", "perf_counter_ns", "got -5"],
                               setup=_mark("-5")),
}  # fmt: skip


class _Recording:
    """``CliRunner`` whose last result is kept, to look at the line ``check_case`` checked."""

    def __init__(self) -> None:
        self.runner, self.output = CliRunner(), ""

    def invoke(self, *args, **kwargs):
        result = self.runner.invoke(*args, **kwargs)
        self.output = result.output
        return result


@pytest.mark.parametrize("name", list(CASES))
def test_a_number_too_large_is_one_line_exit_2_and_nothing_written(
    name: str, tmp_path: Path, base_db: Path, monkeypatch
) -> None:
    recording = _Recording()
    monkeypatch.setattr(bad_input_cli, "runner", recording)
    check_case(CASES[name], tmp_path, base_db)
    assert "0" * 60 not in recording.output  # a huge number is quoted cut, not digit by digit
