"""What a chat answer holds besides its content: tool calls and reasoning.

A request's tool choice is checked against its tools and the operator's parsers (vLLM's
--enable-auto-tool-choice, --tool-call-parser, --reasoning-parser). "required" and a named
tool are guaranteed by constraining generation with a JSON schema built from the tools: an
array of calls ({"name", "arguments"}) of the tools, or the named tool's arguments. "auto"
leaves the choice to the model, whose calls the tool-call parser reads. Each sequence's text
then goes through a `ChatOutputParser`: reasoning first, then calls in the answer part.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from switchboard.engine.chat import Tool
from switchboard.engine.errors import InvalidRequest
from switchboard.engine.reasoning import REASONING_PARSERS, ReasoningParser
from switchboard.engine.tool_parsers import (TOOL_CALL_PARSERS, NamedToolCall, ParsedText,
                                             StreamParser, required_calls)

# vLLM's refusal of "auto" where the server reads no calls.
AUTO_TOOL_CHOICE_REFUSAL = ('"auto" tool choice requires --enable-auto-tool-choice and '
                            "--tool-call-parser to be set")
TOOL_CHOICE_MODES = ("none", "auto", "required", "named")


@dataclass(frozen=True, slots=True)
class OutputParsers:
    """The operator's choice of parsers (see `EngineConfig`)."""

    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """mode: one of TOOL_CHOICE_MODES, or "" for OpenAI's default ("auto" with tools, else
    "none"); name: the named mode's tool; parallel: whether "required" may call several."""

    mode: str = ""
    name: str = ""
    parallel: bool = True


class ChatOutputParser:
    """One sequence's output read as reasoning, content and tool calls."""

    def __init__(self, reasoning: ReasoningParser | None, calls: StreamParser | None) -> None:
        self._reasoning = reasoning
        self._calls = calls

    def feed(self, text: str) -> ParsedText:
        return self._read(self._reasoning.feed(text) if self._reasoning else ParsedText(text),
                          final=False)

    def finish(self) -> ParsedText:
        return self._read(self._reasoning.finish() if self._reasoning else ParsedText(),
                          final=True)

    def _read(self, split: ParsedText, *, final: bool) -> ParsedText:
        if self._calls is None:
            return split
        answer = self._calls.feed(split.content)
        if final:
            answer += self._calls.finish()
        return ParsedText(answer.content, split.reasoning, answer.tool_calls)

    @property
    def is_reasoning(self) -> bool:
        """Whether the output so far ends inside the reasoning."""
        return self._reasoning is not None and self._reasoning.is_reasoning


@dataclass(frozen=True, slots=True)
class ChatOutputPlan:
    """schema: the JSON schema generation is constrained to (None: none); make_parser: a
    parser for each sequence (None: the output is all content)."""

    schema: dict[str, object] | None = None
    make_parser: Callable[[], ChatOutputParser] | None = None


def tool_from_json(index: int, name: str, description: str, parameters_json: str) -> Tool:
    """A tool as a request gives it, its parameters' schema as JSON text, checked."""
    where = f"tools[{index}].function"
    if not name:
        raise InvalidRequest(f"{where}.name", "is required: a tool needs a name")
    try:
        parameters = json.loads(parameters_json) if parameters_json else {}
    except json.JSONDecodeError as error:
        raise InvalidRequest(f"{where}.parameters", f"is not JSON: {error}") from None
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise InvalidRequest(f"{where}.parameters", "must be a JSON schema of an object "
                             '({"type": "object", "properties": {...}})')
    return Tool(name, description, parameters)


def plan_chat_output(tools: Sequence[Tool], choice: ToolChoice, parsers: OutputParsers, *,
                     piecewise: bool = False) -> ChatOutputPlan:
    """The constraint and parsers of a chat request's answer, or InvalidRequest. piecewise:
    calls come out as they are written (a streamed answer; see tool_parsers.py)."""
    mode = choice.mode or ("auto" if tools else "none")
    if mode not in TOOL_CHOICE_MODES:
        raise InvalidRequest("tool_choice", f"must be one of {', '.join(TOOL_CHOICE_MODES)}; "
                             f"got {mode!r}")
    if mode in ("required", "named") and not tools:
        raise InvalidRequest("tool_choice", f'"{mode}" needs tools to call: tools is empty')
    reasoning = REASONING_PARSERS.get(parsers.reasoning_parser or "")
    if mode == "required":
        return ChatOutputPlan(required_schema(tools, choice.parallel),
                              lambda: ChatOutputParser(None, required_calls(
                                  piecewise=piecewise)))
    if mode == "named":
        tool = next((tool for tool in tools if tool.name == choice.name), None)
        if tool is None:
            raise InvalidRequest("tool_choice.function.name", f"{choice.name!r} is not one of "
                                 "the tools: " + ", ".join(tool.name for tool in tools))
        return ChatOutputPlan(arguments_schema(tool),
                              lambda: ChatOutputParser(None, NamedToolCall(tool.name)))
    calls = None
    if mode == "auto" and tools:
        if not parsers.enable_auto_tool_choice or parsers.tool_call_parser is None:
            raise InvalidRequest("tool_choice", AUTO_TOOL_CHOICE_REFUSAL)
        calls = TOOL_CALL_PARSERS[parsers.tool_call_parser]
    if reasoning is None and calls is None:
        return ChatOutputPlan()
    return ChatOutputPlan(make_parser=lambda: ChatOutputParser(
        reasoning() if reasoning else None, calls(piecewise=piecewise) if calls else None))


def arguments_schema(tool: Tool) -> dict[str, object]:
    """The tool's parameters; for one that takes none, the empty object (a schema of any
    object would let the model write anything, and takes seconds to compile)."""
    if "properties" not in tool.parameters:
        return {"type": "object", "properties": {}, "additionalProperties": False}
    return dict(tool.parameters)


def required_schema(tools: Sequence[Tool], parallel: bool) -> dict[str, object]:
    """A JSON array of calls of the tools, at least one (one only where not parallel)."""
    call = {"anyOf": [{"type": "object",
                       "properties": {"name": {"const": tool.name},
                                      "arguments": arguments_schema(tool)},
                       "required": ["name", "arguments"]} for tool in tools]}
    schema: dict[str, object] = {"type": "array", "items": call, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema
