"""A chat request's tool choice against its tools and the operator's parsers: the schema that
constrains a required or named choice, the parser that reads the answer, and refusals that
name the field (vLLM's message for "auto" where the server reads no calls)."""

from __future__ import annotations

import json
import re

import pytest
from outlines_core.json_schema import build_regex_from_schema

from switchboard.engine.chat import Tool
from switchboard.engine.chat_output import (AUTO_TOOL_CHOICE_REFUSAL, OutputParsers,
                                            ToolChoice, plan_chat_output, tool_from_json)
from switchboard.engine.config import EngineConfig
from switchboard.engine.errors import InvalidRequest

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"]})
CLOCK = Tool("get_time")
AUTO = OutputParsers(tool_call_parser="hermes", enable_auto_tool_choice=True)


def test_without_tools_auto_and_the_default_mean_no_tools() -> None:
    for choice in (ToolChoice(), ToolChoice("auto"), ToolChoice("none")):
        assert plan_chat_output((), choice, OutputParsers()).make_parser is None


def test_auto_reads_the_models_calls_with_the_operators_parser() -> None:
    plan = plan_chat_output((WEATHER,), ToolChoice(), AUTO)
    assert plan.schema is None
    parsed = plan.make_parser().feed('Sure.<tool_call>{"name": "get_weather", '
                                     '"arguments": {"city": "Oslo"}}</tool_call>')
    assert parsed.content == "Sure." and parsed.tool_calls[0].name == "get_weather"


@pytest.mark.parametrize("choice, output", [
    (ToolChoice(), '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}'),
    (ToolChoice("required"), '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]')],
    ids=["auto", "required"])
def test_a_streamed_answers_calls_come_as_they_are_written(choice, output) -> None:
    """Read whole, a call comes out once its JSON parses; streamed, its arguments come out
    as they are written."""
    for piecewise, num_pieces in ((False, 1), (True, len('{"city": "Oslo"}'))):
        parser = plan_chat_output((WEATHER,), choice, AUTO, piecewise=piecewise).make_parser()
        pieces = [parser.feed(char).tool_calls for char in output] + [parser.finish().tool_calls]
        arguments = [call.arguments for piece in pieces for call in piece if call.arguments]
        assert len(arguments) == num_pieces and "".join(arguments) == '{"city": "Oslo"}'


def test_a_required_choice_constrains_to_an_array_of_calls_of_the_tools() -> None:
    plan = plan_chat_output((WEATHER, CLOCK), ToolChoice("required", parallel=False),
                            OutputParsers())
    pattern = build_regex_from_schema(json.dumps(plan.schema))
    calls = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    assert re.fullmatch(pattern, calls)
    assert re.fullmatch(pattern, '[{"name": "get_time", "arguments": {}}]')
    assert not re.fullmatch(pattern, '[{"name": "get_weather", "arguments": {}}]')
    assert not re.fullmatch(pattern, calls[:-1] + ", " + calls[1:])  # not parallel
    parser = plan.make_parser()
    assert [call.name for call in (parser.feed(calls) + parser.finish()).tool_calls
            if call.name] == ["get_weather"]


def test_a_named_choice_constrains_to_that_tools_arguments() -> None:
    plan = plan_chat_output((WEATHER, CLOCK), ToolChoice("named", "get_weather"), AUTO)
    assert plan.schema == WEATHER.parameters
    first = plan.make_parser().feed('{"city"').tool_calls[0]
    assert (first.name, first.arguments) == ("get_weather", '{"city"')


def test_reasoning_splits_where_the_operator_chose_a_reasoning_parser() -> None:
    plan = plan_chat_output((), ToolChoice(), OutputParsers(reasoning_parser="deepseek_r1"))
    parser = plan.make_parser()
    parsed = parser.feed("Hmm.</think>Hello") + parser.finish()
    assert (parsed.reasoning, parsed.content) == ("Hmm.", "Hello")


@pytest.mark.parametrize("tools, choice, parsers, field, message", [
    ((WEATHER,), ToolChoice(), OutputParsers(), "tool_choice", AUTO_TOOL_CHOICE_REFUSAL),
    ((WEATHER,), ToolChoice("auto"), OutputParsers(tool_call_parser="hermes"), "tool_choice",
     AUTO_TOOL_CHOICE_REFUSAL),
    ((WEATHER,), ToolChoice("named", "get_time"), AUTO, "tool_choice.function.name",
     "'get_time' is not one of the tools: get_weather"),
    ((), ToolChoice("required"), AUTO, "tool_choice", "needs tools"),
], ids=["default-auto-without-parser", "auto-not-enabled", "named-unknown", "required-no-tools"])
def test_refusals_name_the_field(tools, choice, parsers, field: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        plan_chat_output(tools, choice, parsers)
    assert refused.value.field == field and message in refused.value.message


@pytest.mark.parametrize("name, parameters, field", [
    ("", "{}", "tools[2].function.name"),
    ("f", '{"type": "string"}', "tools[2].function.parameters"),
    ("f", "[]", "tools[2].function.parameters"),
    ("f", "{", "tools[2].function.parameters"),
])
def test_a_tool_without_a_name_or_an_object_schema_is_refused(name: str, parameters: str,
                                                              field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        tool_from_json(2, name, "", parameters)
    assert refused.value.field == field


@pytest.mark.parametrize("settings, message", [
    ({"tool_call_parser": "xml"}, "tool_call_parser must be one of hermes, llama3_json, mistral"),
    ({"reasoning_parser": "o1"}, "reasoning_parser must be one of deepseek_r1, qwen3"),
    ({"enable_auto_tool_choice": True}, "enable_auto_tool_choice needs a tool_call_parser"),
])
def test_the_operators_parsers_are_checked_at_start(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**settings)
