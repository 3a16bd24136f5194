"""The server reads each response's text as content, reasoning and tool-call pieces, and counts
the reasoning's tokens, as the parsers of a chat request's plan say."""

from __future__ import annotations

from switchboard.engine.chat import Tool
from switchboard.engine.chat_output import OutputParsers, ToolChoice, plan_chat_output
from switchboard.proto import switchboard_pb2 as sb
from switchboard.server.generation import parse_output

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})
PARSERS = OutputParsers(tool_call_parser="hermes", enable_auto_tool_choice=True,
                        reasoning_parser="qwen3")
OUTPUT = ["<think>", "Rain?", "</think>", "\n<tool_call>", '\n{"name": "get_weather", ',
          '"arguments": {"city": "Oslo"}}', "\n</tool_call>"]


def test_responses_carry_content_reasoning_calls_and_reasoning_tokens() -> None:
    parser = plan_chat_output((WEATHER,), ToolChoice(), PARSERS).make_parser()
    responses = []
    for number, text in enumerate(OUTPUT):
        response = sb.GenerateResponse(text=text, tokens=[sb.Token(id=number)],
                                       finish_reason="eos_token" if number == 6 else "")
        parse_output(response, parser)
        responses.append(response)
    assert "".join(r.text for r in responses) == ""
    assert "".join(r.reasoning_text for r in responses) == "Rain?"
    assert [r.reasoning_tokens for r in responses] == [1, 1, 1, 0, 0, 0, 0]
    calls = [call for r in responses for call in r.tool_calls]
    assert (calls[0].name, "".join(c.arguments for c in calls)) == ("get_weather",
                                                                    '{"city": "Oslo"}')
