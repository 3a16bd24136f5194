"""OpenAI's tools on chat completions: requests onto switchboard.v1's ChatMessages, and the
server's content, reasoning and tool-call pieces rendered as OpenAI answers and streams."""

from __future__ import annotations

import json

import pytest

from switchboard.gateway.errors import RequestError
from switchboard.gateway.protocols import openai, openai_responses as responses
from switchboard.gateway.protocols.generation import Generation
from switchboard.gateway.protocols.openai_tools import delta_fields
from switchboard.proto import switchboard_pb2 as sb

USER = {"role": "user", "content": "Weather in Paris?"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
ANSWERED = {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"}


def chat_messages(**fields: object) -> sb.ChatMessages:
    [call], _ = openai.chat_request_to_pb({"messages": [USER], **fields})
    return call.request.messages


def test_tools_choice_and_the_conversations_calls_travel_to_the_server() -> None:
    messages = chat_messages(messages=[USER, CALLED, ANSWERED], tools=[WEATHER],
                             tool_choice={"type": "function", "function": {"name": "get_weather"}},
                             parallel_tool_calls=False)
    [tool] = messages.tools
    assert (tool.name, tool.description, json.loads(tool.parameters_json)) == (
        "get_weather", "The weather in a city.", WEATHER["function"]["parameters"])
    assert (messages.tool_choice, messages.tool_choice_name) == (sb.TOOL_CHOICE_NAMED,
                                                                 "get_weather")
    assert messages.HasField("parallel_tool_calls") and not messages.parallel_tool_calls
    [call] = messages.messages[1].tool_calls
    assert (call.id, call.name, call.arguments) == ("call_1", "get_weather", '{"city": "Paris"}')
    assert messages.messages[2].tool_call_id == "call_1"


@pytest.mark.parametrize("choice, mode", [("none", sb.TOOL_CHOICE_NONE),
                                          ("auto", sb.TOOL_CHOICE_AUTO),
                                          ("required", sb.TOOL_CHOICE_REQUIRED),
                                          (None, sb.TOOL_CHOICE_UNSPECIFIED)])
def test_each_tool_choice_travels_and_auto_without_tools_is_not_refused(choice, mode) -> None:
    assert chat_messages(tool_choice=choice).tool_choice == mode


@pytest.mark.parametrize("stream", [False, True])
def test_whether_the_answer_streams_travels_so_calls_stream_as_they_are_written(stream
                                                                                ) -> None:
    assert chat_messages(tools=[WEATHER], stream=stream).stream is stream
    request, _ = responses.request_to_pb({"input": "x", "stream": stream, "tools": [
        {"type": "function", **WEATHER["function"]}]})
    assert request.messages.stream is stream


def test_a_named_choice_without_its_type_is_tgis_and_names_the_tool() -> None:
    messages = chat_messages(tool_choice={"function": {"name": "get_weather"}})
    assert (messages.tool_choice, messages.tool_choice_name) == (sb.TOOL_CHOICE_NAMED,
                                                                 "get_weather")


@pytest.mark.parametrize("fields, field", [
    ({"tools": {"name": "f"}}, "tools"),
    ({"tool_choice": {"type": "tool", "function": {"name": "f"}}}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"id": 1, "function": {
        "name": "f", "arguments": "{}"}}]}]}, "messages[1].tool_calls[0].id"),
    ({"messages": [USER, {"role": "tool", "tool_call_id": 5, "content": "x"}]},
     "messages[1].tool_call_id"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_malformed_tool_fields_are_refused_naming_them(fields, field) -> None:
    with pytest.raises(RequestError) as refused:
        chat_messages(**fields)
    assert refused.value.field == field


def call_pieces(index: int, call_id: str, name: str, *arguments: str) -> list[sb.ToolCallDelta]:
    return [sb.ToolCallDelta(index=index, id=call_id, name=name),
            *(sb.ToolCallDelta(index=index, arguments=piece) for piece in arguments)]


def options(stream: bool = False) -> openai.OpenAIOptions:
    _, result = openai.chat_request_to_pb({"messages": [USER], "stream": stream})
    return result


def test_an_answer_of_calls_only_has_null_content_and_finish_reason_tool_calls() -> None:
    generation = Generation()
    generation.add(sb.GenerateResponse(tool_calls=call_pieces(0, "call_a", "get_weather",
                                                              '{"city": ', '"Paris"}'),
                                       generated_tokens=9, prompt_tokens=3))
    generation.add(sb.GenerateResponse(tool_calls=call_pieces(1, "call_b", "get_time", "{}"),
                                       finish_reason="eos_token", generated_tokens=14,
                                       prompt_tokens=3))
    [choice] = openai.reply([openai.Call(sb.GenerateRequest(), None)], [generation],
                            options())["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}],
        "refusal": None}


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("choice, reason", [("required", "tool_calls"), (None, "tool_calls"),
                                            (NAMED, "stop")],
                         ids=["required", "auto", "named"])
def test_a_named_tools_call_finishes_with_stop_as_openai_and_vllm_answer(choice, reason
                                                                         ) -> None:
    """OpenAI answers a forced function with "stop"; vLLM follows it for a named choice and
    answers "tool_calls" for the model's own or a required choice, streamed or not."""
    pieces = [sb.GenerateResponse(tool_calls=call_pieces(0, "call_a", "get_weather"),
                                  generated_tokens=2),
              sb.GenerateResponse(tool_calls=[sb.ToolCallDelta(index=0, arguments="{}")],
                                  finish_reason="eos_token", generated_tokens=3)]
    for stream in (False, True):
        [call], chosen = openai.chat_request_to_pb({"messages": [USER], "tools": [WEATHER],
                                                    "tool_choice": choice, "stream": stream})
        answer = openai.CompletionAnswer([call], chosen)
        if stream:
            *_, last = [json.loads(event[len(b"data: "):])
                        for response in pieces for event in answer.events(0, response)]
            assert last["choices"][0]["finish_reason"] == reason
        else:
            for response in pieces:
                answer.collect(0, response)
            assert answer.reply()["choices"][0]["finish_reason"] == reason


def test_reasoning_comes_as_reasoning_content_and_counts_in_usage() -> None:
    generation = Generation()
    generation.add(sb.GenerateResponse(reasoning_text="Greeting.", reasoning_tokens=3,
                                       generated_tokens=3))
    generation.add(sb.GenerateResponse(text="Hello!", finish_reason="eos_token",
                                       generated_tokens=5))
    answer = openai.reply([openai.Call(sb.GenerateRequest(), None)], [generation], options())
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Hello!",
                                               "reasoning_content": "Greeting.", "refusal": None}
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}


def test_a_streamed_call_gives_its_index_id_and_name_first_then_its_arguments() -> None:
    first, more = call_pieces(0, "call_a", "get_weather", '{"city"')
    assert openai.chunk(options(True), 0, delta_fields=openai_tools_delta(first, more)
                        )["choices"][0]["delta"] == {"tool_calls": [
        {"index": 0, "id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"city"'}}]}


def openai_tools_delta(*pieces: sb.ToolCallDelta) -> dict[str, object]:
    return delta_fields(sb.GenerateResponse(tool_calls=pieces))
