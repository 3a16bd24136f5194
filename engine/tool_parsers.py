"""Tool calls in a model's output, by the format it writes them in (vLLM's --tool-call-parser
names), read from a stream of text deltas: a call's text never comes out as content, text
that is not a call does, and so does a call whose JSON does not parse.

Each parser holds back what may still turn out to be a call (a marker's first characters, a
call whose JSON is not closed yet) and lets out the rest. A call comes out once its JSON is
whole: its id and name first, then its arguments. Read `piecewise` (a streamed answer), a
call comes out as soon as its name is whole and its arguments' object begun, and its
arguments then as they are written, as OpenAI and vLLM stream them; where generation is
constrained to one named tool's arguments (`NamedToolCall`), they always come out so.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# What a model writes a call as: {"name": ..., "arguments": {...}} (Llama 3 says "parameters").
CallValue = tuple[str, object]
SEPARATORS = " \n\t;"  # between calls where a call must open the output (Llama 3's ";")
# How a call opens when it is read piecewise: its name, then the object of its arguments.
CALL_OPENING = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*'
                          r'"(?:arguments|parameters)"\s*:\s*(?=\{)')


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of call `index`: its first piece carries the call's id and name, every piece
    a piece of its arguments' JSON text."""

    index: int
    arguments: str
    id: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class ParsedText:
    """What a piece of a model's output turned out to be."""

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()

    def __add__(self, other: ParsedText) -> ParsedText:
        return ParsedText(self.content + other.content, self.reasoning + other.reasoning,
                          self.tool_calls + other.tool_calls)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def held_prefix_length(text: str, markers: Sequence[str]) -> int:
    """How many of text's last characters begin one of the markers (and may yet complete it)."""
    longest = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:length]):
                longest = length
                break
    return longest


def json_value_end(text: str, start: int) -> int | None:
    """Where the JSON object or array opening at text[start] ends (one past its last bracket),
    None while it is not closed."""
    depth = 0
    in_string = escaped = False
    for position in range(start, len(text)):
        char = text[position]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return position + 1
    return None


def _call_of(value: object) -> CallValue | None:
    """{"name": string, "arguments" or "parameters": object} as a call."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return (value["name"], arguments) if isinstance(arguments, dict) else None


def one_call(value: object) -> list[CallValue] | None:
    call = _call_of(value)
    return None if call is None else [call]


def call_list(value: object) -> list[CallValue] | None:
    if not isinstance(value, list) or not value:
        return None
    calls = [_call_of(item) for item in value]
    return None if None in calls else calls


class StreamParser:
    """A parser of an output fed in deltas, holding back in `_buffer` what it cannot tell
    yet; `finish` at the output's end tells the rest."""

    def __init__(self) -> None:
        self._buffer = ""

    def feed(self, text: str) -> ParsedText:
        self._buffer += text
        return self._scan(final=False)

    def finish(self) -> ParsedText:
        return self._scan(final=True)

    def _scan(self, *, final: bool) -> ParsedText:
        raise NotImplementedError


@dataclass(slots=True)
class StreamedCall:
    """A call let out piecewise: its index, and how much of its arguments' text is out."""

    index: int
    num_sent: int = 0


class JsonCallParser(StreamParser):
    """Calls written as JSON after an opening marker (a marker that is "{" or "[" opens the
    JSON itself), optionally followed by a closing one: one call, or a `listed` array of them.
    at_start: calls only where the output begins with one, or right after another (separated
    by whitespace or ";"), as Llama 3's and constrained outputs; elsewhere a marker anywhere
    in the text opens a call. piecewise: see the module's docstring."""

    def __init__(self, openings: Sequence[str], *, listed: bool = False, closing: str = "",
                 at_start: bool = False, piecewise: bool = False) -> None:
        super().__init__()
        self._openings = tuple(openings)
        self._calls_of: Callable[[object], list[CallValue] | None] = \
            call_list if listed else one_call
        self._listed = listed
        self._closing = closing
        self._at_start = at_start
        self._piecewise = piecewise
        self._num_calls = 0
        self._is_text = False  # at_start, and the output turned out to be text
        # The calls of the JSON value at the buffer's start that are out already.
        self._streamed: list[StreamedCall] = []

    def _scan(self, *, final: bool) -> ParsedText:
        parsed = ParsedText()
        while self._buffer:
            if self._is_text:
                parsed, self._buffer = parsed + ParsedText(self._buffer), ""
                break
            start = self._call_start()
            if start is None:
                parsed += self._text_without_call(final)
                break
            before, self._buffer = self._buffer[:start], self._buffer[start:]
            # Whitespace between text and a call, or between calls, belongs to neither.
            parsed += ParsedText("" if self._at_start else before.rstrip())
            call, is_whole = self._take_call(final)
            parsed += call
            if not is_whole:
                break
        return parsed

    def _text_without_call(self, final: bool) -> ParsedText:
        """The buffer, in which no call begins: content, but for what may begin one (and
        trailing whitespace, which may come before one)."""
        if self._at_start:
            stripped = self._buffer.lstrip(SEPARATORS)
            may_open = any(marker.startswith(stripped) for marker in self._openings)
            if stripped and (final or not may_open):
                self._is_text = True
                return self._scan(final=final)
            if not final:
                return ParsedText()  # separators, or a marker's beginning: wait
        elif not final:
            cut = len(self._buffer[:len(self._buffer)
                                   - held_prefix_length(self._buffer, self._openings)].rstrip())
            text, self._buffer = self._buffer[:cut], self._buffer[cut:]
            return ParsedText(text)
        text, self._buffer = self._buffer, ""
        return ParsedText("" if self._num_calls and not text.strip() else text)

    def _call_start(self) -> int | None:
        if self._at_start:
            stripped = self._buffer.lstrip(SEPARATORS)
            found = any(stripped.startswith(marker) for marker in self._openings)
            return len(self._buffer) - len(stripped) if found else None
        starts = [index for index in (self._buffer.find(marker) for marker in self._openings)
                  if index >= 0]
        return min(starts) if starts else None

    def _take_call(self, final: bool) -> tuple[ParsedText, bool]:
        """The call at the buffer's start, taken off it once whole: as calls, or as content
        where it is not one; and whether it was whole (else more may come, and what is out
        of it piecewise comes now)."""
        marker = next(marker for marker in self._openings if self._buffer.startswith(marker))
        value_start = len(self._buffer) - len(self._buffer[0 if marker in "{[" else len(marker):]
                                              .lstrip())
        if value_start == len(self._buffer) and not final:
            return ParsedText(), False
        if self._buffer[value_start:value_start + 1] not in ("{", "["):
            return self._as_text(len(marker)), True
        end = json_value_end(self._buffer, value_start)
        # A value seen whole before any of it is out comes out whole, checked.
        streamed = self._stream_calls(value_start) if self._piecewise and (
            end is None or self._streamed) else ParsedText()
        if end is None:
            if self._streamed and final:  # cut short: what is left is the call's, not content
                self._buffer, self._streamed = "", []
            elif final:
                return self._as_text(len(self._buffer)), True
            return streamed, False
        call_end = end
        if self._closing:
            rest = self._buffer[end:]
            tail = rest.lstrip()
            if tail.startswith(self._closing):
                call_end = len(self._buffer) - len(tail) + len(self._closing)
            elif not final and self._closing.startswith(tail):
                return streamed, False  # the closing marker may be on its way
        try:
            calls = self._calls_of(json.loads(self._buffer[value_start:end]))
        except json.JSONDecodeError:
            calls = None
        num_streamed, self._streamed = len(self._streamed), []
        if calls is None and not num_streamed:
            return self._as_text(call_end), True
        self._buffer = self._buffer[call_end:]
        return streamed + ParsedText(tool_calls=tuple(self._deltas(calls[num_streamed:]
                                                                   if calls else []))), True

    def _stream_calls(self, value_start: int) -> ParsedText:
        """What has come of the calls of the JSON value at value_start since the last look:
        a call's id and name once its name is whole and its arguments' object begun, then
        its arguments' text as written. A call that opens otherwise (its arguments first)
        waits to come out whole."""
        text = self._buffer
        if (text[value_start] == "[") != self._listed:
            return ParsedText()
        deltas = []
        position = value_start + 1 if self._listed else value_start
        for number in itertools.count():
            if self._listed:
                position = len(text) - len(text[position:].lstrip())
                if number:
                    if text[position:position + 1] != ",":
                        break
                    position = len(text) - len(text[position + 1:].lstrip())
            opening = CALL_OPENING.match(text, position)
            try:
                name = json.loads(opening.group(1)) if opening else None
            except json.JSONDecodeError:
                name = None
            if name is None:
                break
            if number == len(self._streamed):
                self._streamed.append(StreamedCall(self._num_calls))
                self._num_calls += 1
                deltas.append(ToolCallDelta(self._streamed[number].index, "", new_call_id(),
                                            name))
            call = self._streamed[number]
            arguments_end = json_value_end(text, opening.end())
            piece = text[opening.end() + call.num_sent:arguments_end or len(text)]
            if piece:
                deltas.append(ToolCallDelta(call.index, piece))
                call.num_sent += len(piece)
            position = json_value_end(text, position) if arguments_end else None
            if position is None or not self._listed:
                break
        return ParsedText(tool_calls=tuple(deltas))

    def _as_text(self, length: int) -> ParsedText:
        text, self._buffer = self._buffer[:length], self._buffer[length:]
        if self._at_start:
            self._is_text = True
        return ParsedText(text)

    def _deltas(self, calls: list[CallValue]) -> list[ToolCallDelta]:
        deltas = []
        for name, arguments in calls:
            index, self._num_calls = self._num_calls, self._num_calls + 1
            deltas += [ToolCallDelta(index, "", new_call_id(), name),
                       ToolCallDelta(index, json.dumps(arguments, ensure_ascii=False))]
        return deltas


class NamedToolCall(StreamParser):
    """An output constrained to one named tool's arguments: one call, streamed as written."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name
        self._started = False

    def _scan(self, *, final: bool) -> ParsedText:
        text, self._buffer = self._buffer, ""
        if not text:
            return ParsedText()
        first, self._started = not self._started, True
        return ParsedText(tool_calls=(ToolCallDelta(0, text, new_call_id(), self._name) if first
                                      else ToolCallDelta(0, text),))


def hermes(*, piecewise: bool = False) -> JsonCallParser:
    """<tool_call>{"name": ..., "arguments": {...}}</tool_call>, as Hermes, Qwen2.5, Qwen3
    and SmolLM3 write them, anywhere in the text."""
    return JsonCallParser(("<tool_call>",), closing="</tool_call>", piecewise=piecewise)


def llama3_json(*, piecewise: bool = False) -> JsonCallParser:
    """Llama 3.x's JSON calls: the output is {"name": ..., "parameters": {...}} (after an
    optional <|python_tag|>), several separated by ";"."""
    return JsonCallParser(("<|python_tag|>", "{"), at_start=True, piecewise=piecewise)


def mistral(*, piecewise: bool = False) -> JsonCallParser:
    """Mistral's [TOOL_CALLS] followed by a JSON array of {"name", "arguments"}."""
    return JsonCallParser(("[TOOL_CALLS]",), listed=True, piecewise=piecewise)


def required_calls(*, piecewise: bool = False) -> JsonCallParser:
    """An output constrained to a JSON array of calls (see `tool_choice_schema`)."""
    return JsonCallParser(("[",), listed=True, at_start=True, piecewise=piecewise)


TOOL_CALL_PARSERS: dict[str, Callable[..., JsonCallParser]] = {
    "hermes": hermes, "llama3_json": llama3_json, "mistral": mistral}


def parse_whole(parser: StreamParser, text: str) -> ParsedText:
    """A whole output at once, as the same parser reads a stream."""
    return parser.feed(text) + parser.finish()
