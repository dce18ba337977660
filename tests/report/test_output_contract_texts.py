"""The output contract's first differing request shows both decoded outputs, about the first
character where they differ, and its prompt (hand-made runs; the texts are chosen here)."""

from __future__ import annotations

from pathlib import Path

from mrv2_prof.analysis.run_sides import run_facts
from mrv2_prof.report.output_contract import FAIL, contract_stage
from mrv2_prof.store import Store

SCENARIO = "name: chat\nseed: 7\nmodel: {preset: smollm2-135m}\nworkload: {sampling: {}}\n"
PROMPT = "<|im_start|>user\nWhat is six times seven?<|im_end|>\n<|im_start|>assistant\n"


def _run(store: Store, run_id: str, tokens: dict[str, list[int]], texts: dict[str, str | None]):
    store.begin_run(
        run_id, scenario_name="chat", label="chat", matrix_combo=None, scenario_yaml=SCENARIO,
        device="cpu", versions={}, started_ns=0,
        info={"leaks": {"request_slots": 0, "kv_blocks": 0, "unfinished": 0}},
    )  # fmt: skip
    ids = list(tokens)
    store.append(run_id, "requests", {
        "req_id": ids, "arrival_ns": list(range(len(ids))), "finish_reason": ["length"] * len(ids),
        "output_tokens": [len(tokens[r]) for r in ids],
        "prompt_text": [PROMPT if texts[r] is not None else None for r in ids],
        "output_text": [texts[r] for r in ids],
    })  # fmt: skip
    rows = [(r, i, t) for r in ids for i, t in enumerate(tokens[r])]
    store.append(run_id, "tokens", {
        "req_id": [r for r, _, _ in rows], "idx": [i for _, i, _ in rows],
        "t_ns": [10 + i for _, i, _ in rows], "token_id": [t for _, _, t in rows],
    })  # fmt: skip
    store.finish_run(run_id, "completed", ended_ns=100)


def _stage(path: Path, base: dict, cand: dict, base_texts: dict, cand_texts: dict):
    with Store.open(path) as store:
        _run(store, "base01", base, base_texts)
        _run(store, "cand02", cand, cand_texts)
        return contract_stage(
            store, run_facts(store, "base01"), store, [run_facts(store, "cand02")]
        )


def test_the_first_differing_request_shows_both_outputs_and_its_prompt(tmp_path: Path) -> None:
    base = {"r0": [1, 2, 3], "r1": [4, 5, 6, 7]}
    cand = {"r0": [1, 2, 3], "r1": [4, 5, 9, 7]}
    same = "Six times seven."
    stage = _stage(
        tmp_path / "runs.duckdb", base, cand,
        {"r0": same, "r1": "The answer is 42, of course."},
        {"r0": same, "r1": "The answer is 43, of course."},
    )  # fmt: skip
    assert stage.status == FAIL
    assert stage.lines[:4] == [
        "FAIL output contract: request 'r1' position 2: baseline token 6, candidate token 9 "
        "(run cand02)",
        '  prompt: "What is six times seven?"',  # the user message, not the template
        '  baseline output from character 15: "The answer is 42, of course."',
        '  candidate output from character 15: "The answer is 43, of course." (run cand02)',
    ]


def test_long_outputs_are_shown_about_the_difference(tmp_path: Path) -> None:
    a = "x" * 300 + "A" + "y" * 300 + "\n<b>"
    b = "x" * 300 + "B" + "y" * 300 + "\n<b>"
    stage = _stage(tmp_path / "runs.duckdb", {"r0": [1, 2]}, {"r0": [1, 3]}, {"r0": a}, {"r0": b})
    # 100 characters from a third of them (33) before the difference, "…" on both cuts
    assert stage.lines[2] == f'  baseline output from character 300: "…{"x" * 33}A{"y" * 66}…"'
    assert stage.lines[3].startswith(f'  candidate output from character 300: "…{"x" * 33}B')


def test_a_run_without_text_keeps_the_one_line_failure(tmp_path: Path) -> None:
    stage = _stage(
        tmp_path / "runs.duckdb", {"r0": [1, 2]}, {"r0": [1, 3]}, {"r0": None}, {"r0": None}
    )
    assert stage.lines[0].startswith("FAIL output contract: request 'r0' position 1")
    assert not any(line.startswith("  ") for line in stage.lines)


def test_only_one_run_with_text_says_which_has_none(tmp_path: Path) -> None:
    stage = _stage(
        tmp_path / "runs.duckdb", {"r0": [1, 2]}, {"r0": [1, 3]}, {"r0": None}, {"r0": "a\tb"}
    )
    assert stage.lines[1:4] == [
        '  prompt: "What is six times seven?"',
        "  baseline output: no text stored",
        '  candidate output: "a b" (run cand02)',  # a tab shown as a space
    ]
