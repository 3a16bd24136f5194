"""Text Generation Inference's API (TGI 0.9.4 as MindIE documents it, and what TGI's clients
send today) ⇄ switchboard.v1 Generate.

Request `{"inputs", "parameters": {...}, "stream"}`; reply `{"generated_text", "details"}`
(POST / answers a one-element array, as TGI does); streams send one
`{"index", "token", "generated_text": null, "details": null}` event per token, the last
with the whole text and the details. Token log-probabilities are always asked for: TGI's
replies carry them. best_of > 1 generates best_of sequences and answers with the most likely
(highest cumulative log-probability), the others in `best_of_sequences`.

A generated token's text is what it adds to the generated text, as TGI's decode_token gives
it: "" for a token that ends mid-character, the whole character with the token that completes
it, so that the tokens' texts join into the generated text (the server's text, not each token
decoded alone, which is U+FFFD for part of a character); a special token's text is its own, as
TGI's (the generated text leaves it out). The prompt's tokens (`prefill`) and the alternatives
(`top_tokens`) are each token decoded alone, as TGI's.

POST /tokenize answers `[{"id", "text", "start", "stop"}]`: each token with the characters of
`inputs` it comes from (offsets in code points; a character split into several tokens is each
one's text). POST /chat_tokenize takes a chat request (/v1/chat/completions' body) and answers
`{"tokenize_response": [those tokens], "templated_text"}`, the offsets in the text the chat
template wrote, as TGI's router/src/server.rs `get_chat_tokenize` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from switchboard.gateway.errors import KSERVE_HTTP_STATUS, bad_request
from switchboard.gateway.protocols.exchange import (Answer, Exchange, GenerationProtocol, Protocol,
                                                   ServedModel, TokenizeProtocol, Tokenizer)
from switchboard.gateway.protocols.generation import (Generation, SequenceResult, add_output_format,
                                          generate_request, optional_bool, renamed)
from switchboard.gateway.protocols.kserve import refuse_unknown, require_object, required_string
from switchboard.gateway.protocols.openai import chat_request_to_pb
from switchboard.gateway.protocols.parameters import json_type
from switchboard.gateway.sse import sse_event
from switchboard.proto import switchboard_pb2 as sb

# TGI's names → MindIE's, where they differ; the other generation parameters share names.
NAMES = {"inputs": "prompt", "top_n_tokens": "top_logprobs",
         "decoder_input_details": "prompt_logprobs", "best_of": "n"}
GENERATION_PARAMETERS = frozenset({"best_of", "do_sample", "max_new_tokens", "repetition_penalty",
                                   "frequency_penalty", "seed", "stop", "temperature", "top_k",
                                   "top_p", "typical_p", "truncate", "top_n_tokens",
                                   "decoder_input_details"})
RENDERING_PARAMETERS = frozenset({"details", "return_full_text", "watermark"})
# adapter_id values that name no LoRA adapter: MindIE's own TGI examples send "None".
NO_ADAPTER = (None, "None")
FORMAT_PARAMETERS = frozenset({"grammar"})  # structured output (see add_output_format)
PARAMETERS = (GENERATION_PARAMETERS | RENDERING_PARAMETERS | FORMAT_PARAMETERS
              | {"adapter_id"})
# A refused request is 422 (TGI's validation), a full queue 429, a failed generation 424.
HTTP_STATUS = {**{code: 422 if status == 400 else status
                  for code, status in KSERVE_HTTP_STATUS.items()},
               grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.INTERNAL: 424}
ERROR_TYPES = {400: "validation", 405: "validation", 413: "validation", 415: "validation",
               422: "validation",
               429: "overloaded", 424: "generation", 503: "healthcheck", 504: "timeout",
               404: "not_found"}
# The processes that validate requests before they queue (TGI's router: 2 by default).
VALIDATION_WORKERS = 1


@dataclass(frozen=True, slots=True)
class TgiOptions:
    stream: bool
    details: bool
    prompt_details: bool
    return_full_text: bool
    top_n_tokens: int
    best_of: int
    inputs: str
    # The request's field names → MindIE's, for the server's error messages.
    names: Mapping[str, str] = field(default_factory=lambda: NAMES)


def is_tgi(document: object) -> bool:
    """POST /generate and /tokenize are shared with vLLM: a body with `prompt` or `messages`
    and no `inputs` is vLLM's."""
    return not (isinstance(document, dict) and "inputs" not in document
                and ("prompt" in document or "messages" in document))


def tokenize_request_to_pb(document: object) -> sb.TokenizeRequest:
    """POST /tokenize: TGI's generate body, of which only `inputs` matters."""
    return sb.TokenizeRequest(text=required_string(require_object(document, "the body"),
                                                   "inputs"))


def tokenize_reply(response: sb.TokenizeResponse, text: str) -> list[dict[str, object]]:
    """TGI's tokens: each with the characters of `text` it comes from, and their offsets."""
    return [{"id": token_id, "text": text[span.start:span.stop], "start": span.start,
             "stop": span.stop} for token_id, span in zip(response.ids, response.spans)]


def chat_tokenize_request_to_pb(document: object) -> sb.TokenizeRequest:
    """POST /chat_tokenize: a chat request, checked as /v1/chat/completions checks it, whose
    messages are tokenized."""
    [call], _ = chat_request_to_pb(document)
    return sb.TokenizeRequest(model_name=call.request.model_name,
                              messages=call.request.messages)


def chat_tokenize_reply(response: sb.TokenizeResponse) -> dict[str, object]:
    return {"tokenize_response": tokenize_reply(response, response.templated_text),
            "templated_text": response.templated_text}


def generate_request_to_pb(document: object, stream: bool | None
                           ) -> tuple[sb.GenerateRequest, TgiOptions]:
    """`stream` None: the body's `stream` decides (POST /)."""
    document = require_object(document, "the body")
    inputs = required_string(document, "inputs")
    if stream is None:
        stream = optional_bool(document, "stream")
    raw = document.get("parameters")
    # TGI: with no `parameters` at all, sampling is on (its default_parameters()).
    parameters = dict(require_object(raw, "parameters")) if raw is not None else {"do_sample": True}
    if parameters.get("adapter_id") not in NO_ADAPTER:
        raise bad_request("adapter_id", "LoRA adapters are not supported (null or \"None\": "
                          "the model itself)")
    refuse_unknown(parameters, PARAMETERS, "parameter")
    options = TgiOptions(
        stream=stream,
        details=optional_bool(parameters, "details"),
        prompt_details=optional_bool(parameters, "decoder_input_details"),
        return_full_text=optional_bool(parameters, "return_full_text"),
        top_n_tokens=_count(parameters, "top_n_tokens", 0),
        best_of=_count(parameters, "best_of", 1),
        inputs=inputs,
    )
    if stream and options.best_of > 1:
        raise bad_request("best_of", "`best_of` != 1 is not supported when streaming tokens")
    if stream and options.prompt_details:
        raise bad_request("decoder_input_details", "`decoder_input_details` == true is not "
                          "supported when streaming tokens")
    if options.best_of > 1 and parameters.get("seed") is not None:
        # Named by best_of: the seed is fine alone, best_of > 1 is what excludes it.
        raise bad_request("best_of", "must be 1 when a seed is set (TGI: `seed` must not be set "
                          "when `best_of` > 1)")
    # Accepted without effect, as MindIE's TGI routes do.
    optional_bool(parameters, "watermark")
    values = renamed({name: parameters.get(name) for name in GENERATION_PARAMETERS}, NAMES)
    # best_of travels as n: every sequence comes back, and the best is chosen here. TGI's
    # texts are the tokens' decoded texts (the responses' decoded_text), which a stop sequence
    # does not cut.
    values.update(logprobs=True)
    names = add_output_format("grammar", parameters.get("grammar"), values, NAMES)
    request = generate_request("", inputs, values, names=names)
    return request, dataclasses.replace(options, names=names)


def _count(parameters: Mapping[str, object], name: str, default: int) -> int:
    """A count that shapes the reply; its range is the server's to check."""
    value = parameters.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(name, f"must be an integer; got {json_type(value)}")
    return value


def token_json(token: sb.Token, text: str | None = None) -> dict[str, object]:
    """A token; `text`: a generated token's text as its sequence decodes (None: the token's
    own, decoded alone)."""
    return {"id": token.id, "text": token.text if text is None else _share(token, text),
            "logprob": token.logprob if token.HasField("logprob") else None,
            "special": token.special}


def _share(token: sb.Token, text: str) -> str:
    """A generated token's text from its decoded text: a special token's own text follows it
    (the server's decoded text leaves special tokens out; TGI's token texts keep them)."""
    return text + token.text if token.special else text


def reply(generation: Generation, options: TgiOptions) -> dict[str, object]:
    sequences = sorted(generation.ordered(), key=lambda s: -s.cumulative_logprob)
    best, others = sequences[0], sequences[1:]
    response: dict[str, object] = {"generated_text": _text(best, options)}
    if options.details:
        details = _details(best, generation, options)
        if others:
            details["best_of_sequences"] = [
                {"generated_text": _text(other, options), **_details(other, generation, options)}
                for other in others]
        response["details"] = details
    return response


def _details(sequence: SequenceResult, generation: Generation, options: TgiOptions
             ) -> dict[str, object]:
    details: dict[str, object] = {
        "finish_reason": sequence.finish_reason,
        "generated_tokens": sequence.generated_tokens,
        "seed": _seed(sequence),
        "prompt_tokens": generation.prompt_tokens,
        "prefill": [{"id": t.id, "text": t.text,
                     "logprob": t.logprob if t.HasField("logprob") else None}
                    for t in generation.prompt],
        "tokens": [token_json(token, text)
                   for token, text in zip(sequence.tokens, sequence.token_texts)],
    }
    if options.top_n_tokens:
        details["top_tokens"] = [[token_json(top) for top in token.top]
                                 for token in sequence.tokens]
    return details


def _seed(sequence: SequenceResult) -> int | None:
    """As TGI reports it: null for a greedy sequence."""
    return sequence.seed if sequence.sampled else None


def _text(sequence: SequenceResult, options: TgiOptions) -> str:
    prefix = options.inputs if options.return_full_text else ""
    return prefix + sequence.decoded_text


def stream_event(response: sb.GenerateResponse, generation: Generation, options: TgiOptions
                 ) -> dict[str, object]:
    """The event for one response (already added to `generation`)."""
    sequence = generation.sequences[response.index]
    event: dict[str, object] = {
        "index": len(sequence.tokens),  # TGI counts a stream's events from 1
        "token": token_json(response.tokens[0], response.decoded_text) if response.tokens
        else None,
        "generated_text": None,
        "details": None,
    }
    if options.top_n_tokens and response.tokens:
        event["top_tokens"] = [token_json(top) for top in response.tokens[0].top]
    if response.finish_reason:
        event["generated_text"] = _text(sequence, options)
    if response.finish_reason and options.details:
        event["details"] = {"finish_reason": sequence.finish_reason,
                            "generated_tokens": sequence.generated_tokens,
                            "seed": _seed(sequence),
                            "prompt_tokens": generation.prompt_tokens,
                            "input_length": generation.prompt_tokens}
    return event


def error_body(status: int, message: str) -> dict[str, object]:
    return {"error": message, "error_type": ERROR_TYPES.get(status, "generation")}


def error_document(status: int, message: str) -> tuple[int, dict[str, object]]:
    """TGI's status and body: a refused request is 422, as TGI's validation answers."""
    status = 422 if status == 400 else status
    return status, error_body(status, message)


class TgiAnswer(Answer):
    def __init__(self, options: TgiOptions, compat: bool) -> None:
        super().__init__()
        self.options = options
        self.compat = compat

    def events(self, call: int, response: sb.GenerateResponse) -> list[bytes]:
        self.collect(call, response)
        return [sse_event(stream_event(response, self.generation, self.options))]

    def reply(self) -> object:
        answer = reply(self.generation, self.options)
        return [answer] if self.compat else answer


class TgiErrors(Protocol):
    """TGI's statuses and error body `{"error", "error_type"}`."""

    status_table = HTTP_STATUS

    def error_document(self, status: int, message: str, field: str | None,
                       error: BaseException | None) -> tuple[int, object]:
        return error_document(status, message)


class TgiProtocol(TgiErrors, GenerationProtocol):
    """TGI's generate routes; `stream` None lets the body's `stream` decide, and `compat`
    answers a one-element array (POST /)."""

    def __init__(self, stream: bool | None = False, compat: bool = False) -> None:
        self.stream = stream
        self.compat = compat

    async def exchange(self, document: object, served_model: ServedModel) -> Exchange:
        request, options = generate_request_to_pb(document, self.stream)
        return Exchange([request], options.stream,
                        TgiAnswer(options, self.compat), options.names)


class TgiTokenize(TgiErrors, TokenizeProtocol):
    """POST /tokenize with TGI's body, of which only `inputs` matters."""

    names = NAMES

    async def answer(self, document: object, tokenize: Tokenizer) -> object:
        request = tokenize_request_to_pb(document)
        return tokenize_reply(await tokenize(request), request.text)


GENERATE = TgiProtocol()
GENERATE_STREAM = TgiProtocol(stream=True)
COMPAT = TgiProtocol(stream=None, compat=True)


def info_json(model_name: str, parameters: Mapping[str, str], version: str) -> dict[str, object]:
    """GET /info from the model's config parameters (limits, dtype, device). TGI's
    max_concurrent_requests is how many requests it holds before answering 429: here the
    running ones and the waiting queue."""
    def limit(name: str) -> int | None:
        value = parameters.get(name)
        return int(value) if value is not None else None

    running, waiting = limit("max_running_requests"), limit("max_waiting_requests")
    return {
        "model_id": model_name, "model_sha": None, "model_dtype": parameters.get("dtype"),
        "model_device_type": parameters.get("device"), "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": None if running is None or waiting is None
        else running + waiting,
        "max_best_of": limit("max_sequences"),
        "max_stop_sequences": limit("max_stop_sequences"),
        "max_input_length": limit("max_input_len"), "max_input_tokens": limit("max_input_len"),
        "max_total_tokens": limit("max_seq_len"), "validation_workers": VALIDATION_WORKERS,
        "max_client_batch_size": 1, "router": "switchboard", "version": version,
        "sha": None, "docker_label": None,
    }

