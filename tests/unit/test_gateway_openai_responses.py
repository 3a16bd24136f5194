"""OpenAI's Responses API ⇄ switchboard.v1 Generate, without a network: the request's
translation and refusals, the response object, and the streamed events."""

from __future__ import annotations

import json

import pytest

from switchboard.gateway.errors import RequestError
from switchboard.gateway.protocols import openai_responses as responses
from switchboard.gateway.protocols.generation import Generation
from switchboard.gateway.protocols.openai import UNLIMITED
from switchboard.proto import generation_fields
from switchboard.proto import switchboard_pb2 as sb


def params(request: sb.GenerateRequest) -> dict[str, object]:
    return generation_fields.requested_values(request)


def messages(request: sb.GenerateRequest) -> list[tuple[str, str]]:
    return [(message.role, message.content) for message in request.messages.messages]


def refusal(document: object) -> RequestError:
    with pytest.raises(RequestError) as info:
        responses.request_to_pb(document)
    return info.value


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    request, options = responses.request_to_pb({
        "model": "m", "input": "What is the capital of France?", "instructions": "Be brief.",
        "temperature": 0, "max_output_tokens": 30})
    assert messages(request) == [("system", "Be brief."),
                                 ("user", "What is the capital of France?")]
    assert request.model_name == "m"
    assert params(request) == {"do_sample": False, "max_new_tokens": 30}
    assert (options.model, options.stream) == ("m", False)


def test_input_messages_join_their_text_parts_and_sampling_defaults_hold() -> None:
    request, _ = responses.request_to_pb({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"},
                                     {"type": "input_text", "text": "there"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "developer", "content": "Answer in French."}], "top_p": 0.5})
    assert messages(request) == [("user", "Hi\nthere"), ("assistant", "Hello!"),
                                 ("developer", "Answer in French.")]
    assert params(request) == {"do_sample": True, "top_p": 0.5, "max_new_tokens": UNLIMITED}


def test_a_json_schema_format_is_the_servers_guided_json() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    request, options = responses.request_to_pb({"input": "x", "text": {"format": {
        "type": "json_schema", "name": "city", "schema": schema}}})
    assert json.loads(params(request)["guided_json"]) == schema
    assert options.echoed["text"] == {"format": {"type": "json_schema", "name": "city",
                                                 "schema": schema}}


@pytest.mark.parametrize(("document", "field"), [
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0]"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user"}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "input[0].content[0].text"),
    ({"input": "x", "temperature": -1}, "temperature"),
    ({"input": "x", "instructions": ["a"]}, "instructions"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tool_choice"),
    ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "include": "message.output_text.logprobs"}, "include"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "c"}}},
     "text.format.schema"),
    ({"input": "x", "max_output_tokens": "5"}, "max_output_tokens"),
    ({"input": "x", "stream": "yes"}, "stream"),
    ({"input": "x", "n": 2}, "n"),
    ({"input": "x", "verbosity": "low"}, "verbosity"),
])
def test_what_is_not_supported_is_refused_naming_the_field(document: dict[str, object],
                                                           field: str) -> None:
    error = refusal(document)
    assert (error.status, error.field) == (400, field)


def test_openais_bookkeeping_fields_are_accepted_without_effect() -> None:
    request, options = responses.request_to_pb({
        "input": "x", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
        "safety_identifier": "u1", "service_tier": "flex", "store": True, "user": "u"})
    assert params(request) == {"do_sample": True, "max_new_tokens": UNLIMITED}
    assert (options.echoed["service_tier"], options.echoed["user"]) == ("flex", "u")


def test_a_previous_response_is_not_found_as_none_is_stored() -> None:
    error = refusal({"input": "x", "previous_response_id": "resp_1"})
    assert (error.status, error.field) == (404, "previous_response_id")


def generated(text: str, finish_reason: str = "", *, tokens: int = 0,
              logprob: float | None = None) -> sb.GenerateResponse:
    """A response; with `logprob`, its text is one token of that log-probability, with one
    alternative."""
    response = sb.GenerateResponse(text=text, finish_reason=finish_reason,
                                   generated_tokens=tokens, prompt_tokens=7, cached_tokens=2)
    if logprob is not None:
        response.tokens.add(id=1, text=text, logprob=logprob).top.add(id=2, text="x",
                                                                      logprob=logprob - 1)
    return response


def finished(*texts: str, finish_reason: str) -> Generation:
    generation = Generation()
    for position, text in enumerate(texts, 1):
        generation.add(generated(text, finish_reason if position == len(texts) else "",
                                 tokens=position))
    return generation


@pytest.mark.parametrize(("finish_reason", "status", "details"), [
    ("eos_token", "completed", None), ("stop_sequence", "completed", None),
    ("length", "incomplete", {"reason": "max_output_tokens"})])
def test_the_reply_is_a_response_object(finish_reason: str, status: str,
                                        details: object) -> None:
    _, options = responses.request_to_pb({"model": "m", "input": "x", "temperature": 0.5,
                                          "metadata": {"k": "v"}})
    reply = responses.reply(options, finished(" Paris", ".", finish_reason=finish_reason))
    assert reply["id"] == options.id and reply["id"].startswith("resp_")
    assert {name: reply[name] for name in ("object", "status", "incomplete_details", "model",
                                           "store", "temperature", "top_p", "metadata")} == {
        "object": "response", "status": status, "incomplete_details": details, "model": "m",
        "store": False, "temperature": 0.5, "top_p": 1.0, "metadata": {"k": "v"}}
    assert reply["output"] == [{
        "id": options.message_id, "type": "message", "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": " Paris.", "annotations": [],
                     "logprobs": []}]}]
    assert reply["usage"] == {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 2},
                              "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0},
                              "total_tokens": 9}


def parsed(chunks: list[bytes]) -> list[tuple[str, dict[str, object]]]:
    """Each SSE event's `event:` name and data."""
    events = []
    for block in b"".join(chunks).decode().split("\n\n")[:-1]:
        name_line, data_line = block.split("\n")
        events.append((name_line.removeprefix("event: "),
                       json.loads(data_line.removeprefix("data: "))))
    return events


def test_a_stream_is_openais_events_numbered_in_order() -> None:
    _, options = responses.request_to_pb({"model": "m", "input": "x", "stream": True})
    events = responses.ResponseEvents(options)
    generation = finished(" Paris", "", ".", finish_reason="eos_token")
    chunks = [*events.add(generated(" Paris")), *events.add(generated("")),
              *events.add(generated(".")), events.finish(generation)]
    stream = parsed(chunks)
    assert [name for name, _ in stream] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert all(data["type"] == name for name, data in stream)
    assert [data["sequence_number"] for _, data in stream] == list(range(len(stream)))
    created = stream[0][1]["response"]
    assert (created["status"], created["output"], created["usage"]) == ("in_progress", [], None)
    deltas = [data for name, data in stream if name == "response.output_text.delta"]
    assert [delta["delta"] for delta in deltas] == [" Paris", "."]
    assert all((delta["item_id"], delta["output_index"], delta["content_index"])
               == (options.message_id, 0, 0) for delta in deltas)
    assert stream[6][1]["text"] == " Paris."
    assert stream[-1][1]["response"] == responses.reply(options, generation)


def test_an_error_in_a_stream_is_openais_error_event() -> None:
    _, options = responses.request_to_pb({"input": "x", "stream": True})
    events = responses.ResponseEvents(options)
    events.add(generated("Hi"))
    [(name, data)] = parsed([events.error({"error": {
        "message": "timed out", "type": "timeout_error", "param": None, "code": 504}})])
    assert (name, data) == ("error", {"type": "error", "sequence_number": 5, "code": "504",
                                      "message": "timed out", "param": None})


def test_logprobs_are_included_when_asked_for_in_the_part_and_each_delta() -> None:
    request, options = responses.request_to_pb({
        "input": "x", "stream": True, "include": ["message.output_text.logprobs"],
        "top_logprobs": 1})
    assert params(request)["logprobs"] is True and params(request)["top_logprobs"] == 1
    events = responses.ResponseEvents(options)
    generation = Generation()
    chunks = []
    for response in (generated("Hi", logprob=-0.5, tokens=1),
                     generated("!", "eos_token", logprob=-1.5, tokens=2)):
        generation.add(response)
        chunks += events.add(response)
    stream = dict(parsed([*chunks, events.finish(generation)]))
    hi = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
          "top_logprobs": [{"token": "x", "logprob": -1.5, "bytes": [120]}]}
    assert stream["response.output_text.delta"]["logprobs"][0]["logprob"] == -1.5  # the last
    [part] = stream["response.completed"]["response"]["output"][0]["content"]
    assert part["logprobs"][0] == hi and [entry["token"] for entry in part["logprobs"]] == \
        ["Hi", "!"]
    assert stream["response.output_text.done"]["logprobs"] == part["logprobs"]


WEATHER = {"type": "function", "name": "weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def test_function_tools_and_earlier_calls_and_their_outputs_travel_as_chats() -> None:
    request, options = responses.request_to_pb({
        "input": [{"role": "user", "content": "Weather in Paris?"},
                  {"type": "function_call", "call_id": "call_1", "name": "weather",
                   "arguments": '{"city": "Paris"}'},
                  {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
        "tools": [WEATHER], "tool_choice": {"type": "function", "name": "weather"},
        "parallel_tool_calls": False})
    messages = request.messages
    assert [(message.role, message.content, message.tool_call_id)
            for message in messages.messages] == [("user", "Weather in Paris?", ""),
                                                  ("assistant", "", ""), ("tool", "sunny", "call_1")]
    [call] = messages.messages[1].tool_calls
    assert (call.id, call.name, call.arguments) == ("call_1", "weather", '{"city": "Paris"}')
    [tool] = messages.tools
    assert (tool.name, json.loads(tool.parameters_json)) == ("weather", WEATHER["parameters"])
    assert (messages.tool_choice, messages.tool_choice_name) == (sb.TOOL_CHOICE_NAMED, "weather")
    assert messages.parallel_tool_calls is False
    assert (options.echoed["tools"], options.echoed["tool_choice"]) == \
        ([WEATHER], {"type": "function", "name": "weather"})


def called(text: str = "", *calls: sb.ToolCallDelta, finish_reason: str = "") -> sb.GenerateResponse:
    response = generated(text, finish_reason, tokens=1)
    response.tool_calls.extend(calls)
    return response


CALL_PIECES = (sb.ToolCallDelta(index=0, id="call_7", name="weather", arguments='{"city": '),
               sb.ToolCallDelta(index=0, arguments='"Paris"}'))


def test_an_answer_of_calls_is_function_call_items_without_a_message() -> None:
    _, options = responses.request_to_pb({"input": "x", "tools": [WEATHER]})
    generation = Generation()
    generation.add(called("", CALL_PIECES[0]))
    generation.add(called("", CALL_PIECES[1], finish_reason="eos_token"))
    assert responses.reply(options, generation)["output"] == [
        {"id": "fc_7", "type": "function_call", "status": "completed", "call_id": "call_7",
         "name": "weather", "arguments": '{"city": "Paris"}'}]


def test_a_streamed_call_opens_its_item_then_streams_its_arguments() -> None:
    _, options = responses.request_to_pb({"input": "x", "tools": [WEATHER], "stream": True})
    events = responses.ResponseEvents(options)
    generation = Generation()
    chunks = []
    for response in (called("Let me check.", CALL_PIECES[0]),
                     called("", CALL_PIECES[1], finish_reason="eos_token")):
        generation.add(response)
        chunks += events.add(response)
    stream = parsed([*chunks, events.finish(generation)])
    assert [name for name, _ in stream] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    arguments = [data for name, data in stream
                 if name == "response.function_call_arguments.delta"]
    assert [(data["item_id"], data["output_index"], data["delta"]) for data in arguments] == \
        [("fc_7", 1, '{"city": '), ("fc_7", 1, '"Paris"}')]
    done = dict(stream)["response.function_call_arguments.done"]
    assert (done["output_index"], done["arguments"]) == (1, '{"city": "Paris"}')
    assert stream[-1][1]["response"] == responses.reply(options, generation)


def test_reasoning_is_an_item_before_the_message_streamed_or_not() -> None:
    _, options = responses.request_to_pb({"input": "x", "stream": True})
    thought = generated("", tokens=1)
    thought.reasoning_text, thought.reasoning_tokens = "Hmm.", 1
    answer = generated("Paris.", "eos_token", tokens=2)
    events = responses.ResponseEvents(options)
    generation = Generation()
    chunks = []
    for response in (thought, answer):
        generation.add(response)
        chunks += events.add(response)
    stream = parsed([*chunks, events.finish(generation)])
    assert [name for name, _ in stream] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.reasoning_text.delta", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.reasoning_text.done", "response.output_item.done",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    delta = dict(stream)["response.reasoning_text.delta"]
    assert (delta["item_id"], delta["output_index"], delta["delta"]) == \
        (options.reasoning_id, 0, "Hmm.")
    final = stream[-1][1]["response"]
    assert final == responses.reply(options, generation)
    reasoning, message = final["output"]
    assert (reasoning["type"], reasoning["content"]) == \
        ("reasoning", [{"type": "reasoning_text", "text": "Hmm."}])
    assert message["content"][0]["text"] == "Paris."
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 1}
