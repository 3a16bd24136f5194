"""OpenAI's API (as vLLM serves it) ⇄ switchboard.v1 Generate: /v1/models,
/v1/chat/completions and /v1/completions, streamed as `chat.completion.chunk` /
`text_completion` SSE chunks ending with `data: [DONE]`.

Chat messages are rendered with the model's chat template on the server. `temperature` 0
means greedy; absent, the request samples at temperature 1 (OpenAI's default). Without
`max_tokens`, generation runs to the end of the turn within the server's limits (maxIterTimes,
maxSeqLen). vLLM's sampling extras (top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
stop_token_ids, allowed_token_ids, include_stop_str_in_output, skip_special_tokens,
truncate_prompt_tokens) are accepted too, and so is `logit_bias` ({"token id": bias in
[-100, 100]}). `seed` is vLLM's int64: -1 (or none) draws a random one, and every other value,
0 included, reproduces its samples.

A `model` naming another model than the served one is refused with 404, as vLLM does, except
the names TGI's clients send for "the model this server runs" (TGI ignores the field): "tgi",
as in TGI's documented OpenAI SDK examples, and "dummy", which huggingface_hub's
InferenceClient sends to a server given by its URL.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import grpc
from google.protobuf import json_format

from switchboard.gateway.errors import KSERVE_HTTP_STATUS, bad_request
from switchboard.gateway.protocols.exchange import (Answer, Exchange, GenerationProtocol, Protocol,
                                                   ServedModel)
from switchboard.gateway.protocols.generation import (Generation, add_output_format, generate_request,
                                          optional_bool, renamed)
from switchboard.gateway.protocols import openai_tools
from switchboard.gateway.protocols.kserve import optional_string, refuse_unknown, require_object
from switchboard.gateway.protocols.parameters import json_type
from switchboard.gateway.sse import DONE_EVENT, sse_event
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import vllm_sampling

# The backend configuration answers were made with (OpenAI's system_fingerprint, a string in
# every answer and chunk): this release.
SYSTEM_FINGERPRINT = f"switchboard-{importlib.metadata.version('switchboard')}"
UNLIMITED = 2**31 - 1  # max_new_tokens that the server caps at its limits
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's /v1/completions default
# vLLM's field for prefill/decode disaggregation, switchboard.v1's too.
KV_TRANSFER_FIELD = "kv_transfer_params"
NAMES = vllm_sampling.NAMES  # vLLM's names of its extras, as vLLM's OpenAI server takes them
# Chat's errors about the prompt name its messages; about the length, the field it used.
CHAT_NAMES = {**NAMES, "messages": "prompt"}
CHAT_NAMES_NEW_MAX = {**CHAT_NAMES, "max_completion_tokens": "max_new_tokens"}
CHAT_NAMES_NEW_MAX.pop("max_tokens")
COMPLETION_NAMES = {**NAMES, "logprobs": "top_logprobs"}
SAMPLING_FIELDS = frozenset({"temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                             "frequency_penalty", "top_k", "min_p", "repetition_penalty",
                             "min_tokens", "ignore_eos", "stop_token_ids", "allowed_token_ids",
                             "include_stop_str_in_output", "skip_special_tokens",
                             "truncate_prompt_tokens", "guided_json", "guided_regex",
                             "guided_choice"})
# `model` values meaning the served model (see the module's docstring).
SERVED_MODEL_PLACEHOLDERS = frozenset({"tgi", "dummy"})
# Accepted with any value and without effect here: OpenAI's bookkeeping fields; and on chat
# and completions, hints that a model without reasoning answers the same without (predicted
# outputs only make answering faster) and vLLM's choice of structured-output backend. By
# the JSON type OpenAI and vLLM give them, which the OpenAPI documents state.
IGNORED_FIELDS: Mapping[str, type] = MappingProxyType({
    "user": str, "store": bool, "metadata": dict, "service_tier": str, "prompt_cache_key": str,
    "prompt_cache_retention": str, "safety_identifier": str})
IGNORED_HINTS: Mapping[str, type] = MappingProxyType({
    "reasoning_effort": str, "verbosity": str, "prediction": dict,
    "guided_decoding_backend": str})
# OpenAI's and vLLM's options accepted at the values that change nothing (null always does),
# as SDKs and frameworks send them; other values are refused as not supported.
NEUTRAL_VALUES: dict[str, tuple[object, ...]] = {
    "modalities": (["text"],), "audio": (), "web_search_options": (), "functions": ([],),
    "function_call": ("none",), "use_beam_search": (False,), "length_penalty": (1, 1.0),
    "spaces_between_special_tokens": (True,), "priority": (0,), "cache_salt": (),
    "vllm_xargs": (), "bad_words": ([],),
    # SGLang's, at their defaults: vLLM's router adds them to every request it forwards.
    "no_stop_trim": (False,), "return_hidden_states": (False,), "separate_reasoning": (True,),
    "stream_reasoning": (True,), "include_reasoning": (True,)}
# Chat's own, at the value that changes nothing (vLLM's router sends it).
CHAT_NEUTRAL_VALUES = {**NEUTRAL_VALUES, "echo": (False,)}
ACCEPTED_FIELDS = SAMPLING_FIELDS | frozenset(IGNORED_FIELDS) | frozenset(IGNORED_HINTS) \
    | set(NEUTRAL_VALUES) | {
    "model", "max_tokens", "logprobs", "stream", "stream_options", "logit_bias",
    "response_format", "structured_outputs", KV_TRANSFER_FIELD}
# vLLM's options of the chat template's rendering (see `chat_messages`).
TEMPLATE_FIELDS = frozenset({"chat_template_kwargs", "add_generation_prompt",
                             "continue_final_message"})
CHAT_FIELDS = ACCEPTED_FIELDS | TEMPLATE_FIELDS | {"messages", "max_completion_tokens",
                                                   "top_logprobs", "tools", "tool_choice",
                                                   "parallel_tool_calls", "echo"}
COMPLETION_FIELDS = ACCEPTED_FIELDS | {"prompt", "echo", "best_of", "suffix"}
# vLLM's structured_outputs keys → the server's pattern parameters.
STRUCTURED_OUTPUTS = {"json": "guided_json", "regex": "guided_regex", "choice": "guided_choice",
                      "json_object": "guided_json"}
FINISH_REASONS = {"length": "length", "eos_token": "stop", "stop_sequence": "stop",
                  "stopped": "stop"}
HTTP_STATUS = KSERVE_HTTP_STATUS  # a full queue is 503 (429 is TGI's alone)
ERROR_TYPES = {400: "invalid_request_error", 405: "invalid_request_error",
               413: "invalid_request_error", 415: "invalid_request_error",
               404: "not_found_error", 401: "authentication_error", 403: "permission_error",
               429: "rate_limit_error", 504: "timeout_error"}


@dataclass(frozen=True, slots=True)
class Call:
    """One upstream request of an OpenAI request (a completion's prompt list makes several)."""

    request: sb.GenerateRequest
    prompt_text: str | None


@dataclass(frozen=True, slots=True)
class OpenAIOptions:
    kind: str  # "chat.completion" or "text_completion"
    model: str
    stream: bool
    include_usage: bool
    # vLLM's stream_options.continuous_usage_stats (with include_usage): usage in every chunk.
    continuous_usage: bool
    logprobs: bool
    echo: bool
    # echo with max_tokens 0 (vLLM's rule, as lm-evaluation-harness scores texts): the reply
    # is the prompt alone, with its tokens' log-probabilities; one token is generated unseen.
    echo_only: bool
    n: int
    # The protocol's field names → MindIE's, for the server's error messages.
    names: Mapping[str, str]
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat.completion" else "cmpl-") + self.id


def chat_request_to_pb(document: object) -> tuple[list[Call], OpenAIOptions]:
    document = checked_document(document, CHAT_FIELDS, CHAT_NEUTRAL_VALUES)
    messages = document.get("messages")
    if not isinstance(messages, list):
        raise bad_request("messages", f"must be an array of messages; got {json_type(messages)}")
    values = sampling_values(document)
    newer = token_limit(document, "max_completion_tokens")
    older = token_limit(document, "max_tokens")
    values["max_new_tokens"] = newer if newer is not None else older \
        if older is not None else UNLIMITED
    logprobs = optional_bool(document, "logprobs")
    values.update(logprobs=logprobs, top_logprobs=document.get("top_logprobs"))
    names = add_structured_outputs(document.get("structured_outputs"), values, add_output_format(
        "response_format", document.get("response_format"), values,
        CHAT_NAMES_NEW_MAX if newer is not None else CHAT_NAMES))
    prompt = chat_messages(messages, document)
    openai_tools.add_tools(document, prompt)
    request = generate_request(requested_model(document), prompt, values, names=names)
    add_kv_transfer(document, [request])
    return [Call(request, None)], _options(document, "chat.completion", logprobs, False, names)


def completion_request_to_pb(document: object) -> tuple[list[Call], OpenAIOptions]:
    document = checked_document(document, COMPLETION_FIELDS)
    if document.get("suffix") is not None:
        raise bad_request("suffix", "is not supported")
    prompts = _prompts(document.get("prompt"))
    echo = optional_bool(document, "echo")
    values = sampling_values(document)
    max_tokens = token_limit(document, "max_tokens")
    echo_only = echo and max_tokens == 0
    values["max_new_tokens"] = COMPLETION_DEFAULT_MAX_TOKENS if max_tokens is None \
        else 1 if echo_only else max_tokens
    values["best_of"] = document.get("best_of")
    top = document.get("logprobs")
    if top is not None:
        values.update(logprobs=True, top_logprobs=top)
    names = add_structured_outputs(document.get("structured_outputs"), values, add_output_format(
        "response_format", document.get("response_format"), values, COMPLETION_NAMES))
    calls = []
    for prompt in prompts:
        # Echoed, the prompt's tokens come back from the server: their log-probabilities
        # lead the reply's, and a prompt of token ids needs their text.
        prompt_values = {**values, "prompt_logprobs": True} if echo and (
            top is not None or not isinstance(prompt, str)) else values
        request = generate_request(requested_model(document), prompt, prompt_values,
                                   names=names)
        calls.append(Call(request, prompt if isinstance(prompt, str) else None))
    add_kv_transfer(document, [call.request for call in calls])
    return calls, _options(document, "text_completion", top is not None, echo, names,
                           echo_only=echo_only)


def checked_document(document: object, fields: frozenset[str],
                     neutral_values: Mapping[str, tuple[object, ...]] = NEUTRAL_VALUES
                     ) -> dict[str, object]:
    document = require_object(document, "the body")
    refuse_unknown(document, fields)
    for name, neutral in neutral_values.items():
        value = document.get(name)
        if value is not None and not any(_same(value, each) for each in neutral):
            accepted = " or ".join(["null", *(json.dumps(each) for each in neutral)])
            raise bad_request(name, f"is not supported: only {accepted} is accepted; got "
                              f"{json.dumps(value)}")
    return document


def _same(value: object, neutral: object) -> bool:
    """Equal as JSON values (true is not 1)."""
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


def add_structured_outputs(value: object, values: dict[str, object],
                           names: Mapping[str, str]) -> Mapping[str, str]:
    """vLLM's structured_outputs, which replaced its guided_* fields: {"json": schema},
    {"regex": expression}, {"choice": [...]} or {"json_object": true}, as the server's pattern
    parameter; returns `names` with errors about it naming the key used."""
    if value is None:
        return names
    given = {key: item for key, item in require_object(value, "structured_outputs").items()
             if item is not None}
    if len(given) != 1 or not set(given) <= STRUCTURED_OUTPUTS.keys():
        raise bad_request("structured_outputs", "must hold one of " + ", ".join(
            STRUCTURED_OUTPUTS) + f"; got {json.dumps(sorted(given))}")
    [(key, item)] = given.items()
    field, parameter = f"structured_outputs.{key}", STRUCTURED_OUTPUTS[key]
    if key == "json_object":
        if item is not True:
            raise bad_request(field, f"must be true; got {json.dumps(item)}")
        item = {"type": "object"}
    if values.get(parameter) is not None:
        raise bad_request(field, "asks for a second output format")
    values[parameter] = item
    return {**names, field: parameter}


def add_kv_transfer(document: Mapping[str, object], requests: list[sb.GenerateRequest]) -> None:
    """vLLM's kv_transfer_params (prefill/decode disaggregation), field for field; keys it
    has and this server does not need (tp_size) are left, and null is absent."""
    value = document.get(KV_TRANSFER_FIELD)
    if value is None:
        return
    require_object(value, KV_TRANSFER_FIELD)
    if len(requests) > 1:
        raise bad_request(KV_TRANSFER_FIELD, "is for a request of one prompt")
    try:
        json_format.ParseDict(value, requests[0].kv_transfer_params, ignore_unknown_fields=True)
    except json_format.ParseError as error:
        raise bad_request(KV_TRANSFER_FIELD, str(error)) from None


def kv_transfer_answer(generations: list[Generation]) -> dict[str, object]:
    """A prefill's kv_transfer_params, for the request that decodes it (vLLM's answer field)."""
    for generation in generations:
        if generation.kv_transfer_params is not None:
            return {KV_TRANSFER_FIELD: json_format.MessageToDict(
                generation.kv_transfer_params, preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True)}
    return {}


def requested_model(document: Mapping[str, object]) -> str:
    """The model asked for; "" for the served one."""
    model = optional_string(document, "model")
    return "" if model in SERVED_MODEL_PLACEHOLDERS else model


def sampling_values(document: Mapping[str, object]) -> dict[str, object]:
    values = renamed({name: document.get(name) for name in SAMPLING_FIELDS}, NAMES)
    if refused := vllm_sampling.refusal(values):
        raise bad_request(*refused)
    values["logit_bias"] = document.get("logit_bias")
    vllm_sampling.apply_vllm_defaults(values, max_new_tokens=None)
    return values


def token_limit(document: Mapping[str, object], name: str) -> int | None:
    value = document.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad_request(name, f"must be an integer; got {json_type(value)}")
    return value


def _options(document: Mapping[str, object], kind: str, logprobs: bool, echo: bool,
             names: Mapping[str, str], *, echo_only: bool = False
             ) -> OpenAIOptions:
    stream = optional_bool(document, "stream")
    stream_options = document.get("stream_options")
    if stream_options is not None:
        if not stream:
            raise bad_request("stream_options", "can only be given with stream: true")
        stream_options = require_object(stream_options, "stream_options")
    n = document.get("n")
    include_usage = optional_bool(stream_options or {}, "include_usage")
    return OpenAIOptions(kind=kind, model=requested_model(document), stream=stream,
                         include_usage=include_usage,
                         continuous_usage=include_usage and optional_bool(
                             stream_options or {}, "continuous_usage_stats"),
                         logprobs=logprobs, echo=echo, echo_only=echo_only,
                         n=n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1,
                         names=names)


def chat_messages(messages: list[object], options: Mapping[str, object]) -> sb.ChatMessages:
    """OpenAI's messages (string or text-part contents), roles checked by the server, to be
    rendered as vLLM's TEMPLATE_FIELDS in `options` say: `chat_template_kwargs` (an object of
    more template variables), `add_generation_prompt` (true: end with the opening of the
    assistant's turn) and `continue_final_message` (end inside the last message). The server
    checks their combination."""
    result = sb.ChatMessages()
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        message = require_object(message, where)
        role = message.get("role")
        if not isinstance(role, str):
            raise bad_request(f"{where}.role", f"must be a string; got {json_type(role)}")
        openai_tools.add_message_tool_fields(message, where, result.messages.add(
            role=role, content=message_text(message.get("content"), where)))
    variables = options.get("chat_template_kwargs")
    if variables is not None:
        result.template_variables_json = json.dumps(
            require_object(variables, "chat_template_kwargs"), ensure_ascii=False)
    if options.get("add_generation_prompt") is not None:
        result.add_generation_prompt = optional_bool(options, "add_generation_prompt")
    result.continue_final_message = optional_bool(options, "continue_final_message")
    return result


def message_text(content: object, where: str, part_types: Sequence[str] = ("text",)) -> str:
    """A string (null: empty), or OpenAI's list of parts of which only text ones (of
    `part_types`) are supported."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad_request(f"{where}.content", f"must be a string or an array of text parts; "
                          f"got {json_type(content)}")
    texts = []
    for index, part in enumerate(content):
        part = require_object(part, f"{where}.content[{index}]")
        if part.get("type") not in part_types:
            raise bad_request(f"{where}.content[{index}]",
                              f"only text parts ({', '.join(part_types)}) are supported")
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{where}.content[{index}].text",
                              f"must be a string; got {json_type(part.get('text'))}")
        texts.append(part["text"])
    return "\n".join(texts)


def _prompts(prompt: object) -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    def is_ids(value: object) -> bool:
        return isinstance(value, list) and bool(value) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in value)

    if isinstance(prompt, str) or is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p) for p in prompt):
        return list(prompt)
    raise bad_request("prompt", "must be a string, an array of strings, an array of token ids "
                      "or an array of arrays of token ids")


def _header(options: OpenAIOptions, obj: str) -> dict[str, object]:
    return {"id": options.response_id, "object": obj, "created": options.created,
            "model": options.model, "system_fingerprint": SYSTEM_FINGERPRINT}


def _bytes(text: str) -> list[int]:
    return list(text.encode())


def _content_tokens(tokens: list[sb.Token]) -> list[sb.Token]:
    """The tokens whose text is in the reply: special ones (the end of the turn) are not."""
    return [token for token in tokens if not token.special]


def _chat_logprobs(tokens: list[sb.Token]) -> dict[str, object]:
    return {"content": token_logprobs(tokens)}


def token_logprobs(tokens: list[sb.Token]) -> list[dict[str, object]]:
    """The content tokens' log-probabilities with their top alternatives (chat's, and the
    Responses API's)."""
    return [{"token": t.text, "logprob": t.logprob, "bytes": _bytes(t.text),
             "top_logprobs": [{"token": top.text, "logprob": top.logprob,
                               "bytes": _bytes(top.text)} for top in t.top]}
            for t in _content_tokens(tokens)]


def _completion_logprobs(tokens: list[sb.Token], offset: int,
                         prompt: Sequence[sb.Token] = ()) -> dict[str, object]:
    """prompt: an echoed prompt's tokens, which lead (vLLM's echo; the first has no logprob).
    Each position's top_logprobs are its alternatives and its own token, as vLLM's: with
    `logprobs` 0, the token alone."""
    tokens = [*prompt, *_content_tokens(tokens)]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.text)
    return {"tokens": [t.text for t in tokens],
            "token_logprobs": [t.logprob if t.HasField("logprob") else None for t in tokens],
            "top_logprobs": [{**{top.text: top.logprob for top in t.top}, t.text: t.logprob}
                             if t.HasField("logprob") else None for t in tokens],
            "text_offset": offsets}


def choice_index(options: OpenAIOptions, call_index: int, sequence_index: int) -> int:
    return call_index * options.n + sequence_index


def echo_text(call: Call, generation: Generation) -> str:
    if call.prompt_text is not None:
        return call.prompt_text
    return "".join(token.text for token in generation.prompt)


def reply(calls: list[Call], generations: list[Generation], options: OpenAIOptions
          ) -> dict[str, object]:
    choices = []
    for call_index, (call, generation) in enumerate(zip(calls, generations)):
        for position, sequence in enumerate(generation.ordered()):
            index = choice_index(options, call_index, position)
            reason = FINISH_REASONS.get(sequence.finish_reason, sequence.finish_reason)
            if options.kind == "chat.completion":
                choices.append({"index": index,
                                "message": {"role": "assistant",
                                            **openai_tools.message_fields(sequence),
                                            "refusal": None},
                                "logprobs": _chat_logprobs(sequence.tokens) if options.logprobs
                                else None,
                                "finish_reason": openai_tools.finish_reason(
                                    sequence, reason, call.request.messages)})
            else:
                prefix = echo_text(call, generation) if options.echo else ""
                generated = [] if options.echo_only else list(sequence.tokens)
                choices.append({"index": index,
                                "text": prefix if options.echo_only
                                else prefix + sequence.generated_text,
                                "logprobs": _completion_logprobs(
                                    generated, 0, generation.prompt if options.echo else ())
                                if options.logprobs else None,
                                "finish_reason": "length" if options.echo_only else reason})
    return {**_header(options, options.kind), "choices": choices, "usage": usage(generations),
            **kv_transfer_answer(generations)}


def usage(generations: list[Generation], pending: int = 0) -> dict[str, object]:
    """`pending`: generated tokens left out (a role chunk's usage, as vLLM's, comes before
    its choice's first tokens)."""
    prompt = sum(g.prompt_tokens for g in generations)
    completion = sum(g.completion_tokens for g in generations) - pending
    cached = sum(g.cached_tokens for g in generations)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            **openai_tools.usage_details(generations)}


def chunk(options: OpenAIOptions, index: int, *, delta_text: str | None = None,
          role: bool = False, tokens: list[sb.Token] | None = None,
          prompt: Sequence[sb.Token] = (), text_offset: int = 0, finish_reason: str = "",
          usage: dict[str, object] | None = None,
          delta_fields: Mapping[str, object] | None = None) -> dict[str, object]:
    """One streamed chunk for choice `index`; `prompt`: the echoed prompt's tokens, which
    lead its tokens (completions' logprobs); `text_offset`: where the first of them starts in
    the choice's text; `usage`: the usage so far, sent with continuous_usage; `delta_fields`:
    chat's reasoning_content and tool_calls."""
    reason = FINISH_REASONS.get(finish_reason, finish_reason) or None
    if options.kind == "chat.completion":
        delta: dict[str, object] = {"role": "assistant", "content": ""} if role else {}
        if delta_text:
            delta["content"] = delta_text
        delta.update(delta_fields or {})
        choice: dict[str, object] = {"index": index, "delta": delta,
                                     "logprobs": _chat_logprobs(tokens) if options.logprobs
                                     and tokens else None,
                                     "finish_reason": reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": delta_text or "",
                  "logprobs": _completion_logprobs(tokens or [], text_offset, prompt)
                  if options.logprobs and (tokens or prompt) else None,
                  "finish_reason": reason}
        obj = "text_completion"
    document = {**_header(options, obj), "choices": [choice]}
    if options.include_usage:
        document["usage"] = usage if options.continuous_usage else None
    return document


def usage_chunk(generations: list[Generation], options: OpenAIOptions) -> dict[str, object]:
    obj = "chat.completion.chunk" if options.kind == "chat.completion" else "text_completion"
    return {**_header(options, obj), "choices": [], "usage": usage(generations)}


def models_json(model_names: list[str], created: int, max_model_len: int | None
                ) -> dict[str, object]:
    return {"object": "list",
            "data": [model_json(name, created, max_model_len) for name in model_names]}


def model_json(name: str, created: int, max_model_len: int | None) -> dict[str, object]:
    """OpenAI's model object with vLLM's additions: `root` (the model served under this name:
    the name itself, as no path is given out), `parent` (null: not a LoRA adapter) and
    `max_model_len` (maxSeqLen, prompt and output tokens together)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "switchboard",
            "root": name, "parent": None, "max_model_len": max_model_len}


def error_body(status: int, message: str, param: str | None) -> dict[str, object]:
    """OpenAI's error object; its `code` is a string (the spec's type): the HTTP status's."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": str(status)}}


def error_document(status: int, message: str, field: str | None,
                   error: BaseException | None) -> tuple[int, dict[str, object]]:
    """OpenAI's status and error body; a model the server does not serve is named as vLLM's
    `param` names it."""
    if isinstance(error, grpc.aio.AioRpcError) and error.code() is grpc.StatusCode.NOT_FOUND:
        field = "model"
    return status, error_body(status, message, field)


class CompletionAnswer(Answer):
    """Chat's and completions' answer to one call per prompt; streamed, each choice opens
    with its role (chat) or its echoed prompt."""

    def __init__(self, calls: list[Call], options: OpenAIOptions) -> None:
        super().__init__(len(calls))
        self.calls = calls
        self.options = options
        self.sent_chars: dict[int, int] = {}  # per choice: the length of its text so far

    def reply(self) -> object:
        return reply(self.calls, self.generations, self.options)

    def events(self, call: int, response: sb.GenerateResponse) -> list[bytes]:
        options, generation = self.options, self.generations[call]
        sequence = self.collect(call, response)
        index = choice_index(options, call, response.index)
        chunks = []
        text, tokens = ("", []) if options.echo_only else (response.text, list(response.tokens))
        prefix, prompt = "", []
        if index not in self.sent_chars:
            self.sent_chars[index] = 0
            if options.echo:
                prefix = echo_text(self.calls[call], generation)
                prompt = generation.prompt
            if options.kind == "chat.completion":
                role_usage = usage(self.generations, pending=response.generated_tokens) \
                    if options.continuous_usage else None
                chunks.append(sse_event(chunk(options, index, role=True, usage=role_usage)))
        # Where the chunk's first token's text starts in the choice's text.
        offset = self.sent_chars[index] + (0 if prompt else len(prefix))
        self.sent_chars[index] += len(prefix) + len(text)
        chunks.append(sse_event(chunk(
            options, index, delta_text=prefix + text, tokens=tokens, prompt=prompt,
            text_offset=offset,
            usage=usage(self.generations) if options.continuous_usage else None,
            finish_reason="length" if options.echo_only and response.finish_reason
            else openai_tools.finish_reason(sequence, response.finish_reason,
                                            self.calls[call].request.messages),
            delta_fields=openai_tools.delta_fields(response))))
        return chunks

    def end(self) -> bytes:
        summary = sse_event(usage_chunk(self.generations, self.options)) \
            if self.options.include_usage else b""
        return summary + DONE_EVENT

    def error_event(self, body: object) -> bytes:
        return sse_event(body) + DONE_EVENT


class OpenAIErrors(Protocol):
    """OpenAI's routes' errors: `{"error": {"message", "type", "param", "code"}}`."""

    status_table = HTTP_STATUS

    def error_document(self, status: int, message: str, field: str | None,
                       error: BaseException | None) -> tuple[int, object]:
        return error_document(status, message, field, error)


class OpenAIProtocol(OpenAIErrors, GenerationProtocol):
    """OpenAI's generation routes."""


class CompletionsProtocol(OpenAIProtocol):
    """/v1/chat/completions (`chat`) and /v1/completions."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat

    async def exchange(self, document: object, served_model: ServedModel) -> Exchange:
        calls, options = (chat_request_to_pb(document) if self.chat
                          else completion_request_to_pb(document))
        if not options.model:
            options = dataclasses.replace(options, model=await served_model())
        return Exchange([call.request for call in calls], options.stream,
                        CompletionAnswer(calls, options), options.names)


CHAT = CompletionsProtocol(chat=True)
COMPLETIONS = CompletionsProtocol(chat=False)
