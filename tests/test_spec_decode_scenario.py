"""``runner.spec_decode``: the keys, their defaults, and one-line errors naming the field."""

from __future__ import annotations

import pytest

from mrv2_prof.runner.config import SpecDecodeConfig
from mrv2_prof.scenario import ScenarioError
from mrv2_prof.scenario.schema import Scenario


def config(**spec):
    s = Scenario.from_data({"name": "x", "runner": {"spec_decode": spec}}, "s.yaml")
    return s.runner_config().spec_decode


def test_defaults_are_off_and_the_issue_names():
    c = config()
    assert c == SpecDecodeConfig() and not c.enabled and c.max_k == 0
    c = config(
        method="ngram",
        num_speculative_tokens=3,
        dynamic_k={1: 3, 16: 2, 64: 1},
        ngram={"min": 1, "max": 5},
    )
    assert (c.method, c.num_speculative_tokens, c.ngram_min, c.ngram_max) == ("ngram", 3, 1, 5)
    assert c.dynamic_k == ((1, 3), (16, 2), (64, 1))
    assert [c.k_for(b) for b in (1, 2, 16, 17, 64, 65)] == [3, 2, 2, 1, 1, 0]
    assert c.possible_ks(100) == [0, 1, 2, 3]


def test_dynamic_k_survives_the_json_round_trip_of_a_run_job():
    s = Scenario.from_data(
        {"name": "x", "runner": {"spec_decode": {"method": "ngram", "dynamic_k": {8: 2}}}}, "s"
    )
    again = Scenario.from_data(s.model_dump(mode="json"), "s")
    assert again.runner_config().spec_decode.dynamic_k == ((8, 2),)


@pytest.mark.parametrize(
    ("spec", "field", "problem"),
    [
        ({"method": "medusa"}, "method", "Input should be"),
        ({"method": "draft_model"}, "draft", "exactly one of preset, path or target_layers"),
        (
            {"method": "draft_model", "draft": {"preset": "llama-tiny", "target_layers": 1}},
            "draft",
            "(found preset, target_layers)",
        ),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens", ">= 1"),
        ({"num_speculative_tokens": 17}, "num_speculative_tokens", "<= 16"),
        ({"num_speculative_tokens": True}, "num_speculative_tokens", "valid integer"),
        ({"dynamic_k": {1: 5}}, "dynamic_k", "outside [0, num_speculative_tokens 4]"),
        ({"dynamic_k": {}}, "dynamic_k", "at least one"),
        ({"dynamic_k": {0: 1}}, "dynamic_k.0.[key]", ">= 1"),
        ({"ngram": {"min": 3, "max": 2}}, "ngram.min", "min <= max"),
        ({"ngram": {"min": 0}}, "ngram.min", ">= 1"),
        ({"draft": {"target_layers": 0}}, "draft.target_layers", ">= 1"),
        ({"bogus": 1}, "bogus", "unknown key"),
    ],
)
def test_bad_values_are_one_line_naming_the_field(spec, field, problem):
    with pytest.raises(ScenarioError) as exc:
        config(**spec)
    message = str(exc.value)
    assert message.startswith(f"s.yaml: runner.spec_decode.{field}: "), message
    assert problem in message and "\n" not in message
