"""``spec_decode.method: draft_model`` through the real command line: a draft that cannot draft
for the target (another vocabulary, a layer count out of range, an unknown preset, a missing
checkpoint, two sources) is one line naming the field, exit 2, the database unchanged."""

from __future__ import annotations

import pytest

from tests.test_bad_input_cli import OK, RUN, Case, check_case

SPEC = "runner.spec_decode.method=draft_model"


def draft(value: str) -> list[str]:
    return [*RUN, "--set", SPEC, "--set", f"runner.spec_decode.draft={value}"]


CASES = {
    "other-vocabulary": Case(
        draft("{preset: llama-1b}"),
        ["s.yaml: runner.spec_decode.draft.preset", "vocabulary (128,256)", "target's (512)"],
    ),
    "target-layers-all": Case(
        draft("{target_layers: 2}"),
        ["s.yaml: runner.spec_decode.draft.target_layers", "must be in [1, 1]", "got 2"],
    ),
    "unknown-preset": Case(
        draft("{preset: nope}"), ["s.yaml: runner.spec_decode.draft.preset", "'nope'"]
    ),
    "missing-checkpoint": Case(
        draft("{path: {dir}/none}"),
        ["s.yaml: runner.spec_decode.draft.path", "does not exist"],
    ),
    "two-sources": Case(
        draft("{preset: llama-tiny-draft, target_layers: 1}"),
        ["runner.spec_decode.draft", "exactly one of preset, path or target_layers"],
    ),
    "no-source": Case(
        [*RUN, "--set", SPEC], ["runner.spec_decode.draft", "exactly one of", "(found none)"]
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_draft_that_cannot_draft_is_one_line_exit_2(name, tmp_path, base_db) -> None:
    case = CASES[name]
    case.files.setdefault("s.yaml", OK)
    check_case(case, tmp_path, base_db)
