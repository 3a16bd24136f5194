"""engine.validation.build_request: MindIE's parameter table, its defaults, ranges and errors."""

from __future__ import annotations

import json
import math

import pytest

from switchboard.engine.config import EngineLimits
from switchboard.engine.errors import InvalidRequest, PromptTooLong
from switchboard.engine.params import GenerationRequest
from switchboard.engine.validation import build_request

LIMITS = EngineLimits(vocab_size=100, max_seq_len=64, max_input_len=63, max_iter_times=32,
                      max_token_bytes=8)
PROMPT = (1, 2, 3)
UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1


def build(parameters: dict[str, object] | None = None,
          prompt: tuple[int, ...] | list[int] = PROMPT) -> GenerationRequest:
    return build_request("req-1", prompt, parameters or {}, LIMITS)


def rejection(parameters: dict[str, object] | None = None,
              prompt: tuple[int, ...] | list[int] = PROMPT) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        build(parameters, prompt)
    return caught.value


def test_defaults_are_greedy_20_tokens_priority_5_and_600_seconds() -> None:
    request = build()
    assert request.request_id == "req-1"
    assert request.prompt_token_ids == PROMPT
    assert request.priority == 5
    assert request.timeout_s == 600.0
    sampling = request.sampling
    assert sampling.do_sample is False
    assert sampling.max_new_tokens == 20
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.typical_p,
            sampling.repetition_penalty, sampling.stop) == (1.0, 0, 1.0, 1.0, 1.0, ())


def test_absent_seed_is_drawn_in_range_and_differs_between_requests() -> None:
    first, second = build().sampling.seed, build().sampling.seed
    assert 1 <= first <= UINT64_MAX
    assert 1 <= second <= UINT64_MAX
    assert first != second


def test_seed_0_is_a_seed_like_any_other() -> None:
    """The engine's seeds are TGI's u64: 0 is kept (not read as "absent" and drawn)."""
    assert [build({"seed": 0}).sampling.seed for _ in range(3)] == [0, 0, 0]


@pytest.mark.parametrize(("name", "value", "attribute", "expected"), [
    ("temperature", 1e-6, "temperature", 1e-6),
    ("temperature", 100.0, "temperature", 100.0),
    ("top_k", 0, "top_k", 0),
    ("top_k", INT32_MAX, "top_k", INT32_MAX),
    ("top_p", 1e-6, "top_p", 1e-6),
    ("top_p", 1.0, "top_p", 1.0),
    ("typical_p", 1e-6, "typical_p", 1e-6),
    ("typical_p", 1, "typical_p", 1.0),
    ("min_p", 0, "min_p", 0.0),
    ("min_p", 1, "min_p", 1.0),
    ("repetition_penalty", 1e-6, "repetition_penalty", 1e-6),
    ("repetition_penalty", 10.0, "repetition_penalty", 10.0),
    ("seed", 0, "seed", 0),
    ("seed", UINT64_MAX, "seed", UINT64_MAX),
    ("max_new_tokens", 1, "max_new_tokens", 1),
    ("priority", 1, "priority", 1),
    ("priority", 5, "priority", 5),
    ("timeout", 1e-3, "timeout_s", 1e-3),
    ("timeout", 3600, "timeout_s", 3600.0),
])
def test_range_edges_are_accepted(name: str, value: object, attribute: str,
                                  expected: object) -> None:
    request = build({name: value})
    owner = request if attribute in ("priority", "timeout_s") else request.sampling
    assert getattr(owner, attribute) == expected


@pytest.mark.parametrize(("name", "value"), [
    ("temperature", 0.0),
    ("temperature", -1.0),
    ("temperature", math.inf),
    ("top_k", -1),
    ("top_k", INT32_MAX + 1),
    ("top_p", 0.0),
    ("top_p", 1.0001),
    ("typical_p", 0.0),
    ("typical_p", 1.5),
    ("min_p", -0.1),
    ("min_p", 1.5),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -0.5),
    ("seed", -1),
    ("seed", UINT64_MAX + 1),
    ("max_new_tokens", 0),
    ("max_new_tokens", INT32_MAX + 1),
    ("priority", 0),
    ("priority", 6),
    ("timeout", 0),
    ("timeout", -1.0),
    ("timeout", 3600.5),
])
def test_values_outside_the_range_are_rejected_naming_the_parameter(name: str,
                                                                    value: object) -> None:
    error = rejection({name: value})
    assert error.field == name
    assert name in error.message
    assert "must be in" in error.reason


@pytest.mark.parametrize(("name", "value"), [
    ("temperature", True),
    ("temperature", "0.5"),
    ("temperature", math.nan),
    ("top_p", math.nan),
    ("top_k", False),
    ("top_k", "5"),
    ("top_k", 5.0),
    ("seed", 1.5),
    ("max_new_tokens", 10.0),
    ("priority", math.nan),
    ("timeout", True),
    ("do_sample", 1),
    ("do_sample", "true"),
])
def test_values_of_the_wrong_type_are_rejected_naming_the_parameter(name: str,
                                                                    value: object) -> None:
    error = rejection({name: value})
    assert error.field == name
    assert name in error.message
    assert f"got {json.dumps(value)}" in error.reason  # as the request's JSON writes it


def test_unknown_parameter_is_rejected_naming_it() -> None:
    error = rejection({"temperature": 0.5, "beam_width": 2})
    assert error.field == "beam_width"
    assert "unknown parameter" in error.reason
    assert "beam_width" in error.message


@pytest.mark.parametrize("hint", [{"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.9},
                                  {"typical_p": 0.9}, {"min_p": 0.1}])
def test_sampling_parameters_without_do_sample_turn_sampling_on(hint: dict[str, object]) -> None:
    assert build(hint).sampling.do_sample is True


def test_repetition_penalty_alone_keeps_greedy_decoding() -> None:
    assert build({"repetition_penalty": 1.2}).sampling.do_sample is False


def test_explicit_do_sample_false_wins_over_temperature() -> None:
    sampling = build({"do_sample": False, "temperature": 0.7}).sampling
    assert sampling.do_sample is False
    assert sampling.temperature == 0.7


def test_explicit_do_sample_true_samples_with_default_settings() -> None:
    assert build({"do_sample": True}).sampling.do_sample is True


@pytest.mark.parametrize(("prompt_length", "requested", "expected"), [
    (3, 20, 20),       # within every limit
    (3, 1000, 32),     # capped by max_iter_times
    (40, 1000, 24),    # capped by max_seq_len - prompt length (64 - 40)
    (63, 5, 1),        # the longest prompt leaves room for one token
])
def test_max_new_tokens_is_capped_by_the_limits(prompt_length: int, requested: int,
                                                expected: int) -> None:
    request = build({"max_new_tokens": requested}, prompt=[7] * prompt_length)
    assert request.sampling.max_new_tokens == expected


def test_min_new_tokens_past_the_max_asked_for_is_rejected_naming_it() -> None:
    error = rejection({"max_new_tokens": 5, "min_new_tokens": 6})
    assert error.field == "min_new_tokens"
    assert "must not exceed the most new tokens asked for (5); got 6" in error.reason
    assert build({"max_new_tokens": 5, "min_new_tokens": 5}).sampling.min_new_tokens == 5


def test_min_new_tokens_past_what_the_limits_allow_is_rejected_naming_it() -> None:
    """max_iter_times 32; max_seq_len 64 leaves 24 new tokens after a 40-token prompt."""
    for parameters, prompt, most in (({"max_new_tokens": 1000, "min_new_tokens": 33}, PROMPT, 32),
                                     ({"min_new_tokens": 25}, [7] * 40, 24)):
        error = rejection(parameters, prompt)
        assert error.field == "min_new_tokens"
        assert f"must not exceed {most}, the most new tokens this prompt can have" in error.reason
    assert build({"max_new_tokens": 1000, "min_new_tokens": 32}).sampling.min_new_tokens == 32


def test_without_max_new_tokens_min_new_tokens_past_the_default_raises_the_max() -> None:
    sampling = build({"min_new_tokens": 25}).sampling
    assert (sampling.min_new_tokens, sampling.max_new_tokens) == (25, 25)


def test_empty_prompt_is_rejected() -> None:
    error = rejection(prompt=[])
    assert error.field == "prompt"
    assert "at least one token" in error.reason


def test_prompt_longer_than_max_input_len_is_prompt_too_long() -> None:
    with pytest.raises(PromptTooLong) as caught:
        build(prompt=[1] * 64)
    assert caught.value.field == "prompt"
    assert "has 64 tokens; at most 63" in caught.value.reason


@pytest.mark.parametrize(("bad_id", "position"), [(100, 2), (-1, 0), (10**6, 1)])
def test_token_id_outside_the_vocabulary_is_rejected_naming_its_position(bad_id: int,
                                                                          position: int) -> None:
    prompt = [5, 6, 7]
    prompt[position] = bad_id
    error = rejection(prompt=prompt)
    assert type(error) is InvalidRequest
    assert error.field == "prompt"
    assert f"token id {bad_id} at position {position}" in error.reason
    assert "[0, 100)" in error.reason


def test_highest_vocabulary_id_is_accepted() -> None:
    assert build(prompt=[0, 99]).prompt_token_ids == (0, 99)


@pytest.mark.parametrize(("stop", "expected"), [
    ("###", ("###",)),
    (["a", "\n\n"], ("a", "\n\n")),
    (("x",), ("x",)),
    ([], ()),
    (["s"] * 16, ("s",) * 16),
])
def test_stop_accepts_a_string_or_a_list_of_strings(stop: object,
                                                    expected: tuple[str, ...]) -> None:
    assert build({"stop": stop}).sampling.stop == expected


@pytest.mark.parametrize(("stop", "reason"), [
    ("", "non-empty string"),
    (["ok", ""], "non-empty string"),
    (["ok", 3], "non-empty string"),
    (42, "non-empty string"),
    (["s"] * 17, "up to 16 stop sequences; got 17"),
])
def test_invalid_stop_is_rejected(stop: object, reason: str) -> None:
    error = rejection({"stop": stop})
    assert error.field == "stop"
    assert reason in error.reason


@pytest.mark.parametrize("name", ["watermark", "details", "perf_stat", "batch_size"])
def test_what_mindie_accepts_without_effect_is_its_interfaces_not_the_engines(name) -> None:
    """The engine knows MindIE's ignored parameters no more (generation_fields drops them)."""
    assert rejection({name: True}).reason.startswith("unknown parameter")


def test_newer_parameters_default_to_changing_nothing() -> None:
    sampling = build().sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.min_new_tokens,
            sampling.ignore_eos, sampling.stop_token_ids, sampling.logprobs) == \
        (0.0, 0.0, 0, False, frozenset(), None)


@pytest.mark.parametrize(("name", "value"), [
    ("presence_penalty", -2.0),
    ("presence_penalty", 2),
    ("presence_penalty", 0.5),
    ("frequency_penalty", -2),
    ("frequency_penalty", 2.0),
    ("frequency_penalty", -0.25),
    ("min_new_tokens", 0),
    ("min_new_tokens", 5),
    ("min_new_tokens", 32),  # the limits' most (max_iter_times): more is refused, see above
    ("ignore_eos", True),
    ("ignore_eos", False),
])
def test_new_parameters_accept_their_range_edges(name: str, value: object) -> None:
    assert getattr(build({name: value}).sampling, name) == value


@pytest.mark.parametrize(("name", "value"), [
    ("presence_penalty", -2.01),
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3),
    ("frequency_penalty", 2.0001),
    ("min_new_tokens", -1),
    ("min_new_tokens", INT32_MAX + 1),
    ("top_logprobs", -1),
    ("top_logprobs", 21),
])
def test_new_parameters_outside_their_range_are_rejected(name: str, value: object) -> None:
    error = rejection({name: value})
    assert error.field == name
    assert "must be in" in error.reason


@pytest.mark.parametrize(("name", "value"), [
    ("presence_penalty", "0.5"),
    ("presence_penalty", True),
    ("frequency_penalty", math.nan),
    ("min_new_tokens", 1.5),
    ("min_new_tokens", False),
    ("ignore_eos", 1),
    ("ignore_eos", "true"),
    ("logprobs", 1),
    ("logprobs", "yes"),
    ("top_logprobs", 2.0),
    ("top_logprobs", True),
])
def test_new_parameters_of_the_wrong_type_are_rejected(name: str, value: object) -> None:
    error = rejection({name: value})
    assert error.field == name
    assert f"got {json.dumps(value)}" in error.reason  # as the request's JSON writes it


@pytest.mark.parametrize(("stop_token_ids", "expected"), [
    ([0, 99], frozenset({0, 99})),
    ((5, 5, 7), frozenset({5, 7})),
    ([], frozenset()),
])
def test_stop_token_ids_accept_a_list_of_vocabulary_ids(stop_token_ids: object,
                                                        expected: frozenset[int]) -> None:
    assert build({"stop_token_ids": stop_token_ids}).sampling.stop_token_ids == expected


@pytest.mark.parametrize(("stop_token_ids", "reason"), [
    (5, "must be a list of token ids"),
    ("5", "must be a list of token ids"),
    ([1, "2"], "must be a list of token ids"),
    ([1.0], "must be a list of token ids"),
    ([True], "must be a list of token ids"),
    ([1, None], "must be a list of token ids"),
    ([100], "token id 100 at position 0 is outside the vocabulary [0, 100)"),
    ([3, -1], "token id -1 at position 1 is outside the vocabulary [0, 100)"),
])
def test_invalid_stop_token_ids_are_rejected(stop_token_ids: object, reason: str) -> None:
    error = rejection({"stop_token_ids": stop_token_ids})
    assert error.field == "stop_token_ids"
    assert reason in error.reason


def test_special_tokens_are_skipped_unless_asked_not_to() -> None:
    assert build().sampling.skip_special_tokens is True
    assert build({"skip_special_tokens": False}).sampling.skip_special_tokens is False


def test_allowed_token_ids_are_vocabulary_ids_and_not_none() -> None:
    assert build({"allowed_token_ids": [3, 5, 3]}).sampling.allowed_token_ids == {3, 5}
    assert build().sampling.allowed_token_ids is None
    for value, reason in (([], "must not be empty"), ([100], "outside the vocabulary"),
                          ("3", "must be a list of token ids")):
        error = rejection({"allowed_token_ids": value})
        assert error.field == "allowed_token_ids" and reason in error.reason


@pytest.mark.parametrize(("logit_bias", "expected"), [
    ({"5": 100, "7": -100.0}, ((5, 100.0), (7, -100.0))),
    ({"0": 0.5}, ((0, 0.5),)),
    ({}, ()),
])
def test_logit_bias_maps_vocabulary_ids_to_biases(logit_bias: object,
                                                  expected: tuple[tuple[int, float], ...]) -> None:
    assert build({"logit_bias": logit_bias}).sampling.logit_bias == expected
    assert build().sampling.logit_bias == ()


@pytest.mark.parametrize(("logit_bias", "reason"), [
    ([5, 1], "must be an object mapping token ids to biases in [-100, 100]"),
    ("5", "must be an object mapping token ids to biases"),
    ({"a": 1}, "keys must be token ids; got \"a\""),
    ({"-1": 1}, "keys must be token ids; got \"-1\""),
    ({"5": 100.5}, "the bias of token 5 must be a number in [-100, 100]; got 100.5"),
    ({"5": "1"}, "the bias of token 5 must be a number in [-100, 100]"),
    ({"5": True}, "the bias of token 5 must be a number in [-100, 100]"),
    ({"5": float("nan")}, "the bias of token 5 must be a number in [-100, 100]"),
    ({"3": 1, "100": 1}, "token id 100 at position 1 is outside the vocabulary [0, 100)"),
])
def test_invalid_logit_bias_is_rejected(logit_bias: object, reason: str) -> None:
    error = rejection({"logit_bias": logit_bias})
    assert error.field == "logit_bias"
    assert reason in error.reason


@pytest.mark.parametrize(("parameters", "expected"), [
    ({}, None),
    ({"logprobs": False}, None),
    ({"logprobs": True}, 0),
    ({"logprobs": True, "top_logprobs": 0}, 0),
    ({"logprobs": True, "top_logprobs": 5}, 5),
    ({"logprobs": True, "top_logprobs": 20}, 20),
])
def test_logprobs_and_top_logprobs_set_how_many_alternatives_to_report(
        parameters: dict[str, object], expected: int | None) -> None:
    assert build(parameters).sampling.logprobs == expected


@pytest.mark.parametrize("parameters", [{"top_logprobs": 3},
                                        {"logprobs": False, "top_logprobs": 3}])
def test_top_logprobs_without_logprobs_is_rejected(parameters: dict[str, object]) -> None:
    error = rejection(parameters)
    assert error.field == "top_logprobs"
    assert "logprobs" in error.reason


@pytest.mark.parametrize(("parameters", "expected"), [
    ({}, False),
    ({"prompt_logprobs": False}, False),
    ({"prompt_logprobs": True}, True),
])
def test_prompt_logprobs_is_a_flag_off_by_default(parameters: dict[str, object],
                                                  expected: bool) -> None:
    assert build(parameters).sampling.prompt_logprobs is expected


@pytest.mark.parametrize("value", [1, "true", [True]])
def test_a_non_boolean_prompt_logprobs_is_rejected(value: object) -> None:
    error = rejection({"prompt_logprobs": value})
    assert error.field == "prompt_logprobs"
    assert f"got {json.dumps(value)}" in error.reason  # as the request's JSON writes it


def test_truncate_keeps_the_last_tokens_of_the_prompt() -> None:
    assert build({"truncate": 2}, prompt=(1, 2, 3)).prompt_token_ids == (2, 3)
    assert build({"truncate": 10}, prompt=(1, 2, 3)).prompt_token_ids == (1, 2, 3)


def test_truncate_brings_a_long_prompt_within_max_input_len() -> None:
    request = build({"truncate": 63}, prompt=list(range(1, 81)))
    assert request.prompt_token_ids == tuple(range(18, 81))


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_truncate_outside_its_range_is_rejected_naming_it(value: object) -> None:
    assert rejection({"truncate": value}).field == "truncate"
