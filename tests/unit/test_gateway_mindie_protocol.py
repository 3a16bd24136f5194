"""MindIE's native /infer, /infer_token and /v1/tokenizer ⇄ switchboard.v1, without a network."""

from __future__ import annotations

import pytest

from switchboard.gateway.errors import RequestError
from switchboard.gateway.protocols import mindie
from switchboard.gateway.protocols.generation import Generation
from switchboard.proto import generation_fields
from switchboard.proto import switchboard_pb2 as sb


def response(text: str, token_id: int, *, latency_us: int = 5000, finish: str = "",
             generated: int = 1) -> sb.GenerateResponse:
    return sb.GenerateResponse(text=text, tokens=[sb.Token(id=token_id, text=text)],
                               token_latency_us=latency_us, finish_reason=finish,
                               generated_tokens=generated, seed=7)


def test_infer_request_carries_text_parameters_id_and_timeout() -> None:
    request, stream, details = mindie.infer_request_to_pb(
        {"id": "a1", "inputs": "Hi", "stream": True,
         "parameters": {"max_new_tokens": 4, "details": True, "timeout": 10, "seed": None}},
        tokens=False)
    assert (request.text, request.id, stream, details) == ("Hi", "a1", True, True)
    assert generation_fields.requested_values(request) == {"max_new_tokens": 4, "timeout": 10}


def test_infer_token_request_carries_token_ids() -> None:
    request, stream, details = mindie.infer_request_to_pb({"input_id": [5, 6]}, tokens=True)
    assert list(request.token_ids.ids) == [5, 6] and not stream and not details


@pytest.mark.parametrize(("body", "tokens", "field"), [
    ({}, False, "inputs"),
    ({"inputs": ["a"]}, False, "inputs"),
    ({"input_id": "5 6"}, True, "input_id"),
    ({"input_id": [5, True]}, True, "input_id"),
    ({"inputs": "x", "stream": "yes"}, False, "stream"),
    # A parameter named like the server's prompt field keeps its own name (found by
    # test_translator_properties: it was reported as `inputs`).
    ({"inputs": "x", "parameters": {"prompt": -2**63 - 1}}, False, "prompt"),
    ({"input_id": [5], "parameters": {"prompt": "y"}}, True, "prompt"),
])
def test_bad_requests_are_refused_naming_the_field(body: dict, tokens: bool, field: str) -> None:
    with pytest.raises(RequestError) as caught:
        mindie.infer_request_to_pb(body, tokens)
    assert caught.value.field == field


@pytest.mark.parametrize(("ids", "message"), [
    ("5 6", "input_id: must be an array of token ids; got a string"),
    ([[504, 3575]], "input_id: must be an array of token ids; got an array at position 0"),
    ([5, True], "input_id: must be an array of token ids; got a boolean at position 1")])
def test_token_ids_that_are_not_an_array_of_integers_are_refused_saying_where(
        ids: object, message: str) -> None:
    with pytest.raises(RequestError) as caught:
        mindie.infer_request_to_pb({"input_id": ids}, tokens=True)
    assert caught.value.message == message


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens_is_sent_on(skip: bool) -> None:
    request, *_ = mindie.infer_request_to_pb(
        {"inputs": "x", "parameters": {"skip_special_tokens": skip}}, tokens=False)
    assert request.output.skip_special_tokens is skip


def collect(*responses: sb.GenerateResponse) -> Generation:
    generation = Generation()
    for item in responses:
        generation.add(item)
    return generation


def test_reply_has_details_only_when_asked_and_ids_for_infer_token() -> None:
    generation = collect(response(" Paris", 7042), response(".", 30, finish="length", generated=2))
    assert mindie.reply(generation, details=False, tokens=False) == {"generated_text": " Paris."}
    assert mindie.reply(generation, details=True, tokens=True) == {
        "generated_text": " Paris.", "generated_token_ids": [7042, 30],
        "details": {"finish_reason": "length", "generated_tokens": 2, "seed": 7}}


def test_stream_events_time_the_first_token_as_prefill_and_end_with_the_text() -> None:
    generation = Generation()
    events = []
    for item in (response(" Paris", 7042, latency_us=75_500),
                 response(".", 30, latency_us=12_250, finish="eos_token", generated=2)):
        generation.add(item)
        events.append(mindie.stream_event(item, generation, details=True, tokens=False))
    assert events[0] == {"prefill_time": 75.5, "decode_time": None,
                         "token": {"id": 7042, "text": " Paris"}}
    assert events[1]["prefill_time"] is None and events[1]["decode_time"] == 12.25
    assert events[1]["generated_text"] == " Paris."
    assert events[1]["details"]["finish_reason"] == "eos_token"


def test_infer_token_stream_events_give_ids_as_lists_and_no_details_unless_asked() -> None:
    item = response("a", 3, finish="length")
    event = mindie.stream_event(item, collect(item), details=False, tokens=True)
    assert event["token"] == {"id": [3], "text": "a"} and "details" not in event


def test_tokenizer_request_and_reply() -> None:
    request, decode = mindie.tokenize_request_to_pb({"inputs": "Hello world", "do_decode": True})
    assert request.text == "Hello world" and decode
    answer = sb.TokenizeResponse(ids=[19556, 905], texts=["Hello", " world"])
    assert mindie.tokenize_reply(answer, decode=False) == {"token_number": 2,
                                                            "tokens": [19556, 905]}
    assert mindie.tokenize_reply(answer, decode=True)["tokens"] == ["Hello", " world"]
    with pytest.raises(RequestError) as caught:
        mindie.tokenize_request_to_pb({"text": "x"})
    assert caught.value.field == "inputs"


@pytest.mark.parametrize(("status", "error_type"), [
    (400, "Bad Request"), (404, "NotFoundError"), (422, "Input Validation Error"),
    (424, "Generation Error"), (500, "Incomplete Generation"), (503, "Service Unavailable"),
    (405, "Method Not Allowed"), (504, "Gateway Timeout"),
])
def test_error_envelope_types_by_status(status: int, error_type: str) -> None:
    assert mindie.error_body(status, "m") == {"error": "m", "error_type": error_type}


@pytest.mark.parametrize("tokens", [False, True])
def test_seed_0_is_refused_as_mindies_seeds_are_positive(tokens: bool) -> None:
    """MindIE's seeds are (0, 2^64 - 1]; switchboard.v1's take 0 (TGI's u64)."""
    body = {"input_id": [5]} if tokens else {"inputs": "x"}
    with pytest.raises(RequestError) as caught:
        mindie.infer_request_to_pb({**body, "parameters": {"seed": 0}}, tokens)
    assert caught.value.field == "seed"
    request, *_ = mindie.infer_request_to_pb({**body, "parameters": {"seed": 1}}, tokens)
    assert request.sampling.seed == 1


@pytest.mark.parametrize("parameters", [{"watermark": True, "perf_stat": True, "batch_size": 4,
                                         "details": False}])
def test_what_mindie_accepts_without_effect_stays_in_the_gateway(parameters) -> None:
    request, *_ = mindie.infer_request_to_pb({"inputs": "x", "parameters": parameters}, False)
    assert generation_fields.requested_values(request) == {}


@pytest.mark.parametrize("name, value", [("watermark", "yes"), ("perf_stat", 1),
                                         ("batch_size", 0), ("batch_size", True)])
def test_what_mindie_accepts_without_effect_is_still_checked(name, value) -> None:
    with pytest.raises(RequestError) as caught:
        mindie.infer_request_to_pb({"inputs": "x", "parameters": {name: value}}, False)
    assert caught.value.field == name
