"""What the TGI, vLLM and OpenAI translators share: a switchboard.v1 GenerateRequest built
from a protocol's parameters, and a generation's responses collected per sequence."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from switchboard.gateway.errors import RequestError, bad_request, field_in_protocol
from switchboard.gateway.protocols.parameters import UINT32_MAX
from switchboard.proto import generation_fields
from switchboard.proto import switchboard_pb2 as sb

# The server's name for the prompt, whatever a protocol calls it.
PROMPT = "prompt"


def generate_request(model: str, prompt: str | list[int] | sb.ChatMessages,
                     parameters: Mapping[str, object], client_id: str = "",
                     names: Mapping[str, str] | None = None) -> sb.GenerateRequest:
    """The request; an empty model names the served one. `parameters` are under MindIE's
    names; `names` (the protocol's names → MindIE's) puts a refused field back under the name
    the client sent."""
    request = sb.GenerateRequest(model_name=model, id=client_id)
    try:
        if isinstance(prompt, str):
            request.text = prompt
        elif isinstance(prompt, sb.ChatMessages):
            request.messages.CopyFrom(prompt)
        elif not all(0 <= token_id <= UINT32_MAX for token_id in prompt):
            raise bad_request(PROMPT, f"token ids must be in [0, {UINT32_MAX}]")
        else:
            request.token_ids.ids.extend(prompt)
        try:
            generation_fields.fill(request, parameters)
        except generation_fields.FieldError as error:
            raise bad_request(error.field, error.reason) from None
        return request
    except RequestError as error:
        if error.field is None or error.reason is None or not names:
            raise
        field, message = field_in_protocol(error.field, error.reason, names)
        raise RequestError(error.status, message, field) from None


def add_output_format(field: str, value: object, values: dict[str, object],
                      names: Mapping[str, str]) -> Mapping[str, str]:
    """Add the structured-output request `value` (the request's `field`) to `values` as the
    server's pattern parameter; return `names` with errors about that parameter naming
    `field`."""
    pattern = _output_pattern(field, value)
    values.update(pattern)
    return {**names, **{field: name for name in pattern}}


def _output_pattern(field: str, value: object) -> dict[str, object]:
    """A structured-output request as the server's pattern parameter: OpenAI's
    response_format ({"type": "text" | "json_object"}, or "json_schema" with
    {"json_schema": {"schema": …}}) or TGI's grammar ({"type": "json", "value": schema},
    {"type": "regex", "value": expression}, or "json_schema" with {"value": {"schema": …}}).
    `field` names the request's field in errors."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(field, f"must be an object with a type; got {json.dumps(value)}")
    kind = value.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"guided_json": {"type": "object"}}
    if kind == "json":
        return {"guided_json": _required(value, field, "value")}
    if kind == "regex":
        return {"guided_regex": _required(value, field, "value")}
    if kind == "json_schema":
        holder = "value" if "value" in value else "json_schema"
        spec = _required(value, field, holder)
        if not isinstance(spec, dict):
            raise bad_request(f"{field}.{holder}",
                              f"must be an object with a schema; got {json.dumps(spec)}")
        return {"guided_json": _required(spec, f"{field}.{holder}", "schema")}
    raise bad_request(f"{field}.type", 'must be "text", "json_object", "json_schema", "json" or '
                      f'"regex"; got {json.dumps(kind)}')


def _required(value: Mapping[str, object], field: str, name: str) -> object:
    if value.get(name) is None:
        raise bad_request(f"{field}.{name}", "is required")
    return value[name]


def renamed(values: Mapping[str, object], names: Mapping[str, str]) -> dict[str, object]:
    """A protocol's parameters under MindIE's names; nulls dropped, unnamed ones kept as is
    (the server refuses unknown names)."""
    return {names.get(name, name): value for name, value in values.items() if value is not None}


@dataclass(slots=True)
class ToolCallResult:
    """One tool call of a sequence, as its pieces arrive."""

    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class SequenceResult:
    """One generated sequence, as its responses arrive."""

    index: int
    text: list[str] = field(default_factory=list)
    tokens: list[sb.Token] = field(default_factory=list)
    # Each token's text as the sequence decodes one after another (TGI's), not held back for
    # stop strings nor cut at one: a response's decoded text goes with its first token, that
    # of a response without tokens with the last token before it.
    token_texts: list[str] = field(default_factory=list)
    finish_reason: str = ""
    generated_tokens: int = 0
    seed: int = 0
    sampled: bool = False  # else greedy: its seed is unused
    # Where the server reads tool calls or reasoning out of the text (which is then the
    # answer's content alone): those, by call index, and the reasoning and its tokens.
    tool_calls: dict[int, ToolCallResult] = field(default_factory=dict)
    reasoning: list[str] = field(default_factory=list)
    reasoning_tokens: int = 0

    @property
    def generated_text(self) -> str:
        return "".join(self.text)

    @property
    def decoded_text(self) -> str:
        """The generated tokens' whole text (TGI's generated_text): what generated_text is
        before a stop string cuts it."""
        return "".join(self.token_texts)

    @property
    def cumulative_logprob(self) -> float:
        return sum(token.logprob for token in self.tokens)

    def add(self, response: sb.GenerateResponse) -> None:
        self.text.append(response.text)
        self.tokens.extend(response.tokens)
        if response.tokens:
            self.token_texts.extend([response.decoded_text] + [""] * (len(response.tokens) - 1))
        elif self.token_texts:
            self.token_texts[-1] += response.decoded_text
        for call in response.tool_calls:
            self.tool_calls.setdefault(call.index, ToolCallResult(call.id, call.name)
                                       ).arguments.append(call.arguments)
        self.reasoning.append(response.reasoning_text)
        self.reasoning_tokens += response.reasoning_tokens
        self.finish_reason = response.finish_reason
        self.generated_tokens = response.generated_tokens
        self.seed = response.seed
        self.sampled = response.sampled


@dataclass(slots=True)
class Generation:
    """A request's responses, per sequence, with the prompt's counts (and its tokens, when
    asked for with prompt_logprobs)."""

    sequences: dict[int, SequenceResult] = field(default_factory=dict)
    prompt: list[sb.Token] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # A prefill's, for the instance that decodes it (see switchboard.v1's KVTransferParams).
    kv_transfer_params: sb.KVTransferParams | None = None

    def add(self, response: sb.GenerateResponse) -> SequenceResult:
        self.prompt_tokens = response.prompt_tokens
        self.cached_tokens = response.cached_tokens
        if response.HasField("kv_transfer_params"):
            self.kv_transfer_params = response.kv_transfer_params
        self.prompt.extend(response.prompt)
        sequence = self.sequences.setdefault(response.index, SequenceResult(response.index))
        sequence.add(response)
        return sequence

    def ordered(self) -> list[SequenceResult]:
        return [self.sequences[index] for index in sorted(self.sequences)]

    @property
    def completion_tokens(self) -> int:
        return sum(sequence.generated_tokens for sequence in self.sequences.values())


def optional_bool(values: Mapping[str, object], name: str, default: bool = False) -> bool:
    value = values.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(name, "must be true or false")
    return value
