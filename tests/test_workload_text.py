"""Text workloads built directly: trace lines with ``prompt`` / ``messages``, ShareGPT datasets,
stop_token_ids and ignore_eos's default by model, every bad text input one ``ScenarioError``.

Expected token ids come from Hugging Face transformers' own tokenizer read from the same GGUF
file (``AutoTokenizer.from_pretrained(dir, gguf_file=name)``) and its ``apply_chat_template``;
the workload tokenizes with ``mrv2_prof.text``, a separate implementation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model.shipped import shipped_path
from mrv2_prof.scenario import ScenarioError, WorkloadSection
from mrv2_prof.workload import WorkloadRequest, build_workload

GGUF = shipped_path("smollm2-135m")
pytestmark = pytest.mark.skipif(GGUF is None, reason="the shipped smollm2-135m is not here")
VOCAB = 49152  # SmolLM2's vocabulary (embedding rows and tokenizer alike)
SMOL = ModelSpec(preset="smollm2-135m")
TINY = ModelSpec(preset="llama-tiny")
DATA = Path(__file__).resolve().parents[1] / "scenarios" / "data"


@pytest.fixture(scope="module")
def hf():
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


@pytest.fixture(scope="module")
def tok():
    from mrv2_prof.text import load_tokenizer

    return load_tokenizer(GGUF)


def hf_ids(hf, prompt: str) -> list[int]:
    return hf(prompt).input_ids


def hf_chat(hf, messages: list[dict[str, str]]) -> list[int]:
    return hf.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )


def section(base_dir: Path, **data: Any) -> WorkloadSection:
    return WorkloadSection.model_validate(data, context={"base_dir": base_dir})


def build(sec, tokenizer, model=SMOL, max_model_len=2048, seed=0) -> list[WorkloadRequest]:
    return build_workload(
        sec, seed=seed, vocab_size=VOCAB, max_model_len=max_model_len, source="s.yaml",
        tokenizer=tokenizer, model=model,
    )  # fmt: skip


def write_trace(tmp_path: Path, lines: list[dict[str, Any] | str]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def write_dataset(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "d.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def entry(prompt: str, reply: str, *more: dict[str, str]) -> dict[str, Any]:
    turns = [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}, *more]
    return {"id": "x", "conversations": turns}


SAY_HI = [{"role": "user", "content": "Say hi."}]
CHAT = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


# ------------------------------------------------------------------------------- traces


def test_text_lines_tokenize_as_transformers_does(tmp_path: Path, hf, tok) -> None:
    lines = [
        {"id": "plain", "prompt": "The quick brown fox jumps over the lazy dog.", "max_tokens": 8},
        {"id": "chat", "messages": CHAT, "max_tokens": 4},
        {"id": "ids", "prompt_token_ids": [5, 6, 7], "max_tokens": 2},
        {"id": "hi", "messages": SAY_HI, "max_tokens": 64, "arrival_s": 0.5},
        {"id": "unicode", "prompt": "Grüße aus Köln — ça va? 你好", "max_tokens": 3},
    ]
    write_trace(tmp_path, lines)
    reqs = {r.req_id: r for r in build(section(tmp_path, trace="t.jsonl"), tok)}
    assert list(reqs["plain"].prompt_token_ids) == hf_ids(hf, lines[0]["prompt"])
    assert list(reqs["unicode"].prompt_token_ids) == hf_ids(hf, lines[4]["prompt"])
    assert list(reqs["chat"].prompt_token_ids) == hf_chat(hf, CHAT)
    assert list(reqs["hi"].prompt_token_ids) == hf_chat(hf, SAY_HI)
    assert reqs["ids"].prompt_token_ids == (5, 6, 7)
    assert (reqs["hi"].arrival_s, reqs["hi"].max_tokens) == (0.5, 64)
    # a real model: EOS ends requests unless the scenario says otherwise
    assert not any(r.ignore_eos for r in reqs.values())


class Counting:
    """The tokenizer, counting its batch calls."""

    def __init__(self, tok) -> None:
        self.tok, self.calls = tok, {"encode_batch": 0, "encode_chat_batch": 0}
        self.has_chat_template = tok.has_chat_template

    def encode_batch(self, texts):
        self.calls["encode_batch"] += 1
        return self.tok.encode_batch(texts)

    def encode_chat_batch(self, conversations):
        self.calls["encode_chat_batch"] += 1
        return self.tok.encode_chat_batch(conversations)


def test_a_trace_is_tokenized_in_one_call_per_kind(tmp_path: Path, tok) -> None:
    lines = [{"prompt": f"Line {i}: tell me about {i}.", "max_tokens": 2} for i in range(40)]
    lines += [{"messages": [{"role": "user", "content": f"n={i}"}], "max_tokens": 2}
              for i in range(30)]  # fmt: skip
    write_trace(tmp_path, lines)
    counting = Counting(tok)
    reqs = build(section(tmp_path, trace="t.jsonl"), counting)
    assert len(reqs) == 70
    assert counting.calls == {"encode_batch": 1, "encode_chat_batch": 1}


def test_stop_token_ids_from_the_section_and_per_line(tmp_path: Path, tok) -> None:
    stops = {"prompt": "d e f", "max_tokens": 4, "stop_token_ids": [13, 2]}
    write_trace(tmp_path, [{"prompt": "a b c", "max_tokens": 4}, stops])
    sec = section(tmp_path, trace="t.jsonl", sampling={"stop_token_ids": [198]})
    first, second = build(sec, tok)
    assert (first.stop_token_ids, second.stop_token_ids) == ((198,), (13, 2))


@pytest.mark.parametrize(
    ("ignore_eos", "model", "has_tokenizer", "want"),
    [
        (None, TINY, False, True),  # random weights: EOS is noise
        (None, SMOL, True, False),  # a shipped real model
        (None, ModelSpec(preset=None, path="/ckpt"), False, False),  # a checkpoint: real
        (True, SMOL, True, True),  # an explicit value wins
        (False, TINY, False, False),
    ],
)
def test_ignore_eos_default_depends_on_the_model(
    tmp_path: Path, tok, ignore_eos, model, has_tokenizer, want
) -> None:
    sec = section(tmp_path, num_requests=3, ignore_eos=ignore_eos)
    reqs = build(sec, tok if has_tokenizer else None, model=model)
    assert [r.ignore_eos for r in reqs] == [want] * 3


LONG = "word " * 3000

BAD_LINES = [
    # (line, field, problem)
    ({"prompt": "hi", "prompt_token_ids": [1], "max_tokens": 1}, "line 1: prompt",
     "give exactly one of 'prompt_token_ids', 'prompt_len', 'prompt' or 'messages'"),
    ({"prompt": "hi", "messages": SAY_HI, "max_tokens": 1}, "line 1: messages",
     "give exactly one of"),
    ({"prompt": "", "max_tokens": 1}, "line 1: prompt", 'must be a non-empty string, got ""'),
    ({"prompt": 5, "max_tokens": 1}, "line 1: prompt", "must be a non-empty string, got 5"),
    ({"messages": "hi", "max_tokens": 1}, "line 1: messages",
     'must be a non-empty list of {role, content}, got "hi"'),
    ({"messages": [], "max_tokens": 1}, "line 1: messages", "must be a non-empty list"),
    ({"messages": [{"role": "user"}], "max_tokens": 1}, "line 1: messages[0].content",
     "required"),
    ({"messages": [{"content": "x"}], "max_tokens": 1}, "line 1: messages[0].role", "required"),
    ({"messages": [*SAY_HI, {"role": "robot", "content": "x"}], "max_tokens": 1},
     "line 1: messages[1].role", 'must be one of system, user, assistant, got "robot"'),
    ({"messages": [{"role": "user", "content": ["x"]}], "max_tokens": 1},
     "line 1: messages[0].content", 'must be a string, got ["x"]'),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}], "max_tokens": 1},
     "line 1: messages[0].name", "unknown key"),
    ({"messages": ["x"], "max_tokens": 1}, "line 1: messages[0]",
     "must be an object with role and content"),
    ({"prompt": "hi", "max_tokens": 1, "stop_token_ids": [VOCAB]}, "line 1: stop_token_ids",
     f"token id {VOCAB} outside the vocabulary [0, {VOCAB})"),
    ({"prompt": "hi", "max_tokens": 1, "stop_token_ids": 2}, "line 1: stop_token_ids",
     "must be a list of integers, got 2"),
    ({"prompt": "hi", "max_tokens": 2048}, "line 1: max_tokens", "leaves no room for a prompt"),
    ({"prompt": LONG, "max_tokens": 16}, "line 1: prompt",
     "tokens after tokenization + max_tokens 16 exceeds max_model_len 2048"),
]  # fmt: skip


@pytest.mark.parametrize(("bad", "field", "problem"), BAD_LINES)
def test_a_bad_text_line_names_the_file_line_and_key(tmp_path, hf, tok, bad, field, problem):
    path = write_trace(tmp_path, [bad])
    with pytest.raises(ScenarioError) as info:
        build(section(tmp_path, trace="t.jsonl"), tok)
    assert info.value.file == str(path) and info.value.field == field
    assert problem in info.value.problem, info.value.problem
    if bad.get("prompt") == LONG:  # the count is the tokenizer's: transformers agrees
        assert info.value.problem.startswith(f"{len(hf_ids(hf, LONG)):,} tokens")


def test_the_bad_line_is_named_among_good_ones(tmp_path: Path, tok) -> None:
    ok = {"prompt": "ok", "max_tokens": 1}
    write_trace(tmp_path, [ok, "", {"prompt": LONG, "max_tokens": 1}, ok])
    with pytest.raises(ScenarioError, match=r": line 3: prompt: 3,\d\d\d tokens after"):
        build(section(tmp_path, trace="t.jsonl"), tok)


def test_text_on_a_model_without_a_tokenizer(tmp_path: Path) -> None:
    ok, chat = {"prompt_len": 3, "max_tokens": 1}, {"messages": SAY_HI, "max_tokens": 1}
    write_trace(tmp_path, [ok, chat])
    with pytest.raises(ScenarioError) as info:
        build(section(tmp_path, trace="t.jsonl"), None, model=TINY)
    assert info.value.field == "line 2: messages"
    assert info.value.problem.startswith(
        "model.preset: llama-tiny has random weights and no tokenizer; a text workload needs "
        "one: use model.preset: smollm2-135m or a checkpoint with a tokenizer"
    )


def test_workload_still_does_not_import_torch_or_the_tokenizer() -> None:
    code = (
        "import sys, mrv2_prof.workload; "
        "sys.exit(any(m in sys.modules for m in ('torch', 'tokenizers')))"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ----------------------------------------------------------------------------- datasets

HELLO = "Hello there, how are you doing today?"
REPLY = "I am doing well, thank you for asking. How can I help?"


def test_a_dataset_entry_is_its_first_human_turn_and_the_gpt_reply(tmp_path, hf, tok) -> None:
    write_dataset(tmp_path, [
        {"conversations": [{"from": "system", "value": "Be kind."},
                           {"from": "human", "value": HELLO}, {"from": "gpt", "value": REPLY},
                           {"from": "human", "value": "And then?"}]},
        {"conversations": [{"from": "human", "value": HELLO}]},  # no reply: skipped
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": REPLY}]},
        {"conversations": [{"from": "human", "value": HELLO}, {"from": "gpt", "value": "Ok."}]},
    ])  # fmt: skip
    [req] = build(section(tmp_path, dataset={"path": "d.json"}), tok)
    assert req.req_id == "entry-0"  # entry 2's prompt and entry 3's reply are under 4 tokens
    assert len(hf_ids(hf, "Hi")) < 4 and len(hf_ids(hf, "Ok.")) < 4 <= len(hf_ids(hf, HELLO))
    assert list(req.prompt_token_ids) == hf_ids(hf, HELLO)
    assert req.max_tokens == len(hf_ids(hf, REPLY))
    assert not req.ignore_eos


def test_a_chat_dataset_renders_the_prompt_as_a_user_message(tmp_path, hf, tok) -> None:
    write_dataset(tmp_path, [entry(HELLO, REPLY)])
    [req] = build(section(tmp_path, dataset={"path": "d.json", "chat": True}), tok)
    assert list(req.prompt_token_ids) == hf_chat(hf, [{"role": "user", "content": HELLO}])
    assert req.max_tokens == len(hf_ids(hf, REPLY))


def test_dataset_filters_sampling_oversampling_and_arrivals(tmp_path, hf, tok) -> None:
    prompts = [f"Question number {i}: what is {i} times {i + 1}?" for i in range(12)]
    replies = [REPLY * (1 + i % 3) for i in range(12)]
    write_dataset(tmp_path, [entry(p, r) for p, r in zip(prompts, replies, strict=True)])
    total = [len(hf_ids(hf, p)) + len(hf_ids(hf, r)) for p, r in zip(prompts, replies, strict=True)]
    budget = max(t for i, t in enumerate(total) if i % 3 != 2)
    assert min(t for i, t in enumerate(total) if i % 3 == 2) > budget
    sec = section(tmp_path, dataset={"path": "d.json"}, num_requests=20,
                  arrival={"pattern": "constant", "rate": 4})  # fmt: skip
    reqs = build(sec, tok, max_model_len=budget, seed=1)
    base = {r.req_id.split(".")[0] for r in reqs}
    # entries 2, 5, 8, 11 have a triple reply: prompt + reply over max_model_len, dropped
    assert base == {f"entry-{i}" for i in range(12) if i % 3 != 2}
    assert len(reqs) == 20 and len({r.req_id for r in reqs}) == 20  # 8 kept, 12 repeats
    assert [r.arrival_s for r in reqs] == [i / 4 for i in range(20)]
    for r in reqs:
        i = int(r.req_id.split(".")[0].removeprefix("entry-"))
        assert list(r.prompt_token_ids) == hf_ids(hf, prompts[i])
        assert r.max_tokens == len(hf_ids(hf, replies[i]))
    assert [r.req_id for r in build(sec, tok, max_model_len=budget, seed=1)] == [
        r.req_id for r in reqs
    ]
    other = build(sec, tok, max_model_len=budget, seed=2)
    assert [r.req_id for r in other] != [r.req_id for r in reqs]
    first_four = build(section(tmp_path, dataset={"path": "d.json"}, num_requests=4), tok,
                       max_model_len=budget, seed=1)  # fmt: skip
    assert [r.req_id for r in first_four] == [r.req_id for r in reqs[:4]]  # the same order


def test_a_given_output_len_replaces_the_reply_length(tmp_path: Path, tok) -> None:
    write_dataset(tmp_path, [entry(HELLO, "Ok."), entry(HELLO + " Fine?", REPLY)])
    sec = section(tmp_path, dataset={"path": "d.json"}, output_len={"dist": "fixed", "value": 7})
    reqs = build(sec, tok)
    assert sorted(r.req_id for r in reqs) == ["entry-0", "entry-1"]  # a short reply no matter
    assert [r.max_tokens for r in reqs] == [7, 7]


BAD_DATASETS = [
    # (file content, field, problem)
    ("[1, 2", "line 1", "not valid JSON ("),
    ('{"conversations": []}', "", "must be a JSON list of {\"conversations\""),
    ([entry(HELLO, REPLY), 5], "entry 1", "must be an object, got 5"),
    ([{"turns": []}], "entry 0: conversations", "required"),
    ([{"conversations": "hi"}], "entry 0: conversations", 'must be a list of turns, got "hi"'),
    ([{"conversations": ["hi"]}], "entry 0: conversations[0]",
     "must be an object with 'from' and 'value'"),
    ([{"conversations": [{"from": "human"}]}], "entry 0: conversations[0].value", "required"),
    ([entry(HELLO, REPLY), {"conversations": [{"from": "human", "value": 5}]}],
     "entry 1: conversations[0].value", "must be a string, got 5"),
    ([{"conversations": [{"from": 1, "value": "x"}]}], "entry 0: conversations[0].from",
     "must be a string, got 1"),
    ([{"conversations": [{"from": "gpt", "value": "x"}]}], "",
     "no entry has a 'human' turn followed by a 'gpt' turn"),
    ([entry("Hi", REPLY)], "", "no entry passes the length filters"),
]  # fmt: skip


@pytest.mark.parametrize(("content", "field", "problem"), BAD_DATASETS)
def test_a_bad_dataset_names_the_file_entry_and_key(tmp_path, tok, content, field, problem):
    path = write_dataset(tmp_path, content)
    with pytest.raises(ScenarioError) as info:
        build(section(tmp_path, dataset={"path": "d.json"}), tok)
    assert (info.value.file, info.value.field) == (str(path), field)
    assert problem in info.value.problem, info.value.problem


def test_a_dataset_on_a_model_without_a_tokenizer(tmp_path: Path) -> None:
    write_dataset(tmp_path, [entry(HELLO, REPLY)])
    with pytest.raises(ScenarioError) as info:
        build(section(tmp_path, dataset={"path": "d.json"}), None, model=TINY)
    assert (info.value.file, info.value.field) == ("s.yaml", "workload.dataset")
    assert "llama-tiny has random weights and no tokenizer" in info.value.problem


class NoTemplate(Counting):
    """The tokenizer without its chat template (as a checkpoint without one)."""

    def __init__(self, tok) -> None:
        super().__init__(tok)
        self.has_chat_template = False


def test_chat_needs_a_template(tmp_path: Path, tok) -> None:
    write_dataset(tmp_path, [entry(HELLO, REPLY)])
    write_trace(tmp_path, [{"prompt": "x", "max_tokens": 1}, {"messages": SAY_HI, "max_tokens": 1}])
    with pytest.raises(ScenarioError) as info:
        build(section(tmp_path, dataset={"path": "d.json", "chat": True}), NoTemplate(tok))
    assert info.value.field == "workload.dataset.chat"
    assert "model.preset: smollm2-135m has no chat template" in info.value.problem
    with pytest.raises(ScenarioError, match=r"t.jsonl: line 2: messages: the tokenizer of"):
        build(section(tmp_path, trace="t.jsonl"), NoTemplate(tok))


def test_a_dataset_arriving_over_more_than_a_day(tmp_path: Path, tok) -> None:
    write_dataset(tmp_path, [entry(HELLO, REPLY)] * 3)
    slow = {"pattern": "constant", "rate": 1e-5}
    with pytest.raises(ScenarioError) as info:
        build(section(tmp_path, dataset={"path": "d.json"}, arrival=slow), tok)
    assert info.value.field == "workload.arrival.rate" and "3 dataset requests" in str(info.value)


def test_trace_and_dataset_exclude_each_other(tmp_path: Path) -> None:
    write_dataset(tmp_path, [entry(HELLO, REPLY)])
    write_trace(tmp_path, [{"prompt": "x", "max_tokens": 1}])
    with pytest.raises(Exception, match="give at most one of 'trace' or 'dataset'"):
        section(tmp_path, trace="t.jsonl", dataset={"path": "d.json"})


# ------------------------------------------------------------------- the shipped dataset


def test_the_shipped_dataset_is_what_its_script_writes(tmp_path: Path) -> None:
    out = tmp_path / "again.json"
    script = DATA / "make_dataset.py"
    subprocess.run([sys.executable, str(script), "--out", str(out)], check=True,
                   capture_output=True)  # fmt: skip
    assert out.read_bytes() == (DATA / "mixed_tasks.json").read_bytes()
    assert len(out.read_bytes()) < 300_000


def test_the_shipped_dataset_runs_whole_and_its_answers_repeat_their_prompts(hf, tok) -> None:
    data = json.loads((DATA / "mixed_tasks.json").read_text())
    assert len(data) == 300
    reqs = build(section(DATA, dataset={"path": "mixed_tasks.json", "chat": True}), tok)
    assert len(reqs) == 300  # every entry passes the filters at max_model_len 2048

    # what n-gram drafting finds: replies whose word 3-grams mostly occur in their prompt
    # (116 of the 300 entries; the typo, type-hint, docstring and test tasks)
    def grams(text: str) -> set[tuple[str, ...]]:
        words = text.split()
        return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}

    repeating = 0
    for e in data:
        prompt, reply = (t["value"] for t in e["conversations"][:2])
        g = grams(reply)
        repeating += bool(g) and len(g & grams(prompt)) >= len(g) / 2
    assert repeating >= 100, repeating
    some = data[17]["conversations"]
    r17 = next(r for r in reqs if r.req_id == "entry-17")
    assert r17.max_tokens == len(hf_ids(hf, some[1]["value"]))
