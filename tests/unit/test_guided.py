"""Structured output: patterns from schemas and choices, their validation, and the engine core
keeping a request's text to its pattern with the scripted fake runner and letter tokens."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from fakes import EOS_ID, FakeRunner, make_core, make_request, run
from test_async_engine import collect, run_with_engine

from switchboard.engine.config import EngineLimits
from switchboard.engine.errors import InvalidRequest
from switchboard.engine.guided import GuideBuilder, allowed_tokens, choice_pattern, json_schema_pattern
from switchboard.engine.params import OutputPattern
from switchboard.engine.request import FinishReason
from switchboard.engine.validation import build_request

LIMITS = EngineLimits(vocab_size=100, max_seq_len=64, max_input_len=63, max_iter_times=64,
                      max_token_bytes=8)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "population": {"type": "integer"}},
          "required": ["city", "population"]}


def letter_guides() -> GuideBuilder:
    """Guides over the fake tokenizer's vocabulary: one letter a token, 'z' the EOS."""
    return GuideBuilder(lambda: {bytes([ord("a") + i]): [i] for i in range(EOS_ID)}, EOS_ID)


def test_a_schema_s_pattern_matches_the_json_it_validates_and_not_other_json() -> None:
    regex = json_schema_pattern("guided_json", SCHEMA).regex
    assert re.fullmatch(regex, json.dumps({"city": "Paris", "population": 2100000}))
    assert not re.fullmatch(regex, json.dumps({"city": "Paris"}))
    assert json_schema_pattern("guided_json", json.dumps(SCHEMA)).regex == regex


def test_a_choice_pattern_matches_each_choice_literally() -> None:
    regex = choice_pattern("guided_choice", ["yes", "a.b"]).regex
    assert re.fullmatch(regex, "a.b") and re.fullmatch(regex, "yes")
    assert not re.fullmatch(regex, "axb")


@pytest.mark.parametrize(("parameters", "field"), [
    ({"guided_json": SCHEMA, "guided_regex": "a+"}, "guided_regex"),
    ({"guided_json": 5}, "guided_json"),
    ({"guided_json": {"type": "no-such-type"}}, "guided_json"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["yes", 1]}, "guided_choice"),
], ids=["two", "json-number", "json-bad-schema", "regex-empty", "choice-empty", "choice-int"])
def test_bad_patterns_are_refused_naming_the_field(parameters, field) -> None:
    with pytest.raises(InvalidRequest) as info:
        build_request("r", [1, 2], parameters, LIMITS)
    assert info.value.field == field


def test_a_pattern_the_vocabulary_cannot_spell_is_refused_naming_its_field() -> None:
    with pytest.raises(InvalidRequest) as info:
        letter_guides().prepare(OutputPattern("guided_regex", "[0-9]+"))
    assert info.value.field == "guided_regex"
    with pytest.raises(InvalidRequest, match="guided_regex"):
        letter_guides().prepare(OutputPattern("guided_regex", "(unclosed"))


def test_the_allowed_tokens_mask_is_the_guides_list_of_ids() -> None:
    guide = letter_guides().guide(OutputPattern("guided_regex", "(ab|c)x"))
    mask = allowed_tokens(guide, 40)  # a model's vocabulary may be wider than its tokenizer's
    assert mask.shape == (40,)
    assert set(mask.nonzero().view(-1).tolist()) == set(guide.get_tokens()) == {0, 2}
    guide.advance(0)
    assert allowed_tokens(guide, 40).nonzero().view(-1).tolist() == [1]


def guided(request_id: str, prompt: str, regex: str, **sampling: object):
    request = make_request(request_id, prompt, max_new_tokens=12)
    return dataclasses.replace(request, sampling=dataclasses.replace(
        request.sampling, pattern=OutputPattern("guided_regex", regex), **sampling))


def test_the_text_follows_the_pattern_and_ends_with_eos_once_it_is_complete() -> None:
    core = make_core(FakeRunner(scripts={"p": "cab"}))
    core.guides = letter_guides()
    core.add(guided("free", "p", "c[ab]{2}x"))  # the model's own choices, then 'x'
    core.add(guided("forced", "p", "(dd|ee)"))  # the model wants none of these
    outputs = run(core)
    free, forced = ("".join(event.text for event in outputs[name]) for name in ("free", "forced"))
    assert free == "cabx"
    assert forced in ("dd", "ee")
    assert all(outputs[name][-1].finish_reason is FinishReason.EOS for name in outputs)


def test_a_match_that_could_end_goes_on_as_far_as_the_pattern_allows() -> None:
    """After 'a' the match 'a{1,2}' is complete, yet the model's next 'a' is still followed."""
    core = make_core(FakeRunner(scripts={"p": "a"}))
    core.guides = letter_guides()
    core.add(guided("r", "p", "a{1,2}"))
    events = run(core)["r"]
    assert "".join(event.text for event in events) == "aa"
    assert events[-1].finish_reason is FinishReason.EOS


def test_a_complete_pattern_ends_the_request_even_before_min_new_tokens() -> None:
    """The pattern allows only EOS, min_new_tokens bans it: the pattern wins."""
    core = make_core(FakeRunner(scripts={"p": "cab"}))
    core.guides = letter_guides()
    core.add(guided("r", "p", "ca", min_new_tokens=5))
    events = run(core)["r"]
    assert "".join(event.text for event in events) == "ca"
    assert events[-1].finish_reason is FinishReason.EOS


def test_guesses_are_verified_against_the_pattern_too() -> None:
    """With speculation, each verified token follows the pattern as one at a time would."""
    texts = []
    for options in ({}, {"num_speculative_tokens": 3}):
        core = make_core(FakeRunner(scripts={"abcab": "cab"}), **options)
        core.guides = letter_guides()
        core.add(guided("r", "abcab", "(cab)(cab)(cad)"))
        texts.append("".join(event.text for event in run(core)["r"]))
    assert texts == ["cabcabcad", "cabcabcad"]


def test_the_async_engine_refuses_a_pattern_it_cannot_follow_before_queueing_it() -> None:
    core = make_core(FakeRunner())
    core.guides = letter_guides()

    async def scenario(engine) -> None:
        with pytest.raises(InvalidRequest) as info:
            await collect(engine.generate(guided("r", "p", "[0-9]+")))
        assert info.value.field == "guided_regex"
        assert engine.stats().num_waiting == engine.stats().num_running == 0
        [*_, last] = await collect(engine.generate(guided("ok", "p", "ca")))
        assert last.finish_reason is FinishReason.EOS

    run_with_engine(scenario, core)
