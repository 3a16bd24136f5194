"""vLLM's demo API server (`vllm.entrypoints.api_server`) ⇄ switchboard.v1 Generate.

POST /generate with `{"prompt", "stream", ...sampling parameters}` answers
`{"text": [prompt + completion, one per sequence]}`; streamed, the same object with the
texts so far, each followed by a newline (JSON lines), as vLLM's api_server.py sends them
(older vLLM used a NUL byte).

And vLLM's tokenizer routes (those of its OpenAI server): POST /tokenize with `prompt` (a text;
`add_special_tokens`, default true) or `messages` (OpenAI's, rendered with the chat template,
which writes the special tokens, as `chat_template_kwargs`, `add_generation_prompt` and
`continue_final_message` say) answers `{"count", "max_model_len", "tokens", "token_strs"}`,
`token_strs` the vocabulary's strings of the tokens (`"Ġthe"`) when `return_token_strs` asks for
them, else null; POST /detokenize with `tokens` answers `{"prompt"}`, special tokens included. GET
/version answers `{"version"}`: the model server's.
"""

from __future__ import annotations

import json

import grpc

from switchboard.gateway.errors import bad_request
from switchboard.gateway.protocols.exchange import (Answer, Exchange, GenerationProtocol, Protocol,
                                                   ServedModel, TokenizeProtocol, Tokenizer)
from switchboard.gateway.protocols.generation import (Generation, generate_request,
                                          optional_bool, renamed)
from switchboard.gateway.protocols.kserve import (optional_string, refuse_unknown, require_object,
                                      required_string)
from switchboard.gateway.protocols.openai import TEMPLATE_FIELDS, OpenAIErrors, chat_messages
from switchboard.gateway.protocols.parameters import UINT32_MAX, json_type
from switchboard.gateway.protocols import tgi
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import vllm_sampling

DELIMITER = b"\n"
# JSON objects each followed by a newline are not one JSON document: vLLM's demo server sends no
# content type for it; this says "bytes" rather than claiming JSON.
STREAM_CONTENT_TYPE = "application/octet-stream"
NAMES = vllm_sampling.NAMES
DETOKENIZE_NAMES = {"tokens": "token_ids"}
# TGI's statuses (the route is shared), but a full queue is 503: 429 is TGI's alone.
HTTP_STATUS = {**tgi.HTTP_STATUS, grpc.StatusCode.RESOURCE_EXHAUSTED: 503}
SAMPLING_FIELDS = frozenset({"n", "best_of", "presence_penalty", "frequency_penalty",
                             "repetition_penalty", "temperature", "top_p", "top_k", "min_p",
                             "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens",
                             "min_tokens", "allowed_token_ids", "include_stop_str_in_output",
                             "skip_special_tokens", "truncate_prompt_tokens"})


def generate_request_to_pb(document: object) -> tuple[sb.GenerateRequest, str, bool]:
    """The request, the prompt, and whether to stream."""
    document = require_object(document, "the body")
    prompt = required_string(document, "prompt")
    refuse_unknown(document, SAMPLING_FIELDS | {"prompt", "stream"}, "sampling parameter")
    values = renamed({name: document.get(name) for name in SAMPLING_FIELDS}, NAMES)
    if refused := vllm_sampling.refusal(values):
        raise bad_request(*refused)
    vllm_sampling.apply_vllm_defaults(values)
    request = generate_request("", prompt, values, names=NAMES)
    return request, prompt, optional_bool(document, "stream")


def texts(generation: Generation, prompt: str) -> dict[str, object]:
    return {"text": [prompt + sequence.generated_text for sequence in generation.ordered()]}


def stream_line(generation: Generation, prompt: str) -> bytes:
    return json.dumps(texts(generation, prompt), ensure_ascii=False).encode() + DELIMITER


def stream_error(body: object) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode() + DELIMITER


class VllmAnswer(Answer):
    content_type = STREAM_CONTENT_TYPE

    def __init__(self, prompt: str) -> None:
        super().__init__()
        self.prompt = prompt

    def events(self, call: int, response: sb.GenerateResponse) -> list[bytes]:
        self.collect(call, response)
        return [stream_line(self.generation, self.prompt)]

    def reply(self) -> object:
        return texts(self.generation, self.prompt)

    def error_event(self, body: object) -> bytes:
        return stream_error(body)


class VllmProtocol(GenerationProtocol):
    """vLLM's demo /generate; its errors are TGI's, whose route it shares."""

    status_table = HTTP_STATUS

    async def exchange(self, document: object, served_model: ServedModel) -> Exchange:
        request, prompt, stream = generate_request_to_pb(document)
        return Exchange([request], stream, VllmAnswer(prompt), NAMES)

    def error_document(self, status: int, message: str, field: str | None,
                       error: BaseException | None) -> tuple[int, object]:
        return tgi.error_document(status, message)


class SharedGenerate(tgi.TgiProtocol):
    """POST /generate: TGI's (`inputs`) or vLLM's demo server's (`prompt`), by the body."""

    def speaking(self, document: object) -> GenerationProtocol:
        return self if tgi.is_tgi(document) else GENERATE


GENERATE = VllmProtocol()
TGI_OR_VLLM_GENERATE = SharedGenerate()


def tokenize_request_to_pb(document: object) -> tuple[sb.TokenizeRequest, bool]:
    """The request, and whether the reply gives the tokens' vocabulary strings."""
    document = require_object(document, "the body")
    refuse_unknown(document, {"model", "prompt", "messages", "add_special_tokens",
                              "return_token_strs", *TEMPLATE_FIELDS})
    request = sb.TokenizeRequest(model_name=optional_string(document, "model"))
    token_strs = optional_bool(document, "return_token_strs")
    # vLLM's defaults: true for a prompt; false for messages, whose template writes them.
    add_special_tokens = optional_bool(document, "add_special_tokens",
                                       default="messages" not in document)
    if "messages" in document:
        messages = document["messages"]
        if not isinstance(messages, list):
            raise bad_request("messages", f"must be an array; got {json_type(messages)}")
        if add_special_tokens:
            raise bad_request("add_special_tokens", "must be false with messages: the chat "
                              "template writes the special tokens")
        request.messages.CopyFrom(chat_messages(messages, document))
        return request, token_strs
    request.text = required_string(document, "prompt")
    if document.get("add_special_tokens") is not None:
        request.add_special_tokens = add_special_tokens
    return request, token_strs


def tokenize_reply(response: sb.TokenizeResponse, token_strs: bool) -> dict[str, object]:
    return {"count": len(response.ids), "max_model_len": response.max_sequence_length,
            "tokens": list(response.ids),
            "token_strs": list(response.vocabulary_strings) if token_strs else None}


class VllmTokenize(OpenAIErrors, TokenizeProtocol):
    """POST /tokenize with vLLM's body (`prompt` or `messages`); its errors are its OpenAI
    server's (400, `{"error": {"message", "type", "param", "code"}}`), as on its /detokenize."""

    async def answer(self, document: object, tokenize: Tokenizer) -> object:
        request, token_strs = tokenize_request_to_pb(document)
        return tokenize_reply(await tokenize(request), token_strs)


class SharedTokenize(tgi.TgiTokenize):
    """POST /tokenize: TGI's (`inputs`) or vLLM's (`prompt` or `messages`), by the body."""

    def speaking(self, document: object) -> Protocol:
        return self if tgi.is_tgi(document) else TOKENIZE


TOKENIZE = VllmTokenize()
TGI_OR_VLLM_TOKENIZE = SharedTokenize()


def detokenize_request_to_pb(document: object) -> sb.DetokenizeRequest:
    document = require_object(document, "the body")
    refuse_unknown(document, {"model", "tokens"})
    tokens = document.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(token, int) and not isinstance(token, bool) and 0 <= token <= UINT32_MAX
            for token in tokens):
        raise bad_request("tokens", f"must be an array of token ids in [0, {UINT32_MAX}]")
    return sb.DetokenizeRequest(model_name=optional_string(document, "model"), token_ids=tokens)


def version_json(version: str) -> dict[str, str]:
    """GET /version: vLLM's package version there, the model server's here."""
    return {"version": version}
