"""MindIE's native routes ⇄ switchboard.v1: POST /infer (text in), /infer_token (`input_id`
token ids in) and /v1/tokenizer.

Request `{"inputs" | "input_id", "stream", "parameters": {...MindIE's names...}}`. Reply
`{"generated_text", "details": {"finish_reason", "generated_tokens", "seed"}}` (details when
asked for; /infer_token adds `generated_token_ids`). Streams send one
`{"prefill_time", "decode_time", "token": {"id", "text"}}` event per token (ms; the first
token's time is prefill_time, the others' decode_time; /infer_token's `id` is a list, as
MindIE's), the last with `generated_text` and, when asked for, `details`.
"""

from __future__ import annotations

from http import HTTPStatus

import grpc

from switchboard.gateway.errors import KSERVE_HTTP_STATUS, bad_request
from switchboard.gateway.protocols.exchange import Answer, Exchange, GenerationProtocol, ServedModel
from switchboard.gateway.protocols.generation import PROMPT, Generation, generate_request, optional_bool
from switchboard.gateway.protocols.kserve import optional_string, require_object, required_string
from switchboard.gateway.protocols.parameters import json_type
from switchboard.gateway.sse import sse_event
from switchboard.proto import generation_fields
from switchboard.proto import switchboard_pb2 as sb

HTTP_STATUS = {**KSERVE_HTTP_STATUS, grpc.StatusCode.INVALID_ARGUMENT: 422,
               grpc.StatusCode.INTERNAL: 424}
ERROR_TYPES = {400: "Bad Request", 404: "NotFoundError", 422: "Input Validation Error",
               424: "Generation Error", 500: "Incomplete Generation", 501: "Not Implemented",
               503: "Service Unavailable"}
NAMES = {"inputs": "prompt"}
TOKEN_NAMES = {"input_id": "prompt"}
MICROSECONDS_PER_MS = 1000


def infer_request_to_pb(document: object, tokens: bool
                        ) -> tuple[sb.GenerateRequest, bool, bool]:
    """The request, whether to stream, and whether to answer details."""
    document = require_object(document, "the body")
    if tokens:
        prompt = document.get("input_id")
        if not isinstance(prompt, list):
            raise bad_request("input_id", f"must be an array of token ids; got {json_type(prompt)}")
        for position, token_id in enumerate(prompt):
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise bad_request("input_id", f"must be an array of token ids; got "
                                  f"{json_type(token_id)} at position {position}")
    else:
        prompt = required_string(document, "inputs")
    parameters = dict(require_object(document.get("parameters") or {}, "parameters"))
    for name in ("n", "best_of"):
        if parameters.get(name) not in (None, 1):
            raise bad_request(name, "MindIE's native routes generate one sequence: must be 1")
    if PROMPT in parameters:
        # Refused here, under its own name: parameters travel as they are, and the server's
        # refusal would name its prompt field, which NAMES turns into `inputs`.
        raise bad_request(PROMPT, "unknown parameter: the prompt is the request's own field")
    details = optional_bool(parameters, "details")
    try:
        parameters = generation_fields.under_mindie_rules(parameters)
    except generation_fields.FieldError as error:
        raise bad_request(error.field, error.reason) from None
    request = generate_request("", prompt, parameters, optional_string(document, "id"),
                               names=TOKEN_NAMES if tokens else NAMES)
    return request, optional_bool(document, "stream"), details


def _details(generation: Generation) -> dict[str, object]:
    [sequence] = generation.ordered()
    return {"finish_reason": sequence.finish_reason,
            "generated_tokens": sequence.generated_tokens, "seed": sequence.seed}


def reply(generation: Generation, details: bool, tokens: bool) -> dict[str, object]:
    [sequence] = generation.ordered()
    document: dict[str, object] = {"generated_text": sequence.generated_text}
    if tokens:
        document["generated_token_ids"] = [token.id for token in sequence.tokens]
    if details:
        document["details"] = _details(generation)
    return document


def stream_event(response: sb.GenerateResponse, generation: Generation, details: bool,
                 tokens: bool) -> dict[str, object]:
    """The event for one response (already added to `generation`)."""
    latency_ms = round(response.token_latency_us / MICROSECONDS_PER_MS, 3)
    first = generation.sequences[response.index].generated_tokens <= 1
    ids = [token.id for token in response.tokens]
    event: dict[str, object] = {
        "prefill_time": latency_ms if first else None,
        "decode_time": None if first else latency_ms,
        "token": {"id": ids if tokens else (ids[0] if ids else None), "text": response.text},
    }
    if response.finish_reason:
        event["generated_text"] = generation.sequences[response.index].generated_text
        if details:
            event["details"] = _details(generation)
    return event


def tokenize_request_to_pb(document: object) -> tuple[sb.TokenizeRequest, bool]:
    """The request and whether to answer the tokens' texts (`do_decode`) instead of ids."""
    document = require_object(document, "the body")
    return (sb.TokenizeRequest(text=required_string(document, "inputs")),
            optional_bool(document, "do_decode"))


def tokenize_reply(response: sb.TokenizeResponse, decode: bool) -> dict[str, object]:
    tokens = list(response.texts) if decode else list(response.ids)
    return {"token_number": len(response.ids), "tokens": tokens}


def error_body(status: int, message: str) -> dict[str, object]:
    """MindIE's envelope: its documented types, else the status's reason phrase, as most of
    its types are (a wrong method is no "Incomplete Generation", its type for a 500)."""
    return {"error": message, "error_type": ERROR_TYPES.get(status, HTTPStatus(status).phrase)}


def error_document(status: int, message: str, field: str | None) -> tuple[int, dict[str, object]]:
    """MindIE's status and body: a field refused by the gateway or the server is 422 (Input
    Validation Error), malformed JSON 400."""
    status = 422 if status == 400 and field else status
    return status, error_body(status, message)


class MindieAnswer(Answer):
    def __init__(self, details: bool, tokens: bool) -> None:
        super().__init__()
        self.details = details
        self.tokens = tokens

    def events(self, call: int, response: sb.GenerateResponse) -> list[bytes]:
        self.collect(call, response)
        return [sse_event(stream_event(response, self.generation, self.details, self.tokens))]

    def reply(self) -> object:
        return reply(self.generation, self.details, self.tokens)


class MindieProtocol(GenerationProtocol):
    """/infer, and /infer_token (`tokens`: token ids in and out)."""

    status_table = HTTP_STATUS

    def __init__(self, tokens: bool) -> None:
        self.tokens = tokens

    async def exchange(self, document: object, served_model: ServedModel) -> Exchange:
        request, stream, details = infer_request_to_pb(document, self.tokens)
        return Exchange([request], stream, MindieAnswer(details, self.tokens),
                        TOKEN_NAMES if self.tokens else NAMES)

    def error_document(self, status: int, message: str, field: str | None,
                       error: BaseException | None) -> tuple[int, object]:
        return error_document(status, message, field)


INFER = MindieProtocol(tokens=False)
INFER_TOKEN = MindieProtocol(tokens=True)
