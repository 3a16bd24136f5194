"""OpenAI's tool calling and vLLM's reasoning content on chat completions ⇄ switchboard.v1.

Requests: `tools` (type function, with a JSON-schema `parameters`), `tool_choice` (none,
auto, required, or {"type": "function", "function": {"name"}}), `parallel_tool_calls`,
assistant messages' `tool_calls` and tool messages' `tool_call_id`, onto ChatMessages; the
server checks what they mean (a named tool not in tools, "auto" without a tool-call parser).
Answers: `message.tool_calls` (content null when the answer is only calls) and
`finish_reason` "tool_calls" (but "stop" after a named tool's call, as OpenAI's and vLLM's);
`reasoning_content`, and its tokens in `usage`; streamed as OpenAI streams calls: per call an
index, its id and name first, then its arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from switchboard.gateway.errors import bad_request
from switchboard.gateway.protocols.generation import Generation, SequenceResult, optional_bool
from switchboard.gateway.protocols.kserve import require_object
from switchboard.gateway.protocols.parameters import json_type
from switchboard.proto import switchboard_pb2 as sb

TOOL_CHOICES = {"none": sb.TOOL_CHOICE_NONE, "auto": sb.TOOL_CHOICE_AUTO,
                "required": sb.TOOL_CHOICE_REQUIRED}
# Finish reasons of a sequence that ended by itself (the server's, and OpenAI's "stop" they
# become), which "tool_calls" replaces where it called tools.
STOPPED = frozenset({"eos_token", "stop_sequence", "stopped", "stop"})


def add_tools(document: Mapping[str, object], messages: sb.ChatMessages,
              nested: bool = True) -> None:
    """The request's tools, tool_choice and parallel_tool_calls onto `messages`, and whether
    it streams (its calls' arguments then stream as they are written). Chat's
    functions are `nested` in their tool (`{"type": "function", "function": {"name"}}`), the
    Responses API's are the tool itself (`{"type": "function", "name"}`). A named choice may
    leave its type out, as TGI's Messages API (and its client, huggingface_hub) sends it:
    `{"function": {"name"}}`."""
    tools = document.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("tools", f"must be an array of tools; got {json_type(tools)}")
    for index, tool in enumerate(tools or []):
        messages.tools.append(_tool(f"tools[{index}]", tool, nested))
    choice = document.get("tool_choice")
    named = '{"type": "function", "function": {"name": …}}' if nested \
        else '{"type": "function", "name": …}'
    if isinstance(choice, str) and choice in TOOL_CHOICES:
        messages.tool_choice = TOOL_CHOICES[choice]
    elif isinstance(choice, dict):
        function = require_object(choice.get("function"), "tool_choice.function") if nested \
            else choice
        if choice.get("type", "function") != "function" \
                or not isinstance(function.get("name"), str):
            raise bad_request("tool_choice", f"must be {named}")
        messages.tool_choice = sb.TOOL_CHOICE_NAMED
        messages.tool_choice_name = function["name"]
    elif choice is not None:
        raise bad_request("tool_choice", f'must be "none", "auto", "required" or {named}; got '
                          f"{json.dumps(choice)}")
    messages.stream = optional_bool(document, "stream")
    parallel = document.get("parallel_tool_calls")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise bad_request("parallel_tool_calls", "must be true or false")
        messages.parallel_tool_calls = parallel


def _tool(where: str, tool: object, nested: bool) -> sb.Tool:
    tool = require_object(tool, where)
    if tool.get("type") != "function":
        raise bad_request(f"{where}.type", f'must be "function"; got {json.dumps(tool.get("type"))}')
    if nested:
        where = f"{where}.function"
    function = require_object(tool.get("function"), where) if nested else tool
    name, description = function.get("name"), function.get("description")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.name", "is required: a tool needs a name")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"{where}.description", "must be a string")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise bad_request(f"{where}.parameters", "must be a JSON schema object; got "
                          f"{json_type(parameters)}")
    return sb.Tool(name=name, description=description or "",
                   parameters_json=json.dumps(parameters) if parameters is not None else "")


def add_message_tool_fields(message: Mapping[str, object], where: str,
                            result: sb.ChatMessage) -> None:
    """An assistant message's tool_calls and a tool message's tool_call_id onto `result`."""
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise bad_request(f"{where}.tool_calls", f"must be an array; got {json_type(calls)}")
    for number, call in enumerate(calls or []):
        at = f"{where}.tool_calls[{number}]"
        call = require_object(call, at)
        function = require_object(call.get("function"), f"{at}.function")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, dict):  # some clients send the object itself
            arguments = json.dumps(arguments)
        for name, value in (("id", call.get("id")), ("function.name", function.get("name")),
                            ("function.arguments", arguments)):
            if not isinstance(value, str):
                raise bad_request(f"{at}.{name}", f"must be a string; got {json_type(value)}")
        result.tool_calls.add(id=call["id"], name=function["name"], arguments=arguments)
    call_id = message.get("tool_call_id")
    if call_id is not None:
        if not isinstance(call_id, str):
            raise bad_request(f"{where}.tool_call_id", f"must be a string; got {json_type(call_id)}")
        result.tool_call_id = call_id


def finish_reason(sequence: SequenceResult, reason: str, messages: sb.ChatMessages) -> str:
    """The server's reason, but "tool_calls" for a sequence that stopped after calling tools
    of the model's choice or of a required choice: a named tool's call stops with "stop", as
    OpenAI answers a forced function and vLLM follows it."""
    called = sequence.tool_calls and messages.tool_choice != sb.TOOL_CHOICE_NAMED
    return "tool_calls" if called and reason in STOPPED else reason


def message_fields(sequence: SequenceResult) -> dict[str, object]:
    """The answer message's content, tool_calls and reasoning_content."""
    fields: dict[str, object] = {"content": sequence.generated_text}
    if sequence.tool_calls:
        fields["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": "".join(call.arguments)}}
            for _, call in sorted(sequence.tool_calls.items())]
        fields["content"] = sequence.generated_text or None
    reasoning = "".join(sequence.reasoning)
    if reasoning:
        fields["reasoning_content"] = reasoning
    return fields


def delta_fields(response: sb.GenerateResponse) -> dict[str, object]:
    """A streamed chunk's delta of reasoning_content and tool_calls."""
    delta: dict[str, object] = {}
    if response.reasoning_text:
        delta["reasoning_content"] = response.reasoning_text
    if response.tool_calls:
        delta["tool_calls"] = [
            {"index": call.index, "id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}} if call.id
            else {"index": call.index, "function": {"arguments": call.arguments}}
            for call in response.tool_calls]
    return delta


def usage_details(generations: list[Generation]) -> dict[str, object]:
    """usage's completion_tokens_details where any tokens were reasoning."""
    reasoning = sum(sequence.reasoning_tokens for generation in generations
                    for sequence in generation.sequences.values())
    return {"completion_tokens_details": {"reasoning_tokens": reasoning}} if reasoning else {}
