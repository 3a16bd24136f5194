"""OpenAI's Responses API (POST /v1/responses, as vLLM serves it) ⇄ switchboard.v1 Generate.

`input` is a string (one user message) or a list of messages (`role` user, system, developer
or assistant; `content` a string or text parts, `input_text` or `output_text`), after
`instructions` as a system message, rendered with the model's chat template on the server.
Sampling is chat's (see openai.py: temperature 0 is greedy, vLLM's extras are accepted);
`max_output_tokens` bounds the answer, which then ends "incomplete" with
`incomplete_details.reason` "max_output_tokens"; `text.format` asks for JSON; `include`
"message.output_text.logprobs" (with `top_logprobs`) adds the tokens' log-probabilities.
Function tools (`tools` of `{"type": "function", "name", "description", "parameters"}`,
`tool_choice`, `parallel_tool_calls`) work as on chat (openai_tools.py): the answer's calls are
`function_call` output items (`call_id`, `name`, `arguments`) after its message (left out when
it has no text), and `input` takes earlier calls (`function_call` items) and their results
(`function_call_output` items, `call_id` and `output`). With the server's reasoning parser,
the model's thinking is a `reasoning` output item (its `reasoning_text` content) before the
message, and its tokens count in `output_tokens_details.reasoning_tokens`. Nothing is stored, so the reply says
`store: false`, and a `previous_response_id` is not found (404, as vLLM without its store);
reasoning effort, other `include` values, background mode and `truncation: "auto"` are
refused, naming them.

Streamed, the reply is OpenAI's events, each `event: <type>` with its JSON (`type`,
`sequence_number`): response.created, response.in_progress, response.output_item.added and
response.content_part.added with the first text, response.output_text.delta for each piece of
text, and per call response.output_item.added then response.function_call_arguments.delta for
each piece of its arguments (reasoning: its item, then response.reasoning_text.delta events); at
the end each item's done events (response.output_text.done and
response.content_part.done, response.function_call_arguments.done or
response.reasoning_text.done; then
response.output_item.done) and response.completed. An error after the first event is an `error` event, which ends the stream.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from switchboard.gateway.errors import RequestError, bad_request
from switchboard.gateway.protocols.exchange import Answer, Exchange, ServedModel
from switchboard.gateway.protocols.generation import (Generation, SequenceResult, add_output_format,
                                          generate_request, optional_bool)
from switchboard.gateway.protocols import openai_tools
from switchboard.gateway.protocols.kserve import require_object
from switchboard.gateway.protocols.openai import (IGNORED_FIELDS, NAMES, SAMPLING_FIELDS, UNLIMITED,
                                      OpenAIProtocol, checked_document, message_text,
                                      requested_model, sampling_values, token_limit,
                                      token_logprobs)
from switchboard.gateway.protocols.parameters import json_type
from switchboard.gateway.sse import sse_event
from switchboard.proto import switchboard_pb2 as sb

FIELDS = (SAMPLING_FIELDS - {"n"}) | frozenset(IGNORED_FIELDS) | {
    "model", "input", "instructions", "max_output_tokens", "stream", "stream_options", "text",
    "tools", "tool_choice", "parallel_tool_calls", "previous_response_id", "reasoning", "include",
    "top_logprobs", "truncation", "background"}
# Errors about the prompt name `input`; about the length, max_output_tokens; about a named
# tool, the Responses API's field (chat's nests it in `function`).
RESPONSES_NAMES = {**NAMES, "input": "prompt", "max_output_tokens": "max_new_tokens",
                   "tool_choice.name": "tool_choice.function.name"}
# Content part types that carry text (an input message's, an earlier answer's).
TEXT_PARTS = ("input_text", "output_text")
TEXT_FORMATS = ("text", "json_object", "json_schema")
ROLES = ("user", "assistant", "system", "developer")
# What `include` may ask for: the answer's log-probabilities (with top_logprobs alternatives).
LOGPROBS = "message.output_text.logprobs"
# The request's fields that the response object repeats, with OpenAI's defaults.
ECHOED_DEFAULTS: dict[str, object] = {"instructions": None, "metadata": {},
                                      "parallel_tool_calls": True, "service_tier": "auto",
                                      "temperature": 1.0, "top_logprobs": 0, "top_p": 1.0,
                                      "user": None, "tools": [], "tool_choice": "auto"}
# Input items besides messages: an earlier answer's call, and the call's result.
CALL_ITEMS = ("function_call", "function_call_output")
# The keys of an answer's reasoning and message among its output items (its calls': indexes).
REASONING, MESSAGE = "reasoning", "message"


@dataclass(frozen=True, slots=True)
class ResponsesOptions:
    model: str
    stream: bool
    logprobs: bool  # the answer's tokens' log-probabilities, in its text part and deltas
    # The request's fields the response object repeats (OpenAI's defaults where absent).
    echoed: Mapping[str, object]
    names: Mapping[str, str]
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    message_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    reasoning_id: str = field(default_factory=lambda: f"rs_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))


def request_to_pb(document: object) -> tuple[sb.GenerateRequest, ResponsesOptions]:
    document = checked_document(document, FIELDS)
    _refuse_unsupported(document)
    values = sampling_values(document)
    max_tokens = token_limit(document, "max_output_tokens")
    values["max_new_tokens"] = UNLIMITED if max_tokens is None else max_tokens
    logprobs = LOGPROBS in (document.get("include") or [])
    if logprobs:
        values.update(logprobs=True, top_logprobs=document.get("top_logprobs"))
    text_format = _text_format(document)
    names = add_output_format("text.format", _as_response_format(text_format), values,
                              RESPONSES_NAMES)
    messages = _messages(document.get("instructions"), document.get("input"))
    openai_tools.add_tools(document, messages, nested=False)
    request = generate_request(requested_model(document), messages, values, names=names)
    stream = optional_bool(document, "stream")
    echoed = {name: default if document.get(name) is None else document[name]
              for name, default in ECHOED_DEFAULTS.items()}
    echoed["max_output_tokens"] = max_tokens
    echoed["text"] = {"format": text_format}
    return request, ResponsesOptions(model=requested_model(document), stream=stream,
                                     logprobs=logprobs, echoed=echoed,
                                     names=names)


def _refuse_unsupported(document: Mapping[str, object]) -> None:
    previous = document.get("previous_response_id")
    if previous is not None:
        raise RequestError(404, f"previous_response_id: no response {previous!r} is stored: "
                           "responses are not stored here, send the conversation in `input`",
                           "previous_response_id")
    reasoning = document.get("reasoning")
    if reasoning is not None and require_object(reasoning, "reasoning").get("effort") is not None:
        raise bad_request("reasoning", "the served model does not reason")
    include = document.get("include") or []
    if not isinstance(include, list) or any(item != LOGPROBS for item in include):
        raise bad_request("include", f"may ask for {LOGPROBS!r} only")
    if document.get("background"):
        raise bad_request("background", "background mode is not supported")
    if document.get("truncation") not in (None, "disabled"):
        raise bad_request("truncation", "only \"disabled\" is supported: an input too long "
                          "for the model is refused")


def _text_format(document: Mapping[str, object]) -> dict[str, object]:
    """`text.format`: text (the default), json_object, or json_schema with its `schema`."""
    text = require_object(document.get("text") or {}, "text")
    text_format = require_object(text.get("format") or {"type": "text"}, "text.format")
    if text_format.get("type") not in TEXT_FORMATS:
        raise bad_request("text.format.type", f"must be one of {', '.join(TEXT_FORMATS)}; got "
                          f"{text_format.get('type')!r}")
    if text_format["type"] == "json_schema" and not isinstance(text_format.get("schema"), dict):
        raise bad_request("text.format.schema", f"must be a JSON schema object; got "
                          f"{json_type(text_format.get('schema'))}")
    return text_format


def _as_response_format(text_format: Mapping[str, object]) -> Mapping[str, object]:
    """`text.format` as chat's response_format, whose json_schema nests its schema."""
    if text_format["type"] != "json_schema":
        return text_format
    return {"type": "json_schema", "json_schema": {"schema": text_format["schema"]}}


def _messages(instructions: object, items: object) -> sb.ChatMessages:
    messages = sb.ChatMessages()
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("instructions", f"must be a string; got {json_type(instructions)}")
        messages.messages.add(role="system", content=instructions)
    if isinstance(items, str):
        messages.messages.add(role="user", content=items)
        return messages
    if not isinstance(items, list) or not items:
        raise bad_request("input", f"must be a string or a non-empty array of messages; got "
                          f"{json_type(items)}")
    for index, item in enumerate(items):
        where = f"input[{index}]"
        item = require_object(item, where)
        kind = item.get("type", "message")
        if kind in CALL_ITEMS:
            _add_call_item(messages, item, where)
            continue
        if kind != "message":
            raise bad_request(f"{where}.type", "must be message, function_call or "
                              f"function_call_output; got {json.dumps(kind)}")
        if item.get("content") is None:
            raise bad_request(f"{where}.content", "is required: a string or text parts")
        role = item.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role", f"must be one of {', '.join(ROLES)}; got "
                              f"{json.dumps(role)}")
        messages.messages.add(role=role,
                              content=message_text(item.get("content"), where, TEXT_PARTS))
    return messages


def _add_call_item(messages: sb.ChatMessages, item: Mapping[str, object], where: str) -> None:
    """A function_call item joins the assistant message before it (or opens one); a
    function_call_output item is a tool message."""
    for name in ("call_id", *(("name", "arguments") if item["type"] == "function_call"
                              else ("output",))):
        if not isinstance(item.get(name), str):
            raise bad_request(f"{where}.{name}", f"must be a string; got {json_type(item.get(name))}")
    if item["type"] == "function_call_output":
        messages.messages.add(role="tool", content=item["output"], tool_call_id=item["call_id"])
        return
    if not messages.messages or messages.messages[-1].role != "assistant":
        messages.messages.add(role="assistant")
    messages.messages[-1].tool_calls.add(id=item["call_id"], name=item["name"],
                                         arguments=item["arguments"])


def reply(options: ResponsesOptions, generation: Generation) -> dict[str, object]:
    """The finished response object."""
    [sequence] = generation.ordered()
    return _response(options, list(output_items(options, sequence).values()), generation,
                     sequence)


def output_items(options: ResponsesOptions, sequence: SequenceResult
                 ) -> dict[int | str, dict[str, object]]:
    """The answer's output items: its reasoning (key REASONING, when the server's reasoning
    parser found some), its message (key MESSAGE; left out when it has no text but calls),
    then its calls by index."""
    status = "incomplete" if sequence.finish_reason == "length" else "completed"
    items: dict[int | str, dict[str, object]] = {}
    reasoning = "".join(sequence.reasoning)
    if reasoning:
        items[REASONING] = _reasoning(options, reasoning)
    if sequence.generated_text or not sequence.tool_calls:
        items[MESSAGE] = _message(options, status, _text_part(options, sequence.generated_text,
                                                              sequence.tokens))
    for index, call in sorted(sequence.tool_calls.items()):
        items[index] = _function_call(call.id, call.name, "".join(call.arguments), status)
    return items


def _reasoning(options: ResponsesOptions, text: str | None) -> dict[str, object]:
    """The reasoning output item, as vLLM answers it; text None: just added, without content
    yet."""
    return {"id": options.reasoning_id, "type": "reasoning", "summary": [],
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}],
            "encrypted_content": None, "status": None}


def _function_call(call_id: str, name: str, arguments: str, status: str) -> dict[str, object]:
    return {"id": f"fc_{call_id.removeprefix('call_')}", "type": "function_call",
            "status": status, "call_id": call_id, "name": name, "arguments": arguments}


def _response(options: ResponsesOptions, output: list[dict[str, object]],
              generation: Generation | None = None,
              sequence: SequenceResult | None = None) -> dict[str, object]:
    """The response object: in progress (no generation yet), else finished."""
    done = generation is not None and sequence is not None
    cut = done and sequence.finish_reason == "length"
    status = "incomplete" if cut else "completed" if done else "in_progress"
    return {"id": options.id, "object": "response", "created_at": options.created_at,
            "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "model": options.model, "output": output,
            "previous_response_id": None, "reasoning": None, "store": False,
            "background": False, "max_tool_calls": None, "truncation": "disabled",
            "usage": _usage(generation) if done else None, **options.echoed}


def _message(options: ResponsesOptions, status: str, part: dict[str, object] | None
             ) -> dict[str, object]:
    """The answer's output item; part None: just added, without content yet."""
    return {"id": options.message_id, "type": "message", "status": status, "role": "assistant",
            "content": [] if part is None else [part]}


def _text_part(options: ResponsesOptions, text: str, tokens: list[sb.Token]
               ) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [],
            "logprobs": _logprobs(options, tokens)}


def _logprobs(options: ResponsesOptions, tokens: list[sb.Token]) -> list[dict[str, object]]:
    return token_logprobs(tokens) if options.logprobs else []


def _usage(generation: Generation) -> dict[str, object]:
    return {"input_tokens": generation.prompt_tokens,
            "input_tokens_details": {"cached_tokens": generation.cached_tokens},
            "output_tokens": generation.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": sum(
                sequence.reasoning_tokens for sequence in generation.sequences.values())},
            "total_tokens": generation.prompt_tokens + generation.completion_tokens}


class ResponseEvents:
    """A streamed response's events, numbered in order; its output items are numbered in the
    order they open: the message at its first text, a call at its first piece."""

    def __init__(self, options: ResponsesOptions) -> None:
        self.options = options
        self.sequence_number = 0
        self.started = False
        # The output index of each item opened, by its key (see output_items).
        self.opened: dict[int | str, int] = {}
        self.call_item_ids: dict[int, str] = {}

    def add(self, response: sb.GenerateResponse) -> list[bytes]:
        """The events of one piece of the answer (the opening ones before the first)."""
        events = []
        if not self.started:
            self.started = True
            in_progress = _response(self.options, [])
            events += [self._event("response.created", response=in_progress),
                       self._event("response.in_progress", response=in_progress)]
        if response.reasoning_text:
            if REASONING not in self.opened:
                self.opened[REASONING] = len(self.opened)
                events.append(self._event("response.output_item.added",
                                          output_index=self.opened[REASONING],
                                          item=_reasoning(self.options, None)))
            events.append(self._event("response.reasoning_text.delta",
                                      **self._where(REASONING), delta=response.reasoning_text))
        if response.text:
            if MESSAGE not in self.opened:
                events += self._open_message()
            events.append(self._event("response.output_text.delta", **self._where(),
                                      delta=response.text,
                                      logprobs=_logprobs(self.options, list(response.tokens))))
        for call in response.tool_calls:
            if call.index not in self.opened:
                self.opened[call.index] = len(self.opened)
                item = _function_call(call.id, call.name, "", "in_progress")
                self.call_item_ids[call.index] = item["id"]
                events.append(self._event("response.output_item.added",
                                          output_index=self.opened[call.index], item=item))
            if call.arguments:
                events.append(self._event(
                    "response.function_call_arguments.delta",
                    item_id=self.call_item_ids[call.index],
                    output_index=self.opened[call.index], delta=call.arguments))
        return events

    def finish(self, generation: Generation) -> bytes:
        """The closing events, with the whole answer."""
        [sequence] = generation.ordered()
        items = output_items(self.options, sequence)
        events = self._open_message() if MESSAGE in items and MESSAGE not in self.opened else []
        for key, index in sorted(self.opened.items(), key=lambda opened: opened[1]):
            item = items[key]
            if key == REASONING:
                [part] = item["content"]
                events.append(self._event("response.reasoning_text.done",
                                          **self._where(REASONING), text=part["text"]))
            elif key == MESSAGE:
                [part] = item["content"]
                events += [self._event("response.output_text.done", **self._where(),
                                       text=part["text"], logprobs=part["logprobs"]),
                           self._event("response.content_part.done", **self._where(),
                                       part=part)]
            else:
                events.append(self._event("response.function_call_arguments.done",
                                          item_id=item["id"], output_index=index,
                                          arguments=item["arguments"]))
            events.append(self._event("response.output_item.done", output_index=index,
                                      item=item))
        final = _response(self.options, [items[key] for key in
                                         sorted(self.opened, key=self.opened.__getitem__)],
                          generation, sequence)
        return b"".join([*events, self._event("response.completed", response=final)])

    def error(self, body: Mapping[str, object]) -> bytes:
        """OpenAI's error event, from its error body."""
        error = body["error"]
        return self._event("error", code=str(error["code"]), message=error["message"],
                           param=error["param"])

    def _open_message(self) -> list[bytes]:
        self.opened[MESSAGE] = len(self.opened)
        return [self._event("response.output_item.added", output_index=self.opened[MESSAGE],
                            item=_message(self.options, "in_progress", None)),
                self._event("response.content_part.added", **self._where(),
                            part=_text_part(self.options, "", []))]

    def _where(self, key: str = MESSAGE) -> dict[str, object]:
        return {"item_id": self.options.message_id if key == MESSAGE
                else self.options.reasoning_id,
                "output_index": self.opened[key], "content_index": 0}

    def _event(self, kind: str, **fields: object) -> bytes:
        event = sse_event({"type": kind, "sequence_number": self.sequence_number, **fields},
                          name=kind)
        self.sequence_number += 1
        return event


class ResponsesAnswer(Answer):
    def __init__(self, options: ResponsesOptions) -> None:
        super().__init__()
        self.options = options
        self.stream_events = ResponseEvents(options)

    def reply(self) -> object:
        return reply(self.options, self.generation)

    def events(self, call: int, response: sb.GenerateResponse) -> list[bytes]:
        self.collect(call, response)
        return self.stream_events.add(response)

    def end(self) -> bytes:
        return self.stream_events.finish(self.generation)

    def error_event(self, body: object) -> bytes:
        return self.stream_events.error(body)


class ResponsesProtocol(OpenAIProtocol):
    """/v1/responses."""

    async def exchange(self, document: object, served_model: ServedModel) -> Exchange:
        request, options = request_to_pb(document)
        if not options.model:
            options = dataclasses.replace(options, model=await served_model())
        return Exchange([request], options.stream, ResponsesAnswer(options),
                        options.names)


RESPONSES = ResponsesProtocol()
