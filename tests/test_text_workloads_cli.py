"""Text workloads through the real command line on the shipped SmolLM2-135M-Instruct (CPU, a
few requests): stored prompt lengths against Hugging Face transformers' tokenizer and chat
template read from the same GGUF, EOS and stop_token_ids ending requests with finish_reason
'stop', a ShareGPT dataset run as chat, and each bad text input one line, exit 2, nothing
written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.runner.model.shipped import shipped_path
from tests.test_bad_input_cli import Case, check_case

GGUF = shipped_path("smollm2-135m")
pytestmark = pytest.mark.skipif(GGUF is None, reason="the shipped smollm2-135m is not here")
DATA = Path(__file__).resolve().parents[1] / "scenarios" / "data"
EOS, COMMA = 2, 28  # SmolLM2's <|im_end|> and ","
VOCAB = 49152
RUNNER = (
    "runner: {device: cpu, kernels: torch, num_kv_blocks: 96, max_model_len: 1024, "
    "max_num_seqs: 4, max_num_reqs: 8}\n"
)
SMOL = "model: {preset: smollm2-135m}\n"
TINY = "model: {preset: llama-tiny}\n"
PROBES = "probes: {nvml_hz: 0}\n"
SAY_HI = [{"role": "user", "content": "Say hi."}]
YES_NO = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
FOX = "The quick brown fox jumps over the lazy dog. Then it"
runner = CliRunner()


@pytest.fixture(scope="module")
def hf():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


def chat_len(hf, messages: list[dict[str, str]]) -> int:
    ids = hf.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return len(ids)


def run(tmp_path: Path, scenario: str, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "s.yaml").write_text(scenario)
    db = tmp_path / "runs.duckdb"
    result = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "--db", str(db), "--headless"])
    assert result.exit_code == 0, (result.output, result.exception)
    return db


def rows(db: Path) -> dict[str, tuple]:
    """req_id -> (prompt_tokens, output_tokens, finish_reason, output token ids)."""
    with duckdb.connect(str(db), read_only=True) as con:
        reqs = con.execute(
            "SELECT req_id, prompt_tokens, output_tokens, finish_reason FROM requests"
        ).fetchall()
        toks = dict(
            con.execute(
                "SELECT req_id, list(token_id ORDER BY idx) FROM tokens GROUP BY req_id"
            ).fetchall()
        )
    return {r: (p, o, f, toks.get(r, [])) for r, p, o, f in reqs}


def trace(*lines: dict) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def test_a_text_trace_tokenizes_templates_and_stops(tmp_path: Path, hf) -> None:
    """Greedy SmolLM2: the yes/no question is answered and ended by EOS well before 64 tokens
    (in 3: "No." and EOS; "Say hi." ends the same way after 24); counting to 10 with "," as a
    stop token ends at the first comma; the plain prompt runs to its 6 tokens (no EOS that
    early). ignore_eos is unset: false on a real model."""
    lines = trace(
        {"id": "hi", "messages": YES_NO, "max_tokens": 64},
        {"id": "count", "messages": COUNT, "max_tokens": 40, "stop_token_ids": [COMMA]},
        {"id": "fox", "prompt": FOX, "max_tokens": 6},
    )
    scenario = "name: text\n" + SMOL + RUNNER + PROBES + "workload: {trace: t.jsonl}\n"
    got = rows(run(tmp_path, scenario, {"t.jsonl": lines}))
    hi, count, fox = got["hi"], got["count"], got["fox"]
    assert hi[0] == chat_len(hf, YES_NO) and count[0] == chat_len(hf, COUNT)
    assert fox[0] == len(hf(FOX).input_ids)
    # EOS: 'stop' before max_tokens, the last token the model's EOS and no EOS before it
    assert hi[2] == "stop" and 1 < hi[1] < 64 and hi[3][-1] == EOS and EOS not in hi[3][:-1]
    assert count[2] == "stop" and count[3][-1] == COMMA and COMMA not in count[3][:-1]
    assert count[1] < 40
    assert fox[2] == "length" and fox[1] == 6 and EOS not in fox[3]
    assert all(len(t) == o for _, o, _, t in got.values())


def test_a_sharegpt_dataset_as_chat(tmp_path: Path, hf) -> None:
    """Two entries of the shipped dataset, seeded, as chat: each request's prompt length is
    transformers' chat template over the entry's first human turn; output_len given caps
    max_tokens at 3 (a request ends at 3 tokens, or earlier at EOS)."""
    data = json.loads((DATA / "mixed_tasks.json").read_text())
    scenario = (
        "name: sharegpt\nseed: 3\n" + SMOL + RUNNER + PROBES + "workload:\n"
        f"  dataset: {{path: {DATA / 'mixed_tasks.json'}, chat: true}}\n"
        "  num_requests: 2\n  output_len: {dist: fixed, value: 3}\n"
        "  arrival: {pattern: constant, rate: 50}\n"
    )
    got = rows(run(tmp_path, scenario, {}))
    assert len(got) == 2 and all(r.startswith("entry-") for r in got)
    for req_id, (prompt, out, reason, toks) in got.items():
        human = data[int(req_id.removeprefix("entry-"))]["conversations"][0]["value"]
        assert prompt == chat_len(hf, [{"role": "user", "content": human}])
        ended_by_eos = bool(toks) and toks[-1] == EOS
        assert (reason, out <= 3) == ("stop" if ended_by_eos else "length", True)
        assert ended_by_eos or out == 3


OK_SMOL = "name: t\n" + SMOL + RUNNER
RUN = ["run", "{dir}/s.yaml", "--db", "{db}", "--headless"]
HUMAN = {"from": "human", "value": "Hello there, how are you doing?"}
GPT = {"from": "gpt", "value": "Very well, thank you for asking!"}
BAD: dict[str, Case] = {
    "prompt-and-ids": Case(RUN, ["t.jsonl: line 1: prompt: give exactly one of"],
                           {"s.yaml": OK_SMOL + "workload: {trace: t.jsonl}\n",
                            "t.jsonl": trace({"prompt": "hi", "prompt_token_ids": [1],
                                              "max_tokens": 1})}),
    "prompt-and-messages": Case(RUN, ["t.jsonl: line 2: messages: give exactly one of"],
                                {"s.yaml": OK_SMOL + "workload: {trace: t.jsonl}\n",
                                 "t.jsonl": trace({"prompt": "a", "max_tokens": 1},
                                                  {"prompt": "hi", "messages": SAY_HI,
                                                   "max_tokens": 1})}),
    "empty-prompt": Case(RUN, ["t.jsonl: line 1: prompt: must be a non-empty string"],
                         {"s.yaml": OK_SMOL + "workload: {trace: t.jsonl}\n",
                          "t.jsonl": trace({"prompt": "", "max_tokens": 1})}),
    "bad-role": Case(RUN, ["t.jsonl: line 1: messages[0].role: must be one of system, user"],
                     {"s.yaml": OK_SMOL + "workload: {trace: t.jsonl}\n",
                      "t.jsonl": trace({"messages": [{"role": "bot", "content": "x"}],
                                        "max_tokens": 1})}),
    "content-not-string": Case(RUN, ["t.jsonl: line 1: messages[0].content: must be a string"],
                               {"s.yaml": OK_SMOL + "workload: {trace: t.jsonl}\n",
                                "t.jsonl": trace({"messages": [{"role": "user", "content": 1}],
                                                  "max_tokens": 1})}),
    "too-long": Case(RUN, ["t.jsonl: line 2: prompt:", "tokens after tokenization",
                           "exceeds max_model_len 1024"],
                     {"s.yaml": OK_SMOL + "workload: {trace: t.jsonl}\n",
                      "t.jsonl": trace({"prompt": "a", "max_tokens": 1},
                                       {"prompt": "word " * 1100, "max_tokens": 1})}),
    "no-tokenizer": Case(RUN, ["t.jsonl: line 1: prompt: model.preset: llama-tiny has random "
                               "weights and no tokenizer", "use model.preset: smollm2-135m"],
                         {"s.yaml": "name: t\n" + TINY + RUNNER + "workload: {trace: t.jsonl}\n",
                          "t.jsonl": trace({"prompt": "hi", "max_tokens": 1})}),
    "dataset-no-tokenizer": Case(RUN, ["s.yaml: workload.dataset: model.preset: llama-tiny has "
                                       "random weights and no tokenizer"],
                                 {"s.yaml": "name: t\n" + TINY + RUNNER
                                  + "workload: {dataset: {path: d.json}}\n",
                                  "d.json": json.dumps([{"conversations": [HUMAN, GPT]}])}),
    "not-sharegpt": Case(RUN, ["d.json: entry 1: conversations[1].value: must be a string"],
                         {"s.yaml": OK_SMOL + "workload: {dataset: {path: d.json}}\n",
                          "d.json": json.dumps([{"conversations": [HUMAN, GPT]},
                                                {"conversations": [HUMAN, {"from": "gpt",
                                                                           "value": 7}]}])}),
    "dataset-object": Case(RUN, ["d.json: must be a JSON list of"],
                           {"s.yaml": OK_SMOL + "workload: {dataset: {path: d.json}}\n",
                            "d.json": json.dumps({"conversations": [HUMAN, GPT]})}),
    "stop-ids-sampling": Case([*RUN, "--set", f"workload.sampling.stop_token_ids=[2, {VOCAB}]"],
                              ["s.yaml: workload.sampling.stop_token_ids: token id 49152 "
                               "outside the vocabulary [0, 49152)"], {"s.yaml": OK_SMOL}),
    "stop-ids-line": Case(RUN, ["t.jsonl: line 1: stop_token_ids: token id -1 outside"],
                          {"s.yaml": OK_SMOL + "workload: {trace: t.jsonl}\n",
                           "t.jsonl": trace({"prompt": "hi", "max_tokens": 1,
                                             "stop_token_ids": [-1]})}),
    "trace-and-dataset": Case(RUN, ["s.yaml: workload.dataset: give at most one of"],
                              {"s.yaml": OK_SMOL + "workload: {trace: t.jsonl, dataset: "
                               "{path: d.json}}\n", "t.jsonl": trace({"prompt_len": 2,
                                                                      "max_tokens": 1}),
                               "d.json": "[]"}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(BAD))
def test_bad_text_input_is_one_line_exit_2(name: str, tmp_path: Path, base_db: Path) -> None:
    check_case(BAD[name], tmp_path, base_db)
