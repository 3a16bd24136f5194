"""Tool calling and reasoning end to end: the `openai` SDK and langchain-openai → gateway
(Tornado, mutual TLS) → gRPC server (mutual TLS) → the packaged SmolLM2.

A required or named tool choice constrains generation, so even a 135M model calls the tool
with arguments that parse and validate; the loop ends with the model answering the tool's
result in text. "auto" and reasoning are read by the server's parsers (vLLM's flags, which
this module's server runs with), here from outputs scripted with a regular expression, as a
model writing those formats would. ("auto" refused without them: tests/unit/test_chat_output.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2
import huggingface_hub
import jsonschema
import openai
import pytest
from conftest import own_service
from gateway_clients import MODEL, ssl_context
from huggingface_hub import InferenceClient
from huggingface_hub.utils._http import default_client_factory
from langchain_openai import ChatOpenAI

QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": WEATHER_PARAMETERS}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}},
                   "required": ["zone"], "additionalProperties": False}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# A named tool's call finishes with "stop", as OpenAI answers a forced function (vLLM too).
FINISH_REASONS = {"required": "tool_calls", str(NAMED): "stop"}
TOOL_RESULT = "18 degrees celsius and sunny"
# Bounds every answer: the constrained calls take about 30 tokens.
MAX_TOKENS = 64
TIMEOUT_S = 600  # a busy 2-core machine
# An output written as a reasoning model with Hermes-style calls writes it (qwen3, hermes).
SCRIPTED_CALL = ('<think>[a-z]{3,8}</think>\n<tool_call>\n\\{"name": "get_weather", '
                 '"arguments": \\{"city": "Paris", "unit": "celsius"\\}\\}\n</tool_call>')


@pytest.fixture(scope="module")
def service(pki) -> Iterator[object]:
    """A server with vLLM's --enable-auto-tool-choice, --tool-call-parser hermes and
    --reasoning-parser qwen3, and its gateway."""
    with own_service(pki.folder, server_args=(
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--reasoning-parser", "qwen3")) as (_, gateway):
        yield gateway


@pytest.fixture(scope="module")
def client(service, client_files) -> Iterator[openai.OpenAI]:
    http = httpx2.Client(verify=ssl_context(client_files), timeout=TIMEOUT_S)
    with openai.OpenAI(base_url=service.url("business") + "/v1", api_key="unused",
                       http_client=http, max_retries=0) as client:
        yield client


def checked_call(call, name: str = "get_weather") -> dict:
    """A call's arguments, which must parse and validate against its tool's schema."""
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == name
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_PARAMETERS)
    return arguments


def streamed_answer(stream) -> tuple[dict[int, dict], str, str, str | None]:
    """A stream's calls by index ({id, name, arguments, pieces}: its arguments' text and how
    many pieces it came in), content, reasoning and finish reason, checking that each call's
    id and name come in its first piece only."""
    calls: dict[int, dict] = {}
    content = reasoning = ""
    finish_reason = None
    for chunk in stream:
        if not chunk.choices:
            continue
        [choice] = chunk.choices
        assert finish_reason is None, "a chunk after the finish reason"
        delta = choice.delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for piece in delta.tool_calls or []:
            if piece.index not in calls:
                assert piece.id.startswith("call_") and piece.function.name
                calls[piece.index] = {"id": piece.id, "name": piece.function.name,
                                      "arguments": "", "pieces": 0}
            else:
                assert piece.id is None and piece.function.name is None
            calls[piece.index]["arguments"] += piece.function.arguments or ""
            calls[piece.index]["pieces"] += bool(piece.function.arguments)
        finish_reason = choice.finish_reason
    return calls, content, reasoning, finish_reason


def answer_with_the_tools_result(client: openai.OpenAI, message) -> None:
    """The conversation goes on with the tool's result, and the model answers in text."""
    [call] = message.tool_calls
    messages = [QUESTION, message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                           tool_choice="none", temperature=0, max_tokens=16)
    [choice] = reply.choices
    assert choice.message.content and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_the_model_calls_the_tool_then_answers_its_result(client, choice) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[QUESTION], tools=[WEATHER, CLOCK], tool_choice=choice,
        parallel_tool_calls=False, temperature=0, max_tokens=MAX_TOKENS)
    [answer] = reply.choices
    assert answer.finish_reason == FINISH_REASONS[str(choice)]
    assert answer.message.content is None
    [call] = answer.message.tool_calls
    checked_call(call)
    assert reply.usage.completion_tokens > 0
    answer_with_the_tools_result(client, answer.message)


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_a_streamed_call_comes_as_openai_streams_it_and_the_loop_goes_on(client, choice
                                                                         ) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[QUESTION], tools=[WEATHER, CLOCK], tool_choice=choice,
        parallel_tool_calls=False, temperature=0, max_tokens=MAX_TOKENS, stream=True)
    calls, content, _, finish_reason = streamed_answer(stream)
    assert finish_reason == FINISH_REASONS[str(choice)] and content == ""
    [call] = calls.values()
    assert call["name"] == "get_weather" and call["pieces"] > 1  # as they are generated
    jsonschema.validate(json.loads(call["arguments"]), WEATHER_PARAMETERS)
    whole = client.chat.completions.create(
        model=MODEL, messages=[QUESTION], tools=[WEATHER, CLOCK], tool_choice=choice,
        parallel_tool_calls=False, temperature=0, max_tokens=MAX_TOKENS)
    assert json.loads(whole.choices[0].message.tool_calls[0].function.arguments) == \
        json.loads(call["arguments"])  # greedy: the same call, streamed or not
    answer_with_the_tools_result(client, whole.choices[0].message)


RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}
RESPONSES_NAMED = {"type": "function", "name": "get_weather"}


def responses_call(response) -> object:
    """A Responses API answer's one function_call item, whose arguments must validate."""
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    return call


@pytest.mark.parametrize("choice", ["required", RESPONSES_NAMED], ids=["required", "named"])
def test_the_responses_api_calls_the_tool_then_answers_its_result(client, choice) -> None:
    response = client.responses.create(
        model=MODEL, input=QUESTION["content"], tools=[RESPONSES_WEATHER], tool_choice=choice,
        parallel_tool_calls=False, temperature=0, max_output_tokens=MAX_TOKENS)
    call = responses_call(response)
    assert [item.type for item in response.output] == ["function_call"]
    answer = client.responses.create(
        model=MODEL, tools=[RESPONSES_WEATHER], tool_choice="none", temperature=0,
        max_output_tokens=16,
        input=[{"role": "user", "content": QUESTION["content"]},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": TOOL_RESULT}])
    assert answer.output_text
    assert not [item for item in answer.output if item.type == "function_call"]


@pytest.mark.parametrize("choice", ["required", RESPONSES_NAMED], ids=["required", "named"])
def test_a_streamed_responses_call_streams_its_arguments(client, choice) -> None:
    events = list(client.responses.create(
        model=MODEL, input=QUESTION["content"], tools=[RESPONSES_WEATHER],
        tool_choice=choice, parallel_tool_calls=False, temperature=0,
        max_output_tokens=MAX_TOKENS, stream=True))
    assert events[-1].type == "response.completed"
    call = responses_call(events[-1].response)
    deltas = [event.delta for event in events
              if event.type == "response.function_call_arguments.delta"]
    [done] = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert len(deltas) > 1  # as they are generated
    assert json.loads("".join(deltas)) == json.loads(done.arguments) == \
        json.loads(call.arguments)


@pytest.mark.parametrize("fields, param, message", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "not one of the tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}],
      "tool_choice": "required"}, "tools[0].function.name", "needs a name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "string"}}}], "tool_choice": "required"}, "tools[0].function.parameters",
     "JSON schema of an object"),
    ({"messages": [QUESTION, {"role": "tool", "tool_call_id": "call_unknown", "content": "x"}]},
     "messages[1].tool_call_id", "matches no earlier tool call"),
], ids=["named-not-in-tools", "tool-without-name",
        "parameters-not-object", "unanswered-tool-call-id"])
def test_refusals_name_the_field_and_the_server_keeps_serving(client, fields, param,
                                                             message) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**{"model": MODEL, "messages": [QUESTION],
                                          "max_tokens": 4, **fields})
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == param and message in refused.value.body["message"]
    reply = client.chat.completions.create(model=MODEL, messages=[QUESTION], max_tokens=1)
    assert reply.usage.completion_tokens == 1


def test_auto_without_tools_means_no_tools(client) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=[QUESTION],
                                           tool_choice="auto", max_tokens=2)
    assert reply.choices[0].message.tool_calls is None


def test_auto_reads_calls_after_reasoning_from_the_models_own_format(client) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[QUESTION], tools=[WEATHER], temperature=0,
        max_tokens=MAX_TOKENS, extra_body={"structured_outputs": {"regex": SCRIPTED_CALL}})
    [answer] = reply.choices
    assert answer.finish_reason == "tool_calls" and answer.message.content is None
    assert checked_call(answer.message.tool_calls[0]) == {"city": "Paris", "unit": "celsius"}
    thought = answer.message.reasoning_content
    assert thought.isalpha() and 3 <= len(thought) <= 8
    assert 0 < reply.usage.completion_tokens_details.reasoning_tokens < \
        reply.usage.completion_tokens
    stream = client.chat.completions.create(
        model=MODEL, messages=[QUESTION], tools=[WEATHER], temperature=0,
        max_tokens=MAX_TOKENS, stream=True,
        extra_body={"structured_outputs": {"regex": SCRIPTED_CALL}})
    calls, content, reasoning, finish_reason = streamed_answer(stream)
    assert (content, reasoning, finish_reason) == ("", thought, "tool_calls")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert calls[0]["pieces"] > 1  # the model's own calls stream as it writes them too


def test_text_without_calls_stays_content_and_thinking_reasoning(client) -> None:
    regex = "<think>[a-z]{3,8}</think>The weather is fine[.]"
    reply = client.chat.completions.create(
        model=MODEL, messages=[QUESTION], tools=[WEATHER], temperature=0,
        max_tokens=MAX_TOKENS, extra_body={"structured_outputs": {"regex": regex}})
    message = reply.choices[0].message
    assert (message.content, message.tool_calls) == ("The weather is fine.", None)
    assert message.reasoning_content.isalpha()
    assert reply.choices[0].finish_reason == "stop"


def test_the_responses_api_answers_reasoning_as_its_own_item(client) -> None:
    regex = "<think>[a-z]{3,8}</think>The weather is fine[.]"
    response = client.responses.create(
        model=MODEL, input=QUESTION["content"], temperature=0, max_output_tokens=MAX_TOKENS,
        extra_body={"guided_regex": regex})
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text.isalpha()
    assert response.output_text == "The weather is fine."
    assert response.usage.output_tokens_details.reasoning_tokens > 0


def test_tgis_client_calls_a_named_tool_on_tgis_messages_api(service, client_files) -> None:
    """huggingface_hub's InferenceClient, TGI's client, names a tool as TGI's Messages API
    does: `{"function": {"name"}}`, without a type."""
    context = ssl_context(client_files)
    huggingface_hub.set_client_factory(lambda: httpx2.Client(verify=context, timeout=TIMEOUT_S))
    try:
        reply = InferenceClient(base_url=service.url("business")).chat_completion(
            [QUESTION], tools=[WEATHER], tool_choice={"function": {"name": "get_weather"}},
            temperature=0, max_tokens=MAX_TOKENS)
    finally:
        huggingface_hub.set_client_factory(default_client_factory)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)


def test_langchains_bind_tools_gets_tool_calls(service, client_files) -> None:
    http = httpx2.Client(verify=ssl_context(client_files), timeout=TIMEOUT_S)
    chat = ChatOpenAI(model=MODEL, base_url=service.url("business") + "/v1", api_key="unused",
                      http_client=http, max_retries=0, temperature=0, max_tokens=MAX_TOKENS)
    answer = chat.bind_tools([WEATHER], tool_choice="get_weather").invoke(QUESTION["content"])
    [call] = answer.tool_calls
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(call["args"], WEATHER_PARAMETERS)
