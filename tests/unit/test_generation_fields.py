"""switchboard.v1's typed generation fields (proto/generation_fields.py): the one table every
protocol's parameters become typed by, and what MindIE's interfaces accept without effect."""

from __future__ import annotations

import pytest

from switchboard.proto import generation_fields as fields
from switchboard.proto import switchboard_pb2 as sb


def test_values_travel_typed_and_come_back_as_they_were_meant() -> None:
    values = {"temperature": 0.5, "top_k": 3, "seed": 2**64 - 1, "stop": "END",
              "stop_token_ids": [2], "logit_bias": {"7": -1}, "allowed_token_ids": [],
              "guided_json": {"type": "object"}, "priority": 2, "timeout": 1.5,
              "logprobs": True, "skipped": None}
    assert fields.typed_values(values) == {
        "temperature": 0.5, "top_k": 3, "seed": 2**64 - 1, "stop": ["END"],
        "stop_token_ids": [2], "logit_bias": {7: -1.0}, "allowed_token_ids": [],
        "guided_json": '{"type": "object"}', "priority": 2, "timeout": 1.5, "logprobs": True}


@pytest.mark.parametrize("name, value, reason", [
    ("temperature", "0.5", 'must be a number; got "0.5"'),
    ("top_k", True, "must be an integer; got true"),
    ("seed", -1, "must be an integer in [0, 18446744073709551615]; got -1"),
    ("do_sample", 1, "must be true or false; got 1"),
    ("stop", [1], "must be a string or a list of strings; got [1]"),
    ("stop_token_ids", [-1], "must be a list of token ids; got [-1]"),
    ("logit_bias", {"a": 1}, 'keys must be token ids; got "a"'),
    ("guided_json", [1], "must be a JSON schema (an object, or its text); got [1]"),
    ("frobnicate", 1, "unknown parameter; supported parameters are "),
])
def test_a_value_its_field_cannot_hold_is_refused_naming_it(name, value, reason) -> None:
    with pytest.raises(fields.FieldError) as refused:
        fields.fill(sb.GenerateRequest(), {name: value})
    assert refused.value.field == name and refused.value.reason.startswith(reason)


def test_a_second_output_pattern_is_refused() -> None:
    with pytest.raises(fields.FieldError) as refused:
        fields.fill(sb.GenerateRequest(), {"guided_regex": "a+", "guided_choice": ["b"]})
    assert (refused.value.field, refused.value.reason) == (
        "guided_choice", "cannot be combined with guided_regex: a request follows one pattern")


def test_what_mindie_accepts_without_effect_is_checked_then_dropped() -> None:
    assert fields.under_mindie_rules({"watermark": True, "details": False,
                                      "perf_stat": True, "batch_size": 4, "seed": 9}) \
        == {"seed": 9}


@pytest.mark.parametrize("name, value", [("watermark", "false"), ("details", 1),
                                         ("perf_stat", "yes"), ("batch_size", 0),
                                         ("batch_size", True), ("batch_size", "x")])
def test_what_mindie_accepts_without_effect_must_still_be_well_formed(name, value) -> None:
    with pytest.raises(fields.FieldError) as refused:
        fields.under_mindie_rules({name: value})
    assert refused.value.field == name


def test_mindies_seeds_are_positive() -> None:
    """Seed 0, which the engine takes (TGI's u64), is refused on MindIE's interfaces, native
    and Triton alike, by this one rule."""
    with pytest.raises(fields.FieldError) as refused:
        fields.under_mindie_rules({"seed": 0})
    assert (refused.value.field, refused.value.reason) == (
        "seed", f"must be in [1, {fields.UINT64_RANGE.stop - 1}]; got 0 (MindIE's seeds are "
        "positive)")
    assert fields.under_mindie_rules({"seed": 1}) == {"seed": 1}
