"""Tool-call and reasoning parsers over outputs written in each format: one call, several,
calls after text, malformed JSON (content), read whole and as streams of deltas cut
everywhere; a call's text never comes out as content."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from switchboard.engine.reasoning import REASONING_PARSERS
from switchboard.engine.tool_parsers import (TOOL_CALL_PARSERS, NamedToolCall, ParsedText,
                                             parse_whole, required_calls)

WEATHER = {"city": "Paris", "unit": "celsius"}
TIME = {"zone": "Europe/Paris"}


def calls_of(parsed: ParsedText) -> list[tuple[str, dict]]:
    """The calls as (name, arguments), checking each has one id and arguments that parse."""
    calls: dict[int, dict[str, str]] = {}
    for delta in parsed.tool_calls:
        call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
        if delta.id:
            assert not call["id"] and delta.id.startswith("call_")
            call.update(id=delta.id, name=delta.name)
        call["arguments"] += delta.arguments
    assert sorted(calls) == list(range(len(calls)))
    return [(call["name"], json.loads(call["arguments"])) for _, call in sorted(calls.items())]


def streamed(make: Callable[[], object], text: str, size: int) -> list[ParsedText]:
    parser = make()
    pieces = [parser.feed(text[i:i + size]) for i in range(0, len(text), size)]
    return [*pieces, parser.finish()]


def total(pieces: list[ParsedText]) -> ParsedText:
    result = ParsedText()
    for piece in pieces:
        result += piece
    return result


def hermes_call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


CASES = {
    "hermes": [
        (hermes_call("get_weather", WEATHER), "", [("get_weather", WEATHER)]),
        (hermes_call("get_weather", WEATHER) + "\n" + hermes_call("get_time", TIME), "",
         [("get_weather", WEATHER), ("get_time", TIME)]),
        ("Let me look that up.\n" + hermes_call("get_time", TIME), "Let me look that up.",
         [("get_time", TIME)]),
        ('<tool_call>{"name": "get_time", "arguments": {zone}}</tool_call> then text',
         '<tool_call>{"name": "get_time", "arguments": {zone}}</tool_call> then text', []),
        ("No tools needed: 2 < 3 and {braces} are fine.",
         "No tools needed: 2 < 3 and {braces} are fine.", []),
        ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}',
         "", [("get_time", {"zone": "UTC"})]),  # the end of the turn closes it
        ('<tool_call>{"name": "get_time", "argu', '<tool_call>{"name": "get_time", "argu', []),
    ],
    "llama3_json": [
        (json.dumps({"name": "get_weather", "parameters": WEATHER}), "",
         [("get_weather", WEATHER)]),
        ("<|python_tag|>" + json.dumps({"name": "get_weather", "parameters": WEATHER}) + "; "
         + json.dumps({"name": "get_time", "parameters": TIME}), "",
         [("get_weather", WEATHER), ("get_time", TIME)]),
        ('The answer is {"name": "x"}.', 'The answer is {"name": "x"}.', []),
        ('{"name": "get_time", "parameters": {"zone": }}',
         '{"name": "get_time", "parameters": {"zone": }}', []),
        ('{"city": "Paris"}', '{"city": "Paris"}', []),  # JSON, but no call
    ],
    "mistral": [
        ("[TOOL_CALLS] " + json.dumps([{"name": "get_weather", "arguments": WEATHER}]), "",
         [("get_weather", WEATHER)]),
        ("[TOOL_CALLS]" + json.dumps([{"name": "get_weather", "arguments": WEATHER},
                                      {"name": "get_time", "arguments": TIME}]), "",
         [("get_weather", WEATHER), ("get_time", TIME)]),
        ("Checking. [TOOL_CALLS] " + json.dumps([{"name": "get_time", "arguments": TIME}]),
         "Checking.", [("get_time", TIME)]),
        ('[TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": "UTC"]}',
         '[TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": "UTC"]}', []),
    ],
}
EXAMPLES = [(name, *case) for name, cases in CASES.items() for case in cases]


@pytest.mark.parametrize("name,output,content,calls", EXAMPLES)
def test_a_whole_output_splits_into_content_and_calls(name: str, output: str, content: str,
                                                      calls: list) -> None:
    parsed = parse_whole(TOOL_CALL_PARSERS[name](), output)
    assert parsed.content == content
    assert calls_of(parsed) == calls


@pytest.mark.parametrize("size", [1, 2, 5, 13])
@pytest.mark.parametrize("name,output,content,calls", EXAMPLES)
def test_a_streamed_output_gives_the_same_and_never_shows_a_call_as_content(
        name: str, output: str, content: str, calls: list, size: int) -> None:
    pieces = streamed(TOOL_CALL_PARSERS[name], output, size)
    assert total(pieces).content == content
    assert calls_of(total(pieces)) == calls
    if calls:
        assert not any("tool_call" in piece.content or "TOOL_CALLS" in piece.content
                       or '"name"' in piece.content for piece in pieces)


def test_a_calls_id_and_name_come_before_its_arguments() -> None:
    parser = TOOL_CALL_PARSERS["hermes"]()
    deltas = parser.feed(hermes_call("get_time", TIME)).tool_calls
    assert (deltas[0].id, deltas[0].name, deltas[0].arguments) != ("", "", "")
    assert deltas[0].arguments == "" and all(not delta.id for delta in deltas[1:])


def test_text_comes_out_as_it_is_written_while_no_call_begins() -> None:
    parser = TOOL_CALL_PARSERS["hermes"]()
    assert parser.feed("The weather is").content == "The weather is"
    assert parser.feed(" fine <tool").content == " fine"  # "<tool" may open a call
    assert parser.feed("s> are sharp").content == " <tools> are sharp"


def test_a_constrained_array_of_calls_and_a_named_tools_arguments() -> None:
    array = json.dumps([{"name": "get_weather", "arguments": WEATHER},
                        {"name": "get_time", "arguments": TIME}])
    for size in (1, 7, len(array)):
        assert calls_of(total(streamed(required_calls, array, size))) == [
            ("get_weather", WEATHER), ("get_time", TIME)]
    arguments = json.dumps(WEATHER)
    pieces = streamed(lambda: NamedToolCall("get_weather"), arguments, 4)
    assert calls_of(total(pieces)) == [("get_weather", WEATHER)]
    assert len([piece for piece in pieces if piece.tool_calls]) > 2  # as they are written


# Calls written token by token as each format writes them, read piecewise (a streamed
# answer): (parser, output, content, calls).
PIECEWISE = [
    ("hermes", "Let me look that up.\n" + hermes_call("get_weather", WEATHER) + "\n"
     + hermes_call("get_time", TIME), "Let me look that up.",
     [("get_weather", WEATHER), ("get_time", TIME)]),
    ("llama3_json", "<|python_tag|>" + json.dumps({"name": "get_weather", "parameters": WEATHER})
     + "; " + json.dumps({"name": "get_time", "parameters": TIME}), "",
     [("get_weather", WEATHER), ("get_time", TIME)]),
    ("mistral", "[TOOL_CALLS] " + json.dumps([{"name": "get_weather", "arguments": WEATHER},
                                              {"name": "get_time", "arguments": TIME}]), "",
     [("get_weather", WEATHER), ("get_time", TIME)]),
]


def piecewise(name: str) -> Callable[[], object]:
    return lambda: TOOL_CALL_PARSERS[name](piecewise=True)


@pytest.mark.parametrize("size", [1, 3])
@pytest.mark.parametrize("name,output,content,calls", PIECEWISE)
def test_read_piecewise_a_calls_arguments_come_as_the_model_writes_them(
        name: str, output: str, content: str, calls: list, size: int) -> None:
    pieces = streamed(piecewise(name), output, size)
    assert total(pieces).content == content
    assert calls_of(total(pieces)) == calls
    assert not any("tool_call" in piece.content or "TOOL_CALLS" in piece.content
                   or '"name"' in piece.content for piece in pieces)
    for index, (_, arguments) in enumerate(calls):
        first, *rest = [delta for piece in pieces for delta in piece.tool_calls
                        if delta.index == index]
        assert first.id and first.arguments == ""  # its id and name before its arguments
        assert len(rest) >= len(json.dumps(arguments)) // size - 1  # a piece per feed
        assert all(not delta.id for delta in rest)


def test_read_piecewise_a_call_comes_out_once_its_name_is_whole() -> None:
    parser = TOOL_CALL_PARSERS["hermes"](piecewise=True)
    assert parser.feed('<tool_call>\n{"name": "get_wea').tool_calls == ()
    assert parser.feed('ther", "arguments": ').tool_calls == ()
    header, arguments = parser.feed('{"city": "Pa').tool_calls
    assert (header.name, header.arguments) == ("get_weather", "")
    assert arguments.arguments == '{"city": "Pa' and not arguments.id
    rest = parser.feed('ris"}}\n</tool_call> Done.') + parser.finish()
    assert [delta.arguments for delta in rest.tool_calls] == ['ris"}']
    assert rest.content == " Done."


def test_read_piecewise_a_call_cut_short_stays_a_call_and_its_text_never_content() -> None:
    pieces = streamed(piecewise("hermes"), '<tool_call>{"name": "get_time", "arguments": '
                      '{"zone": "Europe/Pa', 4)
    assert total(pieces).content == ""
    [header, *arguments] = total(pieces).tool_calls
    assert header.name == "get_time"
    assert "".join(delta.arguments for delta in arguments) == '{"zone": "Europe/Pa'


@pytest.mark.parametrize("output, content", [
    ('<tool_call>{"name": "get_time", "arguments": {zone}}</tool_call>',
     '<tool_call>{"name": "get_time", "arguments": {zone}}</tool_call>'),
    ('<tool_call>{"arguments": {"zone": "UTC"}, "name": "get_time"}</tool_call>', ""),
])
def test_read_piecewise_a_call_seen_whole_or_opening_otherwise_is_checked_whole(
        output: str, content: str) -> None:
    """A call whose name does not come first waits to come out whole; one that arrives
    whole is checked first, and stays content where it is not a call."""
    for size in (1, len(output)) if content == "" else (len(output),):
        parsed = total(streamed(piecewise("hermes"), output, size))
        assert parsed.content == content
        assert calls_of(parsed) == ([] if content else [("get_time", {"zone": "UTC"})])


def test_read_whole_a_calls_arguments_come_in_one_piece_once_it_parses() -> None:
    pieces = streamed(TOOL_CALL_PARSERS["hermes"], hermes_call("get_weather", WEATHER), 1)
    assert [len(piece.tool_calls) for piece in pieces if piece.tool_calls] == [2]


def test_a_required_choices_calls_read_piecewise_stream_each_calls_arguments() -> None:
    array = json.dumps([{"name": "get_weather", "arguments": WEATHER},
                        {"name": "get_time", "arguments": TIME}])
    pieces = streamed(lambda: required_calls(piecewise=True), array, 2)
    assert calls_of(total(pieces)) == [("get_weather", WEATHER), ("get_time", TIME)]
    for index, arguments in enumerate((WEATHER, TIME)):
        assert len([delta for piece in pieces for delta in piece.tool_calls
                    if delta.index == index]) > len(json.dumps(arguments)) // 2


REASONING = [
    ("qwen3", "<think>\nThe user greets me.\n</think>\n\nHello!", "\nThe user greets me.\n",
     "Hello!"),
    ("qwen3", "Hello, no thinking.", "", "Hello, no thinking."),
    ("qwen3", "<think>unfinished thought", "unfinished thought", ""),
    ("deepseek_r1", "<think>Hmm.</think>The answer is 4.", "Hmm.", "The answer is 4."),
    ("deepseek_r1", "Opened in the prompt.</think>\n4", "Opened in the prompt.", "4"),
    ("deepseek_r1", "Still thinking", "Still thinking", ""),
]


@pytest.mark.parametrize("size", [1, 3, 100])
@pytest.mark.parametrize("name,output,reasoning,content", REASONING)
def test_reasoning_splits_from_the_answer_whole_and_streamed(
        name: str, output: str, reasoning: str, content: str, size: int) -> None:
    pieces = streamed(REASONING_PARSERS[name], output, size)
    assert (total(pieces).reasoning, total(pieces).content) == (reasoning, content)
    assert not any("think>" in piece.content + piece.reasoning for piece in pieces)
