"""The gateway's generation translators, pure: TGI, vLLM's demo server and OpenAI's API ⇄
switchboard.v1 Generate (gateway/protocols/{generation,tgi,openai,vllm}.py). No network, no
model; the server's GenerateResponse messages are built by hand."""

from __future__ import annotations

import asyncio
import json

import pytest

from switchboard.gateway.errors import RequestError, field_in_protocol
from switchboard.gateway.protocols import openai, tgi, vllm
from switchboard.gateway.protocols.generation import Generation, generate_request, renamed
from switchboard.proto import generation_fields
from switchboard.proto import switchboard_pb2 as sb

USER = {"role": "user", "content": "Hi"}


# --- helpers -----------------------------------------------------------------------------------

def refused(call, *args, **kwargs) -> RequestError:
    """`call(*args, **kwargs)` must refuse the request with a 400; returns the error."""
    with pytest.raises(RequestError) as info:
        call(*args, **kwargs)
    assert info.value.status == 400
    return info.value


def params(request: sb.GenerateRequest) -> dict[str, object]:
    """A request's parameters as plain values."""
    return generation_fields.requested_values(request)


def token(token_id: int, text: str, logprob: float | None = None, *, special: bool = False,
          top: list[sb.Token] | None = None) -> sb.Token:
    result = sb.Token(id=token_id, text=text, special=special, top=top or [])
    if logprob is not None:
        result.logprob = logprob
    return result


def response(index: int = 0, text: str = "", tokens: list[sb.Token] | None = None, *,
             finish: str = "", prompt_tokens: int = 3, generated: int = 1, seed: int = 0,
             cached: int = 0, prompt: list[sb.Token] | None = None,
             sampled: bool | None = None, decoded: str | None = None) -> sb.GenerateResponse:
    """A response; its sequence is sampled when it has a seed, unless `sampled` says. Its
    decoded text is its text unless `decoded` says (they differ only with stop strings)."""
    return sb.GenerateResponse(index=index, text=text, tokens=tokens or [], finish_reason=finish,
                               decoded_text=text if decoded is None else decoded,
                               prompt_tokens=prompt_tokens, generated_tokens=generated, seed=seed,
                               cached_tokens=cached, prompt=prompt or [],
                               sampled=bool(seed) if sampled is None else sampled)


def generation_of(*responses: sb.GenerateResponse) -> Generation:
    generation = Generation()
    for item in responses:
        generation.add(item)
    return generation


def tgi_request(parameters: dict[str, object] | None = None, route_stream: bool | None = False,
                **body: object) -> tuple[sb.GenerateRequest, tgi.TgiOptions]:
    """A TGI body with `inputs` "Hello"; `route_stream` None: POST /, the body decides."""
    document: dict[str, object] = {"inputs": "Hello", **body}
    if parameters is not None:
        document["parameters"] = parameters
    return tgi.generate_request_to_pb(document, route_stream)


def chat(**fields: object) -> tuple[list[openai.Call], openai.OpenAIOptions]:
    return openai.chat_request_to_pb({"messages": [USER], **fields})


def chat_params(**fields: object) -> dict[str, object]:
    calls, _ = chat(**fields)
    return params(calls[0].request)


def completion(**fields: object) -> tuple[list[openai.Call], openai.OpenAIOptions]:
    return openai.completion_request_to_pb({"prompt": "Once", **fields})


# --- generation.py: field names, parameters, the request ---------------------------------------

@pytest.mark.parametrize("violation, names, expected", [
    (("min_new_tokens", "must be in [0, 2147483647]; got -1"), openai.NAMES,
     ("min_tokens", "min_tokens: must be in [0, 2147483647]; got -1")),
    (("max_new_tokens", "must be in [1, 2147483647]; got 0"), vllm.NAMES,
     ("max_tokens", "max_tokens: must be in [1, 2147483647]; got 0")),
    (("prompt", "has 9000 tokens; at most 4096 are accepted"), tgi.NAMES,
     ("inputs", "inputs: has 9000 tokens; at most 4096 are accepted")),
    (("top_logprobs", "must be in [0, 20]; got 50"), tgi.NAMES,
     ("top_n_tokens", "top_n_tokens: must be in [0, 20]; got 50")),
    (("prompt_logprobs", "must be true or false"), tgi.NAMES,
     ("decoder_input_details", "decoder_input_details: must be true or false")),
    # Names the protocol shares with the server are kept, indexes included.
    (("messages[0].role", "must be one of system, user, assistant"), openai.NAMES,
     ("messages[0].role", "messages[0].role: must be one of system, user, assistant")),
    (("stop[1]", "is empty"), tgi.NAMES, ("stop[1]", "stop[1]: is empty")),
    (("temperature", "must be in (0, 100]; got 0"), vllm.NAMES,
     ("temperature", "temperature: must be in (0, 100]; got 0")),
    # A reason over several lines keeps them all.
    (("max_new_tokens", "too many\nsee the limits"), vllm.NAMES,
     ("max_tokens", "max_tokens: too many\nsee the limits")),
], ids=["openai-min", "vllm-max", "tgi-prompt", "tgi-top", "tgi-prefill", "indexed", "tgi-stop",
        "shared", "multiline"])
def test_field_in_protocol_names_the_protocols_field(violation, names, expected) -> None:
    assert field_in_protocol(*violation, names) == expected


def test_field_in_protocol_renames_a_prefix_of_an_indexed_server_field() -> None:
    names = {"inputs": "prompt"}
    assert field_in_protocol("prompt[3]", "token id 99999 is outside the vocabulary", names) == \
        ("inputs[3]", "inputs[3]: token id 99999 is outside the vocabulary")


def test_openai_max_new_tokens_errors_name_max_tokens() -> None:
    assert field_in_protocol("max_new_tokens", "must be in [1, 2147483647]; got 0", openai.NAMES) \
        == ("max_tokens", "max_tokens: must be in [1, 2147483647]; got 0")


def test_chat_errors_name_the_length_field_the_client_sent_and_messages_for_the_prompt() -> None:
    violation = ("max_new_tokens", "must be in [1, 2147483647]; got 0")
    _, options = chat(max_tokens=0)
    assert field_in_protocol(*violation, options.names)[0] == "max_tokens"
    _, options = chat(max_completion_tokens=0)
    assert field_in_protocol(*violation, options.names)[0] == "max_completion_tokens"
    assert field_in_protocol("prompt", "has 3000 tokens", options.names)[0] == "messages"


def test_renamed_drops_nulls_and_keeps_unnamed_parameters() -> None:
    assert renamed({"max_tokens": 5, "min_tokens": None, "top_k": 0, "mystery": "x"},
                   vllm.NAMES) == {"max_new_tokens": 5, "top_k": 0, "mystery": "x"}


def test_generate_request_with_text_and_parameters() -> None:
    request = generate_request("smollm2", "Hello", {
        "max_new_tokens": 7, "temperature": 0.5, "do_sample": True, "stop": ["\n", "END"],
        "stop_token_ids": [2, 3], "seed": 2**64 - 1, "skipped": None}, client_id="abc")
    assert (request.model_name, request.id) == ("smollm2", "abc")
    assert request.WhichOneof("prompt") == "text" and request.text == "Hello"
    assert request.sampling.max_new_tokens == 7
    assert request.sampling.temperature == 0.5
    assert request.sampling.do_sample is True
    assert request.sampling.seed == 2**64 - 1
    assert list(request.sampling.stop) == ["\n", "END"]
    assert list(request.sampling.stop_token_ids) == [2, 3]
    assert params(request).keys() == {"max_new_tokens", "temperature", "do_sample", "stop",
                                      "stop_token_ids", "seed"}


# --- seeds: TGI's u64, vLLM's and OpenAI's int64 (-1: random) -----------------------------------

INT64_MIN, INT64_MAX, UINT64_MAX = -2**63, 2**63 - 1, 2**64 - 1


@pytest.mark.parametrize(("seed", "sent"), [(-2, UINT64_MAX - 1), (INT64_MIN, 2**63)])
def test_openai_and_vllm_negative_seeds_are_sent_as_their_twos_complement(seed: int,
                                                                          sent: int) -> None:
    """A negative seed is a seed of its own: seed + 2^64, which no int64 >= 0 is sent as."""
    assert chat_params(seed=seed)["seed"] == sent
    [call], _ = completion(seed=seed)
    assert params(call.request)["seed"] == sent
    request, *_ = vllm.generate_request_to_pb({"prompt": "Hi", "seed": seed})
    assert params(request)["seed"] == sent


def test_openai_and_vllm_seed_minus_1_is_random_as_vllms() -> None:
    assert "seed" not in chat_params(seed=-1)
    [call], _ = completion(seed=-1)
    assert "seed" not in params(call.request)
    request, *_ = vllm.generate_request_to_pb({"prompt": "Hi", "seed": -1})
    assert "seed" not in params(request)


@pytest.mark.parametrize(("seed", "shown"), [
    (INT64_MAX + 1, str(INT64_MAX + 1)), (UINT64_MAX, str(UINT64_MAX)),
    (INT64_MIN - 1, str(INT64_MIN - 1)), ("7", '"7"'), (1.5, "1.5"), (True, "true")])
def test_openai_and_vllm_seeds_other_than_int64s_are_refused_naming_seed(seed: object,
                                                                         shown: str) -> None:
    """With vLLM's range, shown as JSON, not the engine's uint64 range."""
    for error in (refused(chat, seed=seed), refused(completion, seed=seed),
                  refused(vllm.generate_request_to_pb, {"prompt": "Hi", "seed": seed})):
        assert error.field == "seed"
        assert error.message == (f"seed: must be an integer in [{INT64_MIN}, {INT64_MAX}] "
                                 f"(-1: random); got {shown}")


@pytest.mark.parametrize(("temperature", "shown"), [
    (-1, "-1"), (-0.5, "-0.5"), ("0.5", '"0.5"'), (False, "false"), ([1], "[1]")])
def test_openai_and_vllm_temperatures_are_refused_with_vllms_range(temperature: object,
                                                                   shown: str) -> None:
    """[0, inf), 0 being greedy: not the engine's (0, inf), which these routes do not take."""
    for error in (refused(chat, temperature=temperature),
                  refused(completion, temperature=temperature),
                  refused(vllm.generate_request_to_pb,
                          {"prompt": "Hi", "temperature": temperature})):
        assert error.field == "temperature"
        assert error.message == ("temperature: must be a number in [0, inf) (0: greedy); "
                                 f"got {shown}")


def test_openai_top_k_minus_1_is_no_cut_as_vllms() -> None:
    assert chat_params(top_k=-1)["top_k"] == 0


@pytest.mark.parametrize("stop", ["END", "[1, 2]"], ids=["plain", "looks-like-json"])
def test_generate_request_sends_one_stop_string_as_a_list(stop: str) -> None:
    request = generate_request("", "x", {"stop": stop})
    assert list(request.sampling.stop) == [stop]


def test_generate_request_with_token_ids() -> None:
    request = generate_request("", [5, 6, 7], {})
    assert request.WhichOneof("prompt") == "token_ids"
    assert list(request.token_ids.ids) == [5, 6, 7]
    assert request.model_name == "" and request.id == ""


def test_generate_request_with_chat_messages() -> None:
    messages = sb.ChatMessages(messages=[sb.ChatMessage(role="system", content="Be brief."),
                                         sb.ChatMessage(role="user", content="Hi")])
    request = generate_request("", messages, {})
    assert request.WhichOneof("prompt") == "messages"
    assert [(m.role, m.content) for m in request.messages.messages] == \
        [("system", "Be brief."), ("user", "Hi")]


def test_generate_request_with_no_chat_messages_still_sends_messages() -> None:
    request = generate_request("", sb.ChatMessages(), {})
    assert request.WhichOneof("prompt") == "messages"


def test_generate_request_converts_priority_and_timeout() -> None:
    request = generate_request("", "x", {"priority": 2, "timeout": 1.5})
    assert (request.scheduling.priority, request.scheduling.timeout) == (2, 1.5)


@pytest.mark.parametrize("name, value, message", [
    ("priority", True, "must be an integer; got true"),
    ("priority", 1.5, "must be an integer in [-9223372036854775808, 9223372036854775807]; got 1.5"),
    ("timeout", "10", 'must be a number; got "10"'),
    ("stop_token_ids", [-1], "must be a list of token ids; got [-1]")])
def test_generate_request_refuses_a_value_its_typed_field_cannot_hold(name, value,
                                                                      message) -> None:
    """Types are checked where JSON becomes the typed request; ranges (priority 1-5, a
    timeout in (0, 3600]) are the server's."""
    error = refused(generate_request, "", "x", {name: value})
    assert (error.field, error.reason) == (name, message)


# --- generation.py: collecting responses -------------------------------------------------------

def test_generation_collects_each_sequence() -> None:
    prompt = [token(1, "<s>"), token(9, "Hi", -2.5)]
    generation = generation_of(
        response(0, "Hel", [token(10, "Hel", -0.5)], generated=1, seed=7, prompt=prompt,
                 prompt_tokens=2, cached=1),
        response(1, "Bye", [token(20, "Bye", -1.0)], generated=1, seed=8, prompt_tokens=2,
                 cached=1),
        response(0, "lo", [token(11, "lo", -0.25)], finish="eos_token", generated=2, seed=7,
                 prompt_tokens=2, cached=1),
        response(1, "", [token(2, "</s>", -0.125, special=True)], finish="length", generated=2,
                 seed=8, prompt_tokens=2, cached=1),
    )
    first, second = generation.ordered()
    assert (first.index, first.generated_text, first.finish_reason, first.seed) == \
        (0, "Hello", "eos_token", 7)
    assert [t.id for t in first.tokens] == [10, 11]
    assert first.cumulative_logprob == pytest.approx(-0.75)
    assert (second.generated_text, second.finish_reason, second.generated_tokens) == \
        ("Bye", "length", 2)
    # Counts per sequence add up; the prompt is counted (and its tokens kept) once.
    assert generation.completion_tokens == 4
    assert (generation.prompt_tokens, generation.cached_tokens) == (2, 1)
    assert [t.id for t in generation.prompt] == [1, 9]


def test_generation_orders_sequences_by_index_whatever_the_arrival() -> None:
    generation = generation_of(response(2, "c"), response(0, "a"), response(1, "b"))
    assert [s.generated_text for s in generation.ordered()] == ["a", "b", "c"]
    assert [s.index for s in generation.ordered()] == [0, 1, 2]


# --- TGI: requests -----------------------------------------------------------------------------

@pytest.mark.parametrize("adapter_id", [None, "None"])
def test_tgi_adapter_id_null_or_none_as_mindies_examples_send_it_means_the_model(
        adapter_id: str | None) -> None:
    request, _ = tgi_request({"max_new_tokens": 2, "adapter_id": adapter_id})
    assert params(request) == {"max_new_tokens": 2, "logprobs": True}


def test_tgi_request_translates_parameters() -> None:
    request, options = tgi_request({
        "max_new_tokens": 20, "temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 3,
        "stop": ["\n"], "repetition_penalty": 1.1, "do_sample": True, "details": True,
        "decoder_input_details": True, "top_n_tokens": 2, "return_full_text": True,
        "truncate": 100, "watermark": False, "typical_p": 0.95, "frequency_penalty": 0.1,
        "grammar": None, "adapter_id": None})
    assert request.text == "Hello" and request.model_name == ""
    assert params(request) == {
        "max_new_tokens": 20, "temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 3,
        "stop": ["\n"], "repetition_penalty": 1.1, "do_sample": True,
        "prompt_logprobs": True, "top_logprobs": 2, "logprobs": True, "truncate": 100,
        "typical_p": 0.95, "frequency_penalty": 0.1}
    assert options.details and options.prompt_details and options.return_full_text
    assert (options.top_n_tokens, options.best_of, options.inputs, options.stream) == \
        (2, 1, "Hello", False)


def test_tgi_request_without_parameters_samples() -> None:
    request, options = tgi_request(None)
    assert params(request) == {"do_sample": True, "logprobs": True}
    assert not options.details and not options.return_full_text and options.top_n_tokens == 0


def test_tgi_request_with_empty_parameters_leaves_sampling_to_the_server() -> None:
    request, _ = tgi_request({})
    assert params(request) == {"logprobs": True}


def test_tgi_best_of_asks_for_every_sequence() -> None:
    request, options = tgi_request({"best_of": 3, "do_sample": True})
    assert params(request)["n"] == 3
    assert "best_of" not in params(request)
    assert options.best_of == 3


def test_tgi_best_of_without_sampling_is_refused_by_the_server_naming_best_of() -> None:
    request, _ = tgi_request({"best_of": 2})
    assert params(request)["n"] == 2 and "do_sample" not in params(request)
    # The server refuses n > 1 without sampling; the client reads TGI's field.
    field, _ = field_in_protocol("n", "several sequences need sampling (do_sample)", tgi.NAMES)
    assert field == "best_of"


def test_tgi_server_error_about_n_names_best_of() -> None:
    field, _ = field_in_protocol("n", "must be in [1, 16]; got 20", tgi.NAMES)
    assert field == "best_of"


@pytest.mark.parametrize("parameters, stream, field", [
    ({"best_of": 2, "do_sample": True}, True, "best_of"),
    ({"decoder_input_details": True}, True, "decoder_input_details"),
])
def test_tgi_streaming_refuses_what_it_cannot_stream(parameters, stream, field) -> None:
    assert refused(tgi_request, parameters, stream).field == field


def test_tgi_stream_decided_by_the_body_on_post_root() -> None:
    _, options = tgi_request(None, None, stream=True)
    assert options.stream is True
    _, options = tgi_request(None, None)
    assert options.stream is False
    # The route decides over the body.
    _, options = tgi_request(None, True, stream=False)
    assert options.stream is True
    assert refused(tgi_request, None, None, stream="yes").field == "stream"


@pytest.mark.parametrize("document, field", [
    ({"parameters": {}}, "inputs"),
    ({"inputs": 5}, "inputs"),
    ({"inputs": ["a"]}, "inputs"),
    ({"inputs": None}, "inputs"),
    ({"inputs": "x", "parameters": "greedy"}, "parameters"),
    ({"inputs": "x", "parameters": {"grammar": {"type": "xml", "value": "<a/>"}}},
     "grammar.type"),
    ({"inputs": "x", "parameters": {"adapter_id": "lora-1"}}, "adapter_id"),
    ({"inputs": "x", "parameters": {"max_tokens": 5}}, "max_tokens"),
    ({"inputs": "x", "parameters": {"details": "yes"}}, "details"),
    ({"inputs": "x", "parameters": {"top_n_tokens": "2"}}, "top_n_tokens"),
    ({"inputs": "x", "parameters": {"best_of": True}}, "best_of"),
    ({"inputs": "x", "parameters": {"return_full_text": 1}}, "return_full_text"),
], ids=["no-inputs", "number", "list", "null", "parameters-string", "grammar", "adapter",
        "unknown", "details-string", "top-n-string", "best-of-bool", "full-text-int"])
def test_tgi_request_refusals_name_the_field(document, field) -> None:
    error = refused(tgi.generate_request_to_pb, document, False)
    assert error.field == field
    assert error.message.startswith(f"{field}: ")


def test_tgi_refuses_a_body_that_is_not_an_object() -> None:
    assert refused(tgi.generate_request_to_pb, ["Hello"], False).field == "the body"


@pytest.mark.parametrize("document, expected", [
    ({"inputs": "x"}, True),
    ({"prompt": "x"}, False),
    ({"prompt": "x", "inputs": "y"}, True),
    ({}, True),
    ([], True),
    ("prompt", True),
])
def test_is_tgi(document, expected) -> None:
    assert tgi.is_tgi(document) is expected


# --- TGI: replies ------------------------------------------------------------------------------

def test_tgi_reply_without_details_has_only_the_text() -> None:
    _, options = tgi_request({"max_new_tokens": 2})
    generation = generation_of(response(0, "Hi", [token(5, "Hi", -0.5)]),
                               response(0, "!", [token(6, "!", -0.1)], finish="length",
                                        generated=2))
    assert tgi.reply(generation, options) == {"generated_text": "Hi!"}


def test_tgi_reply_with_details_prefill_and_top_tokens() -> None:
    _, options = tgi_request({"details": True, "decoder_input_details": True,
                              "top_n_tokens": 1, "seed": 42})
    prompt = [token(1, "<s>", special=True), token(15, "Hello", -3.5)]
    first = token(5, " world", -0.5, top=[token(5, " world", -0.5)])
    second = token(2, "</s>", -0.25, special=True, top=[token(2, "</s>", -0.25, special=True)])
    generation = generation_of(
        response(0, " world", [first], prompt=prompt, prompt_tokens=2, seed=42),
        response(0, "", [second], finish="eos_token", prompt_tokens=2, generated=2, seed=42))
    assert tgi.reply(generation, options) == {
        "generated_text": " world",
        "details": {
            "finish_reason": "eos_token", "generated_tokens": 2, "seed": 42, "prompt_tokens": 2,
            # The prompt's first token has no log-probability.
            "prefill": [{"id": 1, "text": "<s>", "logprob": None},
                        {"id": 15, "text": "Hello", "logprob": -3.5}],
            "tokens": [{"id": 5, "text": " world", "logprob": -0.5, "special": False},
                       {"id": 2, "text": "</s>", "logprob": -0.25, "special": True}],
            "top_tokens": [[{"id": 5, "text": " world", "logprob": -0.5, "special": False}],
                           [{"id": 2, "text": "</s>", "logprob": -0.25, "special": True}]],
        }}


def test_tgi_reply_details_without_prompt_details_have_an_empty_prefill() -> None:
    _, options = tgi_request({"details": True})
    generation = generation_of(response(0, "a", [token(3, "a", -1.0)], finish="length"))
    details = tgi.reply(generation, options)["details"]
    assert details["prefill"] == []
    assert "top_tokens" not in details
    assert "best_of_sequences" not in details


def test_tgi_reply_return_full_text_prefixes_the_inputs() -> None:
    _, options = tgi_request({"return_full_text": True})
    generation = generation_of(response(0, " there", [token(3, " there", -1.0)], finish="length"))
    assert tgi.reply(generation, options)["generated_text"] == "Hello there"


def test_tgi_reply_best_of_answers_with_the_most_likely_sequence() -> None:
    _, options = tgi_request({"best_of": 3, "do_sample": True, "details": True,
                              "return_full_text": True})
    generation = generation_of(
        response(0, " a", [token(1, " a", -1.0), token(2, "", -2.0)], finish="length",
                 generated=2, seed=10),
        response(1, " b", [token(3, " b", -0.5), token(4, "", -0.25)], finish="eos_token",
                 generated=2, seed=11),
        response(2, " c", [token(5, " c", -0.75), token(6, "", -1.0)], finish="length",
                 generated=2, seed=12))
    reply = tgi.reply(generation, options)
    assert reply["generated_text"] == "Hello b"
    details = reply["details"]
    assert (details["finish_reason"], details["seed"]) == ("eos_token", 11)
    others = details["best_of_sequences"]
    # The others, most likely first, each with its own text and details.
    assert [(o["generated_text"], o["seed"], o["finish_reason"]) for o in others] == \
        [("Hello c", 12, "length"), ("Hello a", 10, "length")]
    assert [t["id"] for t in others[1]["tokens"]] == [1, 2]
    assert all(o["generated_tokens"] == 2 and o["prefill"] == [] for o in others)


def test_tgi_reply_best_of_without_details_has_no_details() -> None:
    _, options = tgi_request({"best_of": 2, "do_sample": True})
    generation = generation_of(response(0, "x", [token(1, "x", -3.0)], finish="length"),
                               response(1, "y", [token(2, "y", -1.0)], finish="length"))
    assert tgi.reply(generation, options) == {"generated_text": "y"}


def test_tgi_stream_events_carry_the_text_and_details_on_the_last() -> None:
    _, options = tgi_request({"details": True, "return_full_text": True}, True)
    generation = Generation()
    events = []
    for item in (response(0, " wor", [token(7, " wor", -0.5)], prompt_tokens=4, seed=9),
                 response(0, "ld", [token(8, "ld", -0.25, special=False)], prompt_tokens=4,
                          generated=2, seed=9),
                 response(0, "", [token(2, "</s>", -0.125, special=True)], finish="eos_token",
                          prompt_tokens=4, generated=3, seed=9)):
        generation.add(item)
        events.append(tgi.stream_event(item, generation, options))
    assert events[0]["token"] == {"id": 7, "text": " wor", "logprob": -0.5, "special": False}
    assert [(e["generated_text"], e["details"]) for e in events[:2]] == [(None, None)] * 2
    assert events[2]["token"] == {"id": 2, "text": "</s>", "logprob": -0.125, "special": True}
    assert events[2]["generated_text"] == "Hello world"
    assert events[2]["details"] == {"finish_reason": "eos_token", "generated_tokens": 3,
                                    "seed": 9, "prompt_tokens": 4, "input_length": 4}
    assert all("top_tokens" not in e for e in events)


def test_tgi_stream_event_top_tokens_with_top_n_tokens() -> None:
    _, options = tgi_request({"top_n_tokens": 2}, True)
    item = response(0, "a", [token(3, "a", -0.5, top=[token(3, "a", -0.5), token(4, "b", -1.5)])])
    event = tgi.stream_event(item, generation_of(item), options)
    assert event["top_tokens"] == [{"id": 3, "text": "a", "logprob": -0.5, "special": False},
                                   {"id": 4, "text": "b", "logprob": -1.5, "special": False}]


def test_tgi_stream_event_token_without_logprob_is_null() -> None:
    _, options = tgi_request(None, True)
    item = response(0, "a", [token(3, "a")])
    assert tgi.stream_event(item, generation_of(item), options)["token"]["logprob"] is None


def test_tgi_stream_event_index_counts_the_tokens() -> None:
    _, options = tgi_request(None, True)
    generation = Generation()
    indexes = []
    for item in (response(0, "a", [token(1, "a", -1.0)]),
                 response(0, "b", [token(2, "b", -1.0)], finish="length", generated=2)):
        generation.add(item)
        indexes.append(tgi.stream_event(item, generation, options)["index"])
    assert indexes == [1, 2]


def split_character_responses() -> list[sb.GenerateResponse]:
    """"是一家" where "家" spans two byte tokens: each token decoded alone is U+FFFD, and the
    server's text comes whole with the token that completes the character."""
    return [response(0, "是", [token(10, "是", -0.5)], seed=9),
            response(0, "一", [token(11, "一", -0.5)], generated=2, seed=9),
            response(0, "", [token(12, "\ufffd", -0.25)], generated=3, seed=9),
            response(0, "家", [token(13, "\ufffd", -0.125)], generated=4, seed=9),
            response(0, "", [token(2, "</s>", -0.5, special=True)], finish="eos_token",
                     generated=5, seed=9)]


def test_tgi_stream_token_texts_join_into_the_generated_text_across_a_split_character() -> None:
    """As TGI's decode_token: a token that ends mid-character has the text "", the one that
    completes it the whole character; a special token keeps its own text."""
    _, options = tgi_request({"details": True}, True)
    generation = Generation()
    events = []
    for item in split_character_responses():
        generation.add(item)
        events.append(tgi.stream_event(item, generation, options))
    texts = [event["token"]["text"] for event in events]
    assert texts == ["是", "一", "", "家", "</s>"]
    assert "".join(texts[:-1]) == events[-1]["generated_text"] == "是一家"
    assert [(e["token"]["id"], e["token"]["logprob"], e["token"]["special"]) for e in events] \
        == [(10, -0.5, False), (11, -0.5, False), (12, -0.25, False), (13, -0.125, False),
            (2, -0.5, True)]


def test_tgi_reply_token_texts_join_into_the_generated_text_across_a_split_character() -> None:
    _, options = tgi_request({"best_of": 2, "do_sample": True, "details": True,
                              "top_n_tokens": 1})
    other = response(1, "x", [token(20, "x", -9.0, top=[token(12, "\ufffd", -0.5)])],
                     finish="length", seed=10)
    reply = tgi.reply(generation_of(*split_character_responses(), other), options)
    details = reply["details"]
    texts = [t["text"] for t in details["tokens"]]
    assert texts == ["是", "一", "", "家", "</s>"]
    assert "".join(texts[:-1]) == reply["generated_text"] == "是一家"
    assert [t["id"] for t in details["tokens"]] == [10, 11, 12, 13, 2]
    assert [t["special"] for t in details["tokens"]] == [False] * 4 + [True]
    # The other sequences' tokens too; the alternatives stay each token decoded alone.
    [best_of] = details["best_of_sequences"]
    assert [t["text"] for t in best_of["tokens"]] == ["x"]
    assert details["top_tokens"] == [[]] * 5
    assert tgi.reply(generation_of(other), options)["details"]["top_tokens"] == \
        [[{"id": 12, "text": "\ufffd", "logprob": -0.5, "special": False}]]


def stopped_by_ari() -> list[sb.GenerateResponse]:
    """" The Paris" with stop ["ari"]: the server's text holds back 2 characters that could
    start "ari", and ends where "ari" does (before it by default); the decoded texts are the
    tokens' own."""
    return [response(0, " T", [token(3, " The", -0.1)], decoded=" The"),
            response(0, "he P", [token(7042, " Paris", -0.2)], decoded=" Paris", generated=2,
                     finish="stop_sequence")]


def test_tgi_token_texts_and_generated_text_are_not_held_back_or_cut_by_a_stop_sequence() -> None:
    """TGI's token texts are the tokens' decoded texts, and its generated text all of them:
    a stop sequence ends generation without cutting the token that completes it."""
    _, options = tgi_request({"details": True, "stop": ["ari"]}, route_stream=True)
    generation = Generation()
    events = []
    for item in stopped_by_ari():
        generation.add(item)
        events.append(tgi.stream_event(item, generation, options))
    assert [event["token"]["text"] for event in events] == [" The", " Paris"]
    assert events[-1]["generated_text"] == " The Paris"
    _, options = tgi_request({"details": True, "stop": ["ari"]})
    reply = tgi.reply(generation_of(*stopped_by_ari()), options)
    assert [t["text"] for t in reply["details"]["tokens"]] == [" The", " Paris"]
    assert reply["generated_text"] == " The Paris"


def test_tgi_reply_text_of_a_response_without_tokens_joins_the_last_tokens() -> None:
    """A request stopped early ends with a response that has text but no token."""
    _, options = tgi_request({"details": True})
    reply = tgi.reply(generation_of(response(0, "", [token(12, "\ufffd", -0.25)]),
                                    response(0, "家", [token(13, "\ufffd", -0.125)], generated=2),
                                    response(0, "!", [], finish="stopped", generated=2)), options)
    assert [t["text"] for t in reply["details"]["tokens"]] == ["", "家!"]
    assert reply["generated_text"] == "家!"


def test_tgi_best_of_with_a_seed_is_refused_naming_best_of() -> None:
    """TGI: "`seed` must not be set when `best_of` > 1" (a validation error)."""
    error = refused(tgi_request, {"best_of": 2, "do_sample": True, "seed": 3})
    assert error.field == "best_of"
    assert error.message == ("best_of: must be 1 when a seed is set (TGI: `seed` must not be "
                             "set when `best_of` > 1)")
    request, _ = tgi_request({"best_of": 1, "seed": 3})
    assert params(request)["seed"] == 3


@pytest.mark.parametrize("status, error_type", [
    (400, "validation"), (413, "validation"), (422, "validation"), (429, "overloaded"),
    (424, "generation"), (503, "healthcheck"), (504, "timeout"), (404, "not_found"),
    (500, "generation")])
def test_tgi_error_body(status: int, error_type: str) -> None:
    assert tgi.error_body(status, "inputs: must be a string") == \
        {"error": "inputs: must be a string", "error_type": error_type}


def test_tgi_info_json_from_the_models_limits() -> None:
    info = tgi.info_json("smollm2", {"max_seq_len": "2048", "max_input_len": "1024",
                                     "max_sequences": "4", "dtype": "bfloat16",
                                     "device": "cuda", "max_running_requests": "200",
                                     "max_waiting_requests": "1000"}, "1.2.3")
    assert (info["model_id"], info["version"], info["router"]) == ("smollm2", "1.2.3",
                                                                   "switchboard")
    assert (info["max_total_tokens"], info["max_input_tokens"], info["max_input_length"],
            info["max_best_of"]) == (2048, 1024, 1024, 4)
    assert info["max_stop_sequences"] is None
    assert (info["max_concurrent_requests"], info["validation_workers"]) == (1200, 1)
    assert info["max_client_batch_size"] == 1
    assert info["model_pipeline_tag"] == "text-generation"
    assert (info["model_dtype"], info["model_device_type"]) == ("bfloat16", "cuda")


# --- OpenAI: chat requests ---------------------------------------------------------------------

def test_chat_request_translates_messages_and_parameters() -> None:
    calls, options = openai.chat_request_to_pb({
        "model": "smollm2",
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                  {"type": "text", "text": "there"}]},
                     {"role": "assistant", "content": None}],
        "temperature": 0.5, "top_p": 0.9, "n": 2, "stop": ["\n"], "seed": 1, "max_tokens": 30,
        "logprobs": True, "top_logprobs": 3, "user": "u-1", "min_tokens": 2,
        "presence_penalty": 0.5, "min_p": 0.05})
    (call,) = calls
    request = call.request
    assert call.prompt_text is None
    assert request.model_name == "smollm2"
    assert [(m.role, m.content) for m in request.messages.messages] == \
        [("system", "Be brief."), ("user", "Hi\nthere"), ("assistant", "")]
    assert params(request) == {"temperature": 0.5, "do_sample": True, "top_p": 0.9, "n": 2,
                               "stop": ["\n"], "seed": 1, "max_new_tokens": 30,
                               "logprobs": True, "top_logprobs": 3, "min_new_tokens": 2,
                               "presence_penalty": 0.5, "min_p": 0.05}
    assert (options.kind, options.model, options.n, options.logprobs, options.stream,
            options.echo) == ("chat.completion", "smollm2", 2, True, False, False)
    assert options.response_id.startswith("chatcmpl-")



@pytest.mark.parametrize("translate", [chat, completion], ids=["chat", "completion"])
def test_tgis_placeholder_model_names_mean_the_served_model(translate) -> None:
    for placeholder in ("tgi", "dummy"):
        [call], options = translate(model=placeholder)
        assert (call.request.model_name, options.model) == ("", "")
    [call], options = translate(model="gpt-4")
    assert (call.request.model_name, options.model) == ("gpt-4", "gpt-4")


def test_chat_temperature_zero_is_greedy() -> None:
    values = chat_params(temperature=0)
    assert values["do_sample"] is False
    assert "temperature" not in values


def test_chat_without_temperature_samples() -> None:
    assert chat_params()["do_sample"] is True


def test_chat_max_completion_tokens_wins_over_max_tokens() -> None:
    assert chat_params(max_completion_tokens=5, max_tokens=50)["max_new_tokens"] == 5
    assert chat_params(max_tokens=50)["max_new_tokens"] == 50


def test_chat_without_max_tokens_asks_for_what_the_server_allows() -> None:
    assert chat_params()["max_new_tokens"] == openai.UNLIMITED == 2**31 - 1


def test_chat_max_tokens_zero_is_not_unlimited() -> None:
    try:
        values = chat_params(max_tokens=0)
    except RequestError as error:
        assert error.field == "max_tokens"
    else:
        assert values["max_new_tokens"] == 0


@pytest.mark.parametrize("fields, field", [
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_completion_tokens": 1.5}, "max_completion_tokens"),
    ({"tools": [{"type": "function", "function": {"description": "f"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"logit_bias": [1]}, "logit_bias"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"echo": True}, "echo"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": "yes"}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "include_usage"),
    ({"logprobs": 1}, "logprobs"),
    ({"model": 7}, "model"),
], ids=["max-string", "max-float", "tool-without-name", "parameters-not-object",
        "tool-choice", "response-format", "logit-bias",
        "unknown", "functions", "completions-only", "options-without-stream", "options-stream-false",
        "options-string", "include-usage-int", "logprobs-int", "model-int"])
def test_chat_refusals_name_the_field(fields, field) -> None:
    assert refused(chat, **fields).field == field


@pytest.mark.parametrize("translate", [chat, completion], ids=["chat", "completion"])
def test_vllms_token_extras_travel_under_the_servers_names(translate) -> None:
    [call], _ = translate(allowed_token_ids=[5, 7], include_stop_str_in_output=True,
                          truncate_prompt_tokens=100)
    assert {name: value for name, value in params(call.request).items()
            if name in ("allowed_token_ids", "include_stop_str_in_output", "truncate")} == {
        "allowed_token_ids": [5, 7], "include_stop_str_in_output": True, "truncate": 100}


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


@pytest.mark.parametrize("response_format, expected", [
    ({"type": "json_object"}, {"guided_json": {"type": "object"}}),
    ({"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}},
     {"guided_json": SCHEMA}),
    ({"type": "json", "value": SCHEMA}, {"guided_json": SCHEMA}),  # TGI's chat form
    ({"type": "regex", "value": "[0-9]+"}, {"guided_regex": "[0-9]+"}),
    ({"type": "text"}, {}),
], ids=["json-object", "json-schema", "tgi-json", "tgi-regex", "text"])
@pytest.mark.parametrize("translate", [chat, completion], ids=["chat", "completion"])
def test_response_format_travels_as_the_servers_pattern_parameter(
        translate, response_format, expected) -> None:
    [call], _ = translate(response_format=response_format)
    carried = {name: value for name, value in params(call.request).items()
               if name.startswith("guided_")}
    assert {name: json.loads(value) if name == "guided_json" else value
            for name, value in carried.items()} == expected


def test_vllms_guided_extras_travel_as_they_are() -> None:
    for field, value, sent in [("guided_choice", ["yes", "no"], ["yes", "no"]),
                               ("guided_regex", "a+", "a+"),
                               ("guided_json", SCHEMA, json.dumps(SCHEMA))]:
        [call], _ = chat(**{field: value})
        assert params(call.request)[field] == sent


def test_two_output_patterns_are_refused_naming_one_with_the_other() -> None:
    error = refused(chat, guided_choice=["yes", "no"], guided_regex="a+")
    other = ({"guided_choice", "guided_regex"} - {error.field}).pop()
    assert error.message.startswith(f"{error.field}: cannot be combined with {other}")


@pytest.mark.parametrize("structured_outputs, expected", [
    ({"json": SCHEMA}, {"guided_json": SCHEMA}),
    ({"regex": "a+", "grammar": None}, {"guided_regex": "a+"}),
    ({"choice": ["yes", "no"]}, {"guided_choice": ["yes", "no"]}),
    ({"json_object": True}, {"guided_json": {"type": "object"}}),
], ids=["json", "regex", "choice", "json-object"])
@pytest.mark.parametrize("translate", [chat, completion], ids=["chat", "completion"])
def test_vllms_structured_outputs_travel_as_the_servers_pattern_parameter(
        translate, structured_outputs, expected) -> None:
    """vLLM's current field; its guided_* fields were removed in v0.12."""
    [call], _ = translate(structured_outputs=structured_outputs)
    assert {name: json.loads(value) if name == "guided_json" else value
            for name, value in params(call.request).items()
            if name.startswith("guided_")} == expected


@pytest.mark.parametrize("fields, field", [
    ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs"),
    ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object"),
    ({"structured_outputs": {"regex": "a"}, "guided_regex": "b"}, "structured_outputs.regex"),
    ({"structured_outputs": "json"}, "structured_outputs"),
], ids=["grammar", "two", "json-object-false", "twice", "not-object"])
def test_structured_outputs_refusals_name_the_field(fields, field) -> None:
    assert refused(chat, **fields).field == field


@pytest.mark.parametrize("fields", [
    {"reasoning_effort": None, "verbosity": "low", "prediction": {"type": "content",
                                                                  "content": "x"}},
    {"modalities": ["text"], "audio": None, "web_search_options": None, "functions": [],
     "function_call": "none"},
    {"use_beam_search": False, "length_penalty": 1, "spaces_between_special_tokens": True,
     "priority": 0, "cache_salt": None, "vllm_xargs": None, "bad_words": [],
     "guided_decoding_backend": "xgrammar"},
    {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"},
], ids=["openai-hints", "openai-neutral", "vllm-neutral", "tools-with-none"])
def test_fields_that_change_nothing_here_are_accepted(fields) -> None:
    """As SDKs, frameworks and vLLM's own clients send them: they translate as if absent."""
    [call], _ = chat(**fields)
    [plain], _ = chat()
    assert params(call.request) == params(plain.request)


@pytest.mark.parametrize("fields, field", [
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"use_beam_search": 0}, "use_beam_search"),
    ({"cache_salt": "tenant-a"}, "cache_salt"),
    ({"bad_words": ["x"]}, "bad_words"),
    ({"priority": -1}, "priority"),
], ids=["audio-out", "beam", "beam-int", "cache-salt", "bad-words", "priority"])
def test_fields_with_an_effect_not_supported_are_refused(fields, field) -> None:
    error = refused(chat, **fields)
    assert error.field == field and "is not supported: only null" in error.message


@pytest.mark.parametrize("grammar, expected", [
    ({"type": "json", "value": SCHEMA}, {"guided_json": SCHEMA}),
    ({"type": "json", "value": json.dumps(SCHEMA)}, {"guided_json": json.dumps(SCHEMA)}),
    ({"type": "regex", "value": "(yes|no)"}, {"guided_regex": "(yes|no)"}),
    ({"type": "json_schema", "value": {"name": "c", "schema": SCHEMA}}, {"guided_json": SCHEMA}),
], ids=["json", "json-text", "regex", "json-schema"])
def test_tgis_grammar_travels_as_the_servers_pattern_parameter(grammar, expected) -> None:
    request, _ = tgi.generate_request_to_pb({"inputs": "x", "parameters": {"grammar": grammar}},
                                            False)
    carried = {name: value for name, value in params(request).items()
               if name.startswith("guided_")}
    # An object travels as JSON text; a schema given as text travels as that text.
    assert {name: json.loads(value) if name == "guided_json" and isinstance(
        expected[name], dict) else value for name, value in carried.items()} == expected


@pytest.mark.parametrize("grammar, field", [
    ("json", "grammar"),
    ({"type": "json"}, "grammar.value"),
    ({"type": "json_schema", "value": {"name": "c"}}, "grammar.value.schema"),
], ids=["not-object", "no-value", "no-schema"])
def test_tgi_grammar_refusals_name_the_field(grammar, field) -> None:
    error = refused(tgi.generate_request_to_pb, {"inputs": "x", "parameters": {
        "grammar": grammar}}, False)
    assert error.field == field


def test_logit_bias_travels_as_a_map_of_token_ids() -> None:
    calls, _ = chat(logit_bias={"50256": -100, "7": 2.5})
    assert dict(calls[0].request.sampling.logit_bias) == {50256: -100, 7: 2.5}
    calls, _ = completion(logit_bias={"7": 1})
    assert dict(calls[0].request.sampling.logit_bias) == {7: 1}


def test_chat_accepts_what_means_no_tools_and_plain_text() -> None:
    calls, _ = chat(tools=[], tool_choice="none", response_format={"type": "text"},
                    logit_bias={}, user="me", metadata={"k": "v"}, store=False)
    assert calls[0].request.WhichOneof("prompt") == "messages"


@pytest.mark.parametrize("messages, field", [
    (None, "messages"),
    ("Hi", "messages"),
    ({"role": "user", "content": "Hi"}, "messages"),
    (["Hi"], "messages[0]"),
    ([USER, {"content": "x"}], "messages[1].role"),
    ([{"role": 1, "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": {"type": "text"}}], "messages[0].content"),
    ([USER, {"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[1].content[1]"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}],
     "messages[0].content[0].text"),
    ([{"role": "user", "content": ["Hi"]}], "messages[0].content[0]"),
], ids=["missing", "string", "object", "message-string", "no-role", "role-int", "content-int",
        "content-object", "image-part", "text-not-string", "part-string"])
def test_chat_messages_refusals_name_the_message(messages, field) -> None:
    document = {} if messages is None else {"messages": messages}
    error = refused(openai.chat_request_to_pb, document)
    assert error.field == field
    assert error.message.startswith(f"{field}: ")


def test_chat_with_no_messages_sends_an_empty_conversation_for_the_server_to_refuse() -> None:
    [call], _ = openai.chat_request_to_pb({"messages": []})
    assert call.request.WhichOneof("prompt") == "messages"
    assert not call.request.messages.messages


def test_chat_stream_options() -> None:
    _, options = chat(stream=True, stream_options={"include_usage": True})
    assert options.stream and options.include_usage
    _, options = chat(stream=True)
    assert options.stream and not options.include_usage


# --- OpenAI: completion requests ---------------------------------------------------------------

def test_completion_request_defaults() -> None:
    calls, options = completion()
    (call,) = calls
    assert call.request.text == "Once" and call.prompt_text == "Once"
    assert params(call.request) == {"max_new_tokens": 16, "do_sample": True}
    assert (options.kind, options.logprobs, options.echo, options.n) == \
        ("text_completion", False, False, 1)
    assert options.response_id.startswith("cmpl-")


@pytest.mark.parametrize("prompt, expected", [
    ("Once", [("text", "Once")]),
    (["a", "b"], [("text", "a"), ("text", "b")]),
    ([1, 2, 3], [("token_ids", [1, 2, 3])]),
    ([[1, 2], [3]], [("token_ids", [1, 2]), ("token_ids", [3])]),
    (["a", [4, 5]], [("text", "a"), ("token_ids", [4, 5])]),
], ids=["string", "strings", "ids", "lists-of-ids", "mixed"])
def test_completion_prompt_forms_make_one_call_each(prompt, expected) -> None:
    calls, _ = completion(prompt=prompt)
    got = []
    for call in calls:
        kind = call.request.WhichOneof("prompt")
        ids = list(call.request.token_ids.ids)
        got.append((kind, call.request.text if kind == "text" else ids))
        assert call.prompt_text == (call.request.text if kind == "text" else None)
    assert got == expected


@pytest.mark.parametrize("prompt", [None, 5, [], [[]], [True, 1], ["a", 5], [[1], [None]], {}],
                         ids=["null", "number", "empty", "empty-ids", "bool-id", "string-number",
                              "null-id", "object"])
def test_completion_bad_prompt_is_refused(prompt) -> None:
    document = {} if prompt is None else {"prompt": prompt}
    assert refused(openai.completion_request_to_pb, document).field == "prompt"


@pytest.mark.parametrize("fields, field", [
    ({"suffix": "end"}, "suffix"),
    ({"messages": [USER]}, "messages"),
    ({"max_completion_tokens": 5}, "max_completion_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"logit_bias": "1"}, "logit_bias"),
    ({"echo": "yes"}, "echo"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_completion_refusals_name_the_field(fields, field) -> None:
    assert refused(completion, **fields).field == field


def test_completion_logprobs_count_asks_for_logprobs_and_alternatives() -> None:
    calls, options = completion(logprobs=2, max_tokens=4, best_of=3, n=2, temperature=0.8)
    assert params(calls[0].request) == {"max_new_tokens": 4, "logprobs": True, "top_logprobs": 2,
                                        "best_of": 3, "n": 2, "temperature": 0.8,
                                        "do_sample": True}
    assert options.logprobs and options.n == 2


def test_completion_logprobs_zero_still_asks_for_logprobs() -> None:
    calls, options = completion(logprobs=0)
    assert params(calls[0].request)["logprobs"] is True
    assert params(calls[0].request)["top_logprobs"] == 0
    assert options.logprobs


def test_completion_echo_of_token_ids_asks_for_the_prompts_tokens() -> None:
    calls, options = completion(prompt=["text", [7, 8]], echo=True)
    assert "prompt_logprobs" not in params(calls[0].request)  # its text is known
    assert params(calls[1].request)["prompt_logprobs"] is True
    assert options.echo
    calls, _ = completion(prompt=[7, 8])
    assert "prompt_logprobs" not in params(calls[0].request)


def test_completion_temperature_zero_is_greedy() -> None:
    calls, _ = completion(temperature=0)
    values = params(calls[0].request)
    assert values["do_sample"] is False and "temperature" not in values


def test_completion_max_tokens_zero_is_not_sixteen() -> None:
    try:
        calls, _ = completion(max_tokens=0)
    except RequestError as error:
        assert error.field == "max_tokens"
    else:
        assert params(calls[0].request)["max_new_tokens"] == 0


# --- OpenAI: replies ---------------------------------------------------------------------------

def test_chat_reply_shape() -> None:
    calls, options = chat(model="smollm2", n=2, logprobs=True, top_logprobs=1)
    generation = generation_of(
        response(0, "é", [token(5, "é", -0.5, top=[token(5, "é", -0.5)])], prompt_tokens=6,
                 cached=2),
        response(1, "no", [token(6, "no", -1.5, top=[token(7, "yes", -0.25)])], finish="length",
                 prompt_tokens=6, cached=2),
        response(0, "", [token(2, "</s>", -0.125)], finish="eos_token", generated=2,
                 prompt_tokens=6, cached=2))
    reply = openai.reply(calls, [generation], options)
    assert reply["object"] == "chat.completion"
    assert reply["id"] == options.response_id and reply["model"] == "smollm2"
    assert reply["created"] == options.created
    assert reply["system_fingerprint"] == openai.SYSTEM_FINGERPRINT
    first, second = reply["choices"]
    assert first == {
        "index": 0, "message": {"role": "assistant", "content": "é", "refusal": None},
        "finish_reason": "stop",
        "logprobs": {"content": [
            {"token": "é", "logprob": -0.5, "bytes": [195, 169],
             "top_logprobs": [{"token": "é", "logprob": -0.5, "bytes": [195, 169]}]},
            {"token": "</s>", "logprob": -0.125, "bytes": list(b"</s>"), "top_logprobs": []}]}}
    assert (second["index"], second["message"]["content"], second["finish_reason"]) == \
        (1, "no", "length")
    assert second["logprobs"]["content"][0]["top_logprobs"] == \
        [{"token": "yes", "logprob": -0.25, "bytes": list(b"yes")}]
    assert reply["usage"] == {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9,
                              "prompt_tokens_details": {"cached_tokens": 2}}


def test_chat_reply_without_logprobs_and_stop_reasons() -> None:
    calls, options = chat(n=3)
    generation = generation_of(response(0, "a", finish="stop_sequence"),
                               response(1, "b", finish="stopped"),
                               response(2, "c", finish="eos_token"))
    choices = openai.reply(calls, [generation], options)["choices"]
    assert [c["finish_reason"] for c in choices] == ["stop", "stop", "stop"]
    assert all(c["logprobs"] is None for c in choices)


def test_completion_reply_indexes_choices_per_prompt_and_sequence() -> None:
    calls, options = completion(prompt=["A", "B"], n=2)
    generations = [
        generation_of(response(1, "a1", finish="length", prompt_tokens=1, generated=1),
                      response(0, "a0", finish="eos_token", prompt_tokens=1, generated=1)),
        generation_of(response(0, "b0", finish="length", prompt_tokens=2, generated=3),
                      response(1, "b1", finish="stop_sequence", prompt_tokens=2, generated=4,
                               cached=1)),
    ]
    reply = openai.reply(calls, generations, options)
    assert reply["object"] == "text_completion"
    assert [(c["index"], c["text"], c["finish_reason"], c["logprobs"])
            for c in reply["choices"]] == [(0, "a0", "stop", None), (1, "a1", "length", None),
                                           (2, "b0", "length", None), (3, "b1", "stop", None)]
    assert reply["usage"] == {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12,
                              "prompt_tokens_details": {"cached_tokens": 1}}


ECHOED_PROMPT = [token(1, "S"), token(2, "ay", -3.5, top=[token(7, "ome", -0.5)])]


def test_completion_reply_logprobs_with_echo_lead_with_the_prompts() -> None:
    calls, options = completion(prompt="Say", echo=True, logprobs=1)
    generation = generation_of(
        response(0, " hé", [token(5, " h", -0.5, top=[token(5, " h", -0.5)]),
                            token(6, "é", -1.0, top=[token(9, "e", -0.75)])],
                 finish="length", generated=2, prompt=ECHOED_PROMPT))
    (choice,) = openai.reply(calls, [generation], options)["choices"]
    assert choice["text"] == "Say hé"
    # As vLLM: the prompt's tokens first, the first without a logprob; each position's
    # alternatives and its own token; offsets in characters.
    assert choice["logprobs"] == {
        "tokens": ["S", "ay", " h", "é"], "token_logprobs": [None, -3.5, -0.5, -1.0],
        "top_logprobs": [None, {"ome": -0.5, "ay": -3.5}, {" h": -0.5},
                         {"e": -0.75, "é": -1.0}],
        "text_offset": [0, 1, 3, 5]}


def test_completion_echo_with_logprobs_asks_for_the_prompts_logprobs() -> None:
    calls, _ = completion(prompt=["text", [7, 8]], echo=True, logprobs=0)
    assert [params(call.request)["prompt_logprobs"] for call in calls] == [True, True]
    calls, _ = completion(prompt="text", logprobs=0)
    assert "prompt_logprobs" not in params(calls[0].request)


def test_completion_echo_with_no_tokens_replies_with_the_prompt_alone() -> None:
    calls, options = completion(prompt="Say", echo=True, logprobs=0, max_tokens=0)
    # vLLM's rule: one token is generated, and left out.
    assert calls[0].request.sampling.max_new_tokens == 1
    generation = generation_of(response(0, "!", [token(3, "!", -0.25)], finish="eos_token",
                                        prompt=ECHOED_PROMPT))
    (choice,) = openai.reply(calls, [generation], options)["choices"]
    assert (choice["text"], choice["finish_reason"]) == ("Say", "length")
    assert choice["logprobs"] == {"tokens": ["S", "ay"], "token_logprobs": [None, -3.5],
                                  "top_logprobs": [None, {"ome": -0.5, "ay": -3.5}],
                                  "text_offset": [0, 1]}
    streamed = openai.chunk(options, 0, delta_text="Say", prompt=ECHOED_PROMPT)
    assert streamed["choices"][0]["logprobs"] == choice["logprobs"]



def test_completion_reply_logprobs_without_alternatives_or_logprob() -> None:
    """logprobs 0: each token is its own top alternative, as vLLM's (clients take the max of
    them); a token without a logprob has none."""
    calls, options = completion(logprobs=0)
    generation = generation_of(response(0, "ab", [token(5, "a", -0.5), token(6, "b")],
                                        finish="length", generated=2))
    (choice,) = openai.reply(calls, [generation], options)["choices"]
    assert choice["logprobs"] == {"tokens": ["a", "b"], "token_logprobs": [-0.5, None],
                                  "top_logprobs": [{"a": -0.5}, None], "text_offset": [0, 1]}


def test_completion_reply_echoes_a_token_id_prompt_from_its_tokens() -> None:
    calls, options = completion(prompt=[1, 15], echo=True)
    generation = generation_of(response(0, "!", [token(3, "!")], finish="length",
                                        prompt=[token(1, "<s>"), token(15, "Hello", -2.0)]))
    (choice,) = openai.reply(calls, [generation], options)["choices"]
    assert choice["text"] == "<s>Hello!"


def test_completion_reply_without_echo_has_only_the_completion() -> None:
    calls, options = completion(prompt="Say")
    generation = generation_of(response(0, " hi", finish="length"))
    assert openai.reply(calls, [generation], options)["choices"][0]["text"] == " hi"


# --- OpenAI: streamed chunks -------------------------------------------------------------------

def test_chat_chunks() -> None:
    _, options = chat(model="m", stream=True)
    role = openai.chunk(options, 0, role=True)
    assert role == {"id": options.response_id, "object": "chat.completion.chunk",
                    "created": options.created, "model": "m",
                    "system_fingerprint": openai.SYSTEM_FINGERPRINT,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]}
    content = openai.chunk(options, 1, delta_text="Hi", tokens=[token(5, "Hi", -0.5)])
    assert content["choices"] == [{"index": 1, "delta": {"content": "Hi"}, "logprobs": None,
                                   "finish_reason": None}]
    last = openai.chunk(options, 0, finish_reason="eos_token")
    assert last["choices"][0]["delta"] == {}
    assert last["choices"][0]["finish_reason"] == "stop"
    assert openai.chunk(options, 0, finish_reason="length")["choices"][0]["finish_reason"] == \
        "length"
    assert "usage" not in content


def test_chat_chunk_with_logprobs() -> None:
    _, options = chat(stream=True, logprobs=True)
    document = openai.chunk(options, 0, delta_text="Hi", tokens=[token(5, "Hi", -0.5)])
    assert document["choices"][0]["logprobs"] == {"content": [
        {"token": "Hi", "logprob": -0.5, "bytes": list(b"Hi"), "top_logprobs": []}]}
    # A chunk without tokens (the role's) has none.
    assert openai.chunk(options, 0, role=True)["choices"][0]["logprobs"] is None


def test_chunks_have_a_null_usage_only_when_usage_is_asked_for() -> None:
    _, options = chat(stream=True, stream_options={"include_usage": True})
    document = openai.chunk(options, 0, delta_text="x", usage={"completion_tokens": 1})
    assert "usage" in document and document["usage"] is None


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk() -> None:
    so_far = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    _, options = chat(stream=True, stream_options={"include_usage": True,
                                                   "continuous_usage_stats": True})
    assert openai.chunk(options, 0, delta_text="x", usage=so_far)["usage"] == so_far
    # Without include_usage, vLLM sends no usage at all.
    _, options = chat(stream=True, stream_options={"continuous_usage_stats": True})
    assert "usage" not in openai.chunk(options, 0, delta_text="x", usage=so_far)


def test_completion_chunks() -> None:
    _, options = completion(stream=True, logprobs=1)
    document = openai.chunk(options, 2, delta_text="lo", tokens=[token(5, "lo", -0.5)],
                            finish_reason="stop_sequence")
    assert document["object"] == "text_completion"
    assert document["id"] == options.response_id and document["id"].startswith("cmpl-")
    assert document["choices"] == [{
        "index": 2, "text": "lo", "finish_reason": "stop",
        "logprobs": {"tokens": ["lo"], "token_logprobs": [-0.5],
                     "top_logprobs": [{"lo": -0.5}], "text_offset": [0]}}]
    empty = openai.chunk(options, 0)
    assert empty["choices"][0]["text"] == "" and empty["choices"][0]["logprobs"] is None
    assert empty["choices"][0]["finish_reason"] is None


def test_usage_chunk() -> None:
    for kind, (_, options) in (("chat.completion.chunk", chat(stream=True)),
                               ("text_completion", completion(stream=True))):
        generation = generation_of(response(0, "a", prompt_tokens=4, generated=5,
                                            finish="length", cached=3))
        assert openai.usage_chunk([generation], options) == {
            "id": options.response_id, "object": kind, "created": options.created,
            "model": "", "system_fingerprint": openai.SYSTEM_FINGERPRINT, "choices": [],
            "usage": {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9,
                      "prompt_tokens_details": {"cached_tokens": 3}}}


# --- OpenAI: models and errors -----------------------------------------------------------------

def test_models_json_has_vllms_root_parent_and_max_model_len() -> None:
    assert openai.models_json(["a", "b"], 1700000000, 2560) == {"object": "list", "data": [
        {"id": "a", "object": "model", "created": 1700000000, "owned_by": "switchboard",
         "root": "a", "parent": None, "max_model_len": 2560},
        {"id": "b", "object": "model", "created": 1700000000, "owned_by": "switchboard",
         "root": "b", "parent": None, "max_model_len": 2560}]}
    assert openai.model_json("a", 5, None) == {"id": "a", "object": "model", "created": 5,
                                               "owned_by": "switchboard", "root": "a",
                                               "parent": None, "max_model_len": None}


@pytest.mark.parametrize("status, error_type", [
    (400, "invalid_request_error"), (404, "not_found_error"), (401, "authentication_error"),
    (403, "permission_error"), (429, "rate_limit_error"), (504, "timeout_error"),
    (500, "server_error"), (503, "server_error")])
def test_openai_error_body(status: int, error_type: str) -> None:
    assert openai.error_body(status, "max_tokens: must be an integer", "max_tokens") == {
        "error": {"message": "max_tokens: must be an integer", "type": error_type,
                  "param": "max_tokens", "code": str(status)}}


# --- vLLM's demo server ------------------------------------------------------------------------

def test_vllm_request_translates_parameters() -> None:
    request, prompt, stream = vllm.generate_request_to_pb({
        "prompt": "Hi", "stream": True, "n": 2, "max_tokens": 8, "min_tokens": 1,
        "temperature": 0.8, "top_k": -1, "top_p": 0.9, "stop": ["x"], "ignore_eos": True,
        "stop_token_ids": [2], "seed": 4, "best_of": 3, "presence_penalty": 0.1, "min_p": 0.1})
    assert request.text == "Hi" and request.model_name == ""
    assert (prompt, stream) == ("Hi", True)
    assert params(request) == {"n": 2, "max_new_tokens": 8, "min_new_tokens": 1,
                               "temperature": 0.8, "do_sample": True, "top_k": 0, "top_p": 0.9,
                               "stop": ["x"], "ignore_eos": True, "stop_token_ids": [2],
                               "seed": 4, "best_of": 3, "presence_penalty": 0.1, "min_p": 0.1}


def test_vllm_request_defaults() -> None:
    request, prompt, stream = vllm.generate_request_to_pb({"prompt": "Hi"})
    assert params(request) == {"max_new_tokens": 16, "do_sample": True}
    assert (prompt, stream) == ("Hi", False)


def test_vllm_temperature_zero_is_greedy() -> None:
    request, *_ = vllm.generate_request_to_pb({"prompt": "Hi", "temperature": 0.0, "top_k": 5})
    assert params(request) == {"max_new_tokens": 16, "do_sample": False, "top_k": 5}


@pytest.mark.parametrize("document, field", [
    ({}, "prompt"),
    ({"prompt": ["a"]}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"inputs": "x", "prompt": "x"}, "inputs"),
    ({"prompt": "x", "max_new_tokens": 5}, "max_new_tokens"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ("x", "the body"),
])
def test_vllm_refusals_name_the_field(document, field) -> None:
    assert refused(vllm.generate_request_to_pb, document).field == field


def test_vllm_texts_prefix_the_prompt_in_sequence_order() -> None:
    generation = generation_of(response(1, " b1"), response(0, " a"), response(1, "b2"))
    assert vllm.texts(generation, "Hi") == {"text": ["Hi a", "Hi b1b2"]}


def test_vllm_stream_line_ends_with_nul() -> None:
    generation = generation_of(response(0, " thé"))
    line = vllm.stream_line(generation, "Hi")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert "thé".encode() in line  # UTF-8, not \u escapes
    assert json.loads(line[:-1]) == {"text": ["Hi thé"]}


def test_vllm_stream_error() -> None:
    line = vllm.stream_error({"error": "prompt: too long"})
    assert line == b'{"error": "prompt: too long"}\n'


# --- TGI's and vLLM's /tokenize, vLLM's /detokenize --------------------------------------------

def test_tokenize_bodies_go_to_tgi_with_inputs_and_to_vllm_with_prompt_or_messages() -> None:
    assert tgi.is_tgi({"inputs": "Hi"}) and tgi.is_tgi({}) and tgi.is_tgi([])
    assert tgi.is_tgi({"inputs": "Hi", "prompt": "x"})
    assert not tgi.is_tgi({"prompt": "Hi"}) and not tgi.is_tgi({"messages": []})


def test_tokenize_speaks_the_bodys_protocol_and_answers_in_its_shape() -> None:
    """POST /tokenize's protocol is chosen by the body, as the shared generation routes' are:
    TGI's answers tokens with their characters and refuses in TGI's shape (422, naming
    `inputs`); vLLM's answers counts and refuses in its OpenAI server's."""
    shared = vllm.TGI_OR_VLLM_TOKENIZE
    assert shared.speaking({"inputs": "Hi"}) is shared
    assert shared.speaking({"prompt": "Hi"}) is shared.speaking({"messages": []}) is vllm.TOKENIZE
    assert shared.error_document(400, "inputs: bad", "inputs", None) == (
        422, {"error": "inputs: bad", "error_type": "validation"})
    assert vllm.TOKENIZE.error_document(400, "bad", "prompt", None) == (
        400, openai.error_body(400, "bad", "prompt"))
    assert (shared.names, vllm.TOKENIZE.names) == (tgi.NAMES, {})

    async def tokenize(request: sb.TokenizeRequest) -> sb.TokenizeResponse:
        return sb.TokenizeResponse(ids=[7, 8], spans=[sb.TextSpan(start=0, stop=1),
                                                      sb.TextSpan(start=1, stop=2)],
                                   vocabulary_strings=["H", "i"], max_sequence_length=64)

    assert asyncio.run(shared.answer({"inputs": "Hi"}, tokenize)) == [
        {"id": 7, "text": "H", "start": 0, "stop": 1},
        {"id": 8, "text": "i", "start": 1, "stop": 2}]
    assert asyncio.run(vllm.TOKENIZE.answer({"prompt": "Hi", "return_token_strs": True},
                                            tokenize)) == {
        "count": 2, "max_model_len": 64, "tokens": [7, 8], "token_strs": ["H", "i"]}


def test_tgi_tokenize_answers_each_token_with_its_characters() -> None:
    request = tgi.tokenize_request_to_pb({"inputs": "Hi 世", "parameters": {"truncate": 3}})
    assert request.text == "Hi 世" and not request.HasField("add_special_tokens")
    response = sb.TokenizeResponse(ids=[1, 2, 3, 4, 5], spans=[
        sb.TextSpan(start=0, stop=0), sb.TextSpan(start=0, stop=2), sb.TextSpan(start=2, stop=3),
        sb.TextSpan(start=3, stop=4), sb.TextSpan(start=3, stop=4)])
    assert tgi.tokenize_reply(response, request.text) == [
        {"id": 1, "text": "", "start": 0, "stop": 0},
        {"id": 2, "text": "Hi", "start": 0, "stop": 2},
        {"id": 3, "text": " ", "start": 2, "stop": 3},
        {"id": 4, "text": "世", "start": 3, "stop": 4},
        {"id": 5, "text": "世", "start": 3, "stop": 4}]
    assert refused(tgi.tokenize_request_to_pb, {"inputs": 3}).field == "inputs"


def test_tgi_chat_tokenize_takes_a_chat_request_and_tokenizes_its_messages() -> None:
    request = tgi.chat_tokenize_request_to_pb({"model": "tgi", "messages": [USER],
                                               "max_tokens": 5, "stream": True})
    assert request.model_name == ""  # TGI's placeholder: the served model
    assert [(m.role, m.content) for m in request.messages.messages] == [("user", "Hi")]
    assert tgi.chat_tokenize_request_to_pb({"model": "smollm2", "messages": [USER]}
                                           ).model_name == "smollm2"


@pytest.mark.parametrize("body, field", [
    ({"messages": "Hi"}, "messages"),
    ({"messages": [{"content": "Hi"}]}, "messages[0].role"),
    ({"messages": [USER], "tools": [{"type": "function"}]}, "tools[0].function"),
    ({"messages": [USER], "inputs": "Hi"}, "inputs"),
])
def test_tgi_chat_tokenize_refusals_name_the_field(body: dict, field: str) -> None:
    assert refused(tgi.chat_tokenize_request_to_pb, body).field == field


def test_tgi_chat_tokenize_answers_tokens_in_the_templated_text() -> None:
    text = "<|im_start|>user\nHi"
    response = sb.TokenizeResponse(ids=[1, 2, 3], templated_text=text, spans=[
        sb.TextSpan(start=0, stop=12), sb.TextSpan(start=12, stop=17),
        sb.TextSpan(start=17, stop=19)])
    assert tgi.chat_tokenize_reply(response) == {
        "tokenize_response": [{"id": 1, "text": "<|im_start|>", "start": 0, "stop": 12},
                              {"id": 2, "text": "user\n", "start": 12, "stop": 17},
                              {"id": 3, "text": "Hi", "start": 17, "stop": 19}],
        "templated_text": text}


def test_vllm_tokenize_of_a_prompt() -> None:
    request, token_strs = vllm.tokenize_request_to_pb({"model": "smollm2", "prompt": "Hi",
                                                       "add_special_tokens": False})
    assert (request.model_name, request.text, request.add_special_tokens, token_strs) == \
        ("smollm2", "Hi", False, False)
    assert not vllm.tokenize_request_to_pb({"prompt": "Hi"})[0].HasField("add_special_tokens")
    response = sb.TokenizeResponse(ids=[7, 8], max_sequence_length=2048,
                                   texts=["a", " b"], vocabulary_strings=["a", "Ġb"])
    assert vllm.tokenize_reply(response, False) == {"count": 2, "max_model_len": 2048,
                                                    "tokens": [7, 8], "token_strs": None}


def test_vllm_tokenize_gives_the_vocabulary_strings_when_asked() -> None:
    _, token_strs = vllm.tokenize_request_to_pb({"prompt": "Hi", "return_token_strs": True})
    response = sb.TokenizeResponse(ids=[7, 8], texts=["a", " b"],
                                   vocabulary_strings=["a", "Ġb"])
    assert vllm.tokenize_reply(response, token_strs)["token_strs"] == ["a", "Ġb"]


def test_vllm_tokenize_of_messages() -> None:
    request, _ = vllm.tokenize_request_to_pb({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "add_generation_prompt": True, "add_special_tokens": False})
    assert [(m.role, m.content) for m in request.messages.messages] == [("user", "Hi")]
    assert request.messages.add_generation_prompt


@pytest.mark.parametrize("translate", [
    lambda options: vllm.tokenize_request_to_pb(options)[0].messages,
    lambda options: openai.chat_request_to_pb(options)[0][0].request.messages,
], ids=["tokenize", "chat"])
def test_vllms_chat_template_options_travel_with_the_messages(translate) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    rendered = translate({"messages": messages, "add_generation_prompt": False,
                          "continue_final_message": True,
                          "chat_template_kwargs": {"enable_thinking": False, "name": "Zoë"}})
    assert not rendered.add_generation_prompt and rendered.continue_final_message
    assert json.loads(rendered.template_variables_json) == {"enable_thinking": False,
                                                            "name": "Zoë"}
    plain = translate({"messages": messages})
    assert not plain.HasField("add_generation_prompt") and not plain.continue_final_message
    assert plain.template_variables_json == ""


@pytest.mark.parametrize("body, field", [
    ({"prompt": 3}, "prompt"),
    ({"prompt": "Hi", "add_special_tokens": "yes"}, "add_special_tokens"),
    ({"messages": "Hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": True},
     "add_special_tokens"),
    ({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": "no"},
     "add_generation_prompt"),
    ({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": []},
     "chat_template_kwargs"),
    ({"messages": [{"content": "Hi"}]}, "messages[0].role"),
    ({"prompt": "Hi", "return_token_strs": 1}, "return_token_strs"),
])
def test_vllm_tokenize_refusals_name_the_field(body: dict, field: str) -> None:
    assert refused(vllm.tokenize_request_to_pb, body).field == field


def test_vllm_detokenize() -> None:
    request = vllm.detokenize_request_to_pb({"model": "smollm2", "tokens": [1, 2]})
    assert (request.model_name, list(request.token_ids)) == ("smollm2", [1, 2])
    for tokens in ("1 2", [1, -1], [True], [2**32]):
        assert refused(vllm.detokenize_request_to_pb, {"tokens": tokens}).field == "tokens"
    assert refused(vllm.detokenize_request_to_pb, {"tokens": [], "prompt": "x"}).field == \
        "prompt"


def test_tgi_details_of_a_greedy_sequence_have_a_null_seed_as_tgis() -> None:
    _, options = tgi_request({"details": True, "do_sample": False})
    last = response(0, "Hi", [token(5, "Hi", -0.5)], finish="length", seed=77, sampled=False)
    generation = generation_of(last)
    assert tgi.reply(generation, options)["details"]["seed"] is None
    assert tgi.stream_event(last, generation, options)["details"]["seed"] is None
