"""The gateway's OpenAPI 3.0.3 description, served at GET /openapi.json on the business plane.

Why: clients and fuzzers (schemathesis, in the test suite) need one machine-readable contract
of every REST route: its path parameters, the JSON body its translator accepts, its 200
reply, and its errors in its protocol's own shape. Nothing the code says elsewhere is restated:
a body's fields are its protocol module's (their names mapped onto switchboard.v1's parameters),
a parameter's type is its typed field's (proto/generation_fields.py), and its range is the one
the server publishes (GetParameterLimits), asked for at the first request and kept.

The document is built from the routes a server actually serves (`served_routes`: one server
serves every plane that shares its port), so it never lists a route that answers 404 there.
Paths come from the route patterns themselves (an optional group such as `/versions/{version}`
gives two paths); each operation is tagged with its plane(s) and its protocol. What each route
accepts and answers is in OPERATIONS (by route name and method); its error shape follows its
handler's class. Optional request fields accept null, meaning absent, as every translator reads
them, except where noted.
"""

from __future__ import annotations

import copy
import importlib.metadata
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, NamedTuple

import grpc
import tornado.routing
import tornado.web
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from switchboard.gateway import generation_handlers as generation
from switchboard.gateway import management_handlers as management
from switchboard.gateway.errors import KSERVE_HTTP_STATUS
from switchboard.gateway.handler import Handler
from switchboard.gateway.protocols import mindie, openai, sagemaker, tgi, triton, vllm
from switchboard.gateway.protocols.exchange import GenerationProtocol
from switchboard.gateway.protocols.mindie_management import MAX_HEALTH_TIMEOUT_S
from switchboard.gateway.roles import NO_ROLE, ROLES, RoleStatus
from switchboard.gateway.sse import CONTENT_TYPE as SSE_CONTENT_TYPE
from switchboard.proto import generation_fields, vllm_sampling
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto.constants import FORCED_STOP_S
from switchboard.proto.vllm_backend_tensors import CONTROL_INPUTS

JSON = dict[str, Any]


# --- JSON Schema helpers --------------------------------------------------------------------

def ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


def integer(low: int | None = None, high: int | None = None) -> JSON:
    schema: JSON = {"type": "integer"}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    return schema


def number(low: float | None = None, high: float | None = None, *,
           low_open: bool = False, high_open: bool = False) -> JSON:
    schema: JSON = {"type": "number"}
    if low is not None:
        schema["minimum"] = low
        if low_open:
            schema["exclusiveMinimum"] = True
    if high is not None:
        schema["maximum"] = high
        if high_open:
            schema["exclusiveMaximum"] = True
    return schema


def array(items: JSON, **limits: int) -> JSON:
    return {"type": "array", "items": items, **limits}


def obj(properties: Mapping[str, JSON], required: Iterable[str] = (), *,
        closed: bool = False) -> JSON:
    """An object; `closed`: other keys are refused (by the gateway or the server)."""
    schema: JSON = {"type": "object", "properties": dict(properties)}
    if required := list(required):
        schema["required"] = required
    if closed:
        schema["additionalProperties"] = False
    return schema


def nullable(schema: JSON) -> JSON:
    """`schema` or null. OpenAPI 3.0's `nullable` works beside a `type` only (and a $ref has
    no siblings): other schemas get null as one more alternative."""
    if "type" in schema:
        return {**schema, "nullable": True}
    alternatives = schema["oneOf"] if set(schema) == {"oneOf"} else [schema]
    return {"oneOf": [*alternatives, NULL]}


def optional(properties: Mapping[str, JSON]) -> dict[str, JSON]:
    """Optional fields: null is absent."""
    return {name: nullable(schema) for name, schema in properties.items()}


def only(value: object, schema: JSON) -> JSON:
    """A field whose one accepted value is `value` (others are refused as unsupported)."""
    return {**schema, "enum": [value]}


# Null alone (OpenAPI 3.0 has no null type).
NULL: JSON = {"type": "object", "nullable": True, "enum": [None]}
BOOLEAN: JSON = {"type": "boolean"}
STRING: JSON = {"type": "string"}
TEXT: JSON = {"type": "string", "minLength": 1}
# MindIE's and TGI's watermark: accepted and ignored, as MindIE's post-processing ignores it.
IGNORED_WATERMARK: JSON = {**BOOLEAN, "description": "accepted and ignored: no watermark is "
                           "applied (as MindIE answers it)"}
# MindIE's rule for a request id.
REQUEST_ID: JSON = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,256}$"}
TOKEN_ID = integer(0, generation_fields.UINT32_MAX)
# Before OpenAPI 3.2, an event stream's schema describes each event.
SSE: JSON = {SSE_CONTENT_TYPE.split(";")[0]: {"schema": obj({"data": STRING, "event": STRING},
                                                          ["data"])}}


# --- the server's parameters ------------------------------------------------------------------

# What the server accepts of each switchboard.v1 parameter beyond its type, as it publishes it
# (GetParameterLimits), by the parameter's name.
Limits = Mapping[str, sb.ParameterLimits]
_INTEGER_TYPES = {FieldDescriptor.TYPE_INT64: generation_fields.INT64_RANGE,
                  FieldDescriptor.TYPE_UINT64: generation_fields.UINT64_RANGE}


def parameter(name: str, limits: Limits) -> JSON:
    """switchboard.v1's parameter `name` (MindIE's name): its field's type, within the limits
    the server publishes for it. A list may come as its one item where the typed field takes
    that (`stop`); a JSON schema as an object or its text."""
    _, field = generation_fields.FIELDS[name]
    limit = limits.get(name, sb.ParameterLimits())
    items = {"minItems": limit.min_items} if limit.min_items else {}
    if limit.HasField("max_items"):
        items["maxItems"] = limit.max_items
    text = {**STRING, "minLength": limit.min_length} if limit.min_length else STRING
    if field.message_type is sb.Choices.DESCRIPTOR:
        return array(text, **items)
    if field.message_type is sb.TokenIds.DESCRIPTOR or field.type == FieldDescriptor.TYPE_UINT32:
        return array(TOKEN_ID, **items)
    if field.message_type is not None:  # a map from token ids (logit_bias)
        return {"type": "object", "additionalProperties": _number(limit)}
    if field.is_repeated:
        return {"oneOf": [text, array(text, **items)]}
    if field.type == FieldDescriptor.TYPE_BOOL:
        return BOOLEAN
    if name in generation_fields.SCHEMA_FIELDS:
        return {"oneOf": [{"type": "object"}, text]}
    if name == "guided_regex":
        return {**text, "description": "a regular expression the output must match"}
    if field.type == FieldDescriptor.TYPE_STRING:
        return text
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return _number(limit)
    bounds = _INTEGER_TYPES[field.type]
    low, high = bounds.start, bounds.stop - 1
    if limit.HasField("minimum"):
        low = max(low, math.floor(limit.minimum) + 1 if limit.exclusive_minimum
                  else math.ceil(limit.minimum))
    if limit.HasField("maximum"):
        high = min(high, math.ceil(limit.maximum) - 1 if limit.exclusive_maximum
                   else math.floor(limit.maximum))
    return integer(low, high)


def _number(limit: sb.ParameterLimits) -> JSON:
    return number(_bound(limit, "minimum"), _bound(limit, "maximum"),
                  low_open=limit.exclusive_minimum, high_open=limit.exclusive_maximum)


def _bound(limit: sb.ParameterLimits, name: str) -> float | None:
    """A published bound, whole ones as integers (as JSON writes them: 2, not 2.0)."""
    if not limit.HasField(name):
        return None
    value = getattr(limit, name)
    return int(value) if value.is_integer() else value


_SCALARS = {FieldDescriptor.TYPE_BOOL: BOOLEAN, FieldDescriptor.TYPE_STRING: STRING,
            FieldDescriptor.TYPE_UINT32: integer(0, generation_fields.UINT32_MAX)}


def message_schema(descriptor: Descriptor) -> JSON:
    """A switchboard.v1 message that travels as JSON, field for field, as protobuf's JSON
    mapping reads it (null: absent; other keys ignored)."""
    return obj({field.name: nullable(array(_SCALARS[field.type]) if field.is_repeated
                                     else _SCALARS[field.type])
                for field in descriptor.fields})


def from_zero(schema: JSON) -> JSON:
    """`schema` with 0 accepted at its low end, as a protocol that reads 0 as greedy does."""
    return {key: value for key, value in schema.items() if key != "exclusiveMinimum"} | {
        "minimum": 0}


def parameters(names: Mapping[str, str], limits: Limits) -> dict[str, JSON]:
    """A protocol's parameters (`names`: its name → switchboard.v1's) as the server takes them."""
    return {name: parameter(contract, limits) for name, contract in names.items()}


def mindie_parameters(limits: Limits) -> dict[str, JSON]:
    """The request parameters of the Triton family and MindIE (docs/parameters.md), under
    MindIE's names and REST units (a timeout in seconds): switchboard.v1's, but
    those its one-sequence answers cannot carry, MindIE's seeds positive, and what MindIE
    accepts without effect. KServe's parameters carry a logit bias and a JSON schema as
    their JSON text."""
    names = [name for name in generation_fields.FIELDS
             if name not in generation_fields.UNCARRIED | generation_fields.SINGLE_SEQUENCE]
    schemas = parameters(dict(zip(names, names)), limits)
    schemas["seed"]["minimum"] = max(schemas["seed"]["minimum"], generation_fields.MINDIE_MIN_SEED)
    bias = schemas["logit_bias"]["additionalProperties"]
    within = f" in [{bias['minimum']}, {bias['maximum']}]" if "maximum" in bias else ""
    schemas["logit_bias"] = {**STRING, "description": f"token ids to biases{within}: "
                             '{"7042": -100}'}
    schemas["guided_json"] = {**STRING, "description": "a JSON schema (its JSON text) the "
                              "output must follow"}
    return {**schemas,
            **{name: IGNORED_WATERMARK if name == "watermark" else BOOLEAN
               for name in generation_fields.MINDIE_IGNORED_FLAGS},
            generation_fields.MINDIE_IGNORED_COUNT: integer(1)}


def kserve_generate_parameters(limits: Limits) -> dict[str, JSON]:
    """KServe's generate extension (the Open Inference Protocol's generate_rest.yaml) on
    Triton's /generate routes, beside MindIE's names: its temperature and top_p from 0."""
    schemas = parameters(triton.KSERVE_NAMES, limits)
    schemas["max_tokens"] = {**schemas["max_tokens"],
                             "description": "KServe's name of max_new_tokens (default 20)"}
    return {**schemas, **{name: from_zero(parameter(name, limits))
                          for name in triton.GREEDY_AT_ZERO}}


# TGI's parameters that are no switchboard.v1 parameter: how it renders, structured output
# (add_output_format), and adapter_id, refused unless null or "None" (MindIE's examples).
TGI_OWN_PARAMETERS: dict[str, JSON] = {
    "details": BOOLEAN, "return_full_text": BOOLEAN, "watermark": IGNORED_WATERMARK,
    "grammar": obj({"type": {"type": "string", "enum": ["json", "regex", "json_schema"]},
                    "value": {}}, ["type", "value"]),
    "adapter_id": only("None", STRING),
}


def tgi_parameters(limits: Limits) -> dict[str, JSON]:
    return {**parameters({name: tgi.NAMES.get(name, name)
                          for name in sorted(tgi.GENERATION_PARAMETERS)}, limits),
            **{name: TGI_OWN_PARAMETERS[name]
               for name in sorted(tgi.PARAMETERS - tgi.GENERATION_PARAMETERS)}}


def vllm_sampling_parameters(fields: Iterable[str], limits: Limits) -> dict[str, JSON]:
    """vLLM's sampling fields, as vLLM reads them (vllm_sampling): temperature from 0 (greedy),
    top_k from -1 (no cut), an int64 seed (-1: random)."""
    schemas = parameters({name: vllm_sampling.NAMES.get(name, name) for name in sorted(fields)},
                         limits)
    readings = {"temperature": from_zero(parameter("temperature", limits)),
                "top_k": {**parameter("top_k", limits), "minimum": vllm_sampling.NO_TOP_K},
                "seed": {**integer(vllm_sampling.INT64.start, vllm_sampling.INT64.stop - 1),
                         "description": f"vLLM's int64; {vllm_sampling.RANDOM_SEED} draws a "
                                        "random seed"}}
    return {**schemas, **{name: schema for name, schema in readings.items() if name in schemas}}


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
               dict: "object"}


def neutral(values: Iterable[object]) -> JSON:
    """A field accepted at `values` alone (and null), as OpenAI's NEUTRAL_VALUES lists them."""
    values = list(values)
    if not values:
        return NULL
    accepted: list[object] = []
    for value in values:
        if value not in accepted:  # 1 and 1.0 are one JSON value
            accepted.append(value)
    kinds = {_JSON_TYPES[type(value)] for value in values}
    kind = "number" if kinds == {"integer", "number"} else kinds.pop()
    return {"type": kind, "enum": accepted}


def typed(fields: Mapping[str, type]) -> dict[str, JSON]:
    """Fields by their JSON types (Python's: str, bool, dict…), in name order."""
    return {name: {"type": _JSON_TYPES[kind]} for name, kind in sorted(fields.items())}


def openai_common(limits: Limits) -> dict[str, JSON]:
    """The fields chat completions and completions share (openai.ACCEPTED_FIELDS, but
    `logprobs`, which each reads its own way)."""
    return {
        **vllm_sampling_parameters(openai.SAMPLING_FIELDS, limits), "model": STRING,
        "max_tokens": parameter(openai.NAMES["max_tokens"], limits), "stream": BOOLEAN,
        "stream_options": obj({"include_usage": nullable(BOOLEAN),
                               "continuous_usage_stats": nullable(BOOLEAN)}),
        "logit_bias": parameter("logit_bias", limits),
        # OpenAI's forms, and TGI's ("json" or "regex" with a value).
        "response_format": {"oneOf": [
            obj({"type": {"type": "string", "enum": ["text", "json_object"]}}, ["type"]),
            obj({"type": only("json_schema", STRING), "json_schema": obj({
                "name": STRING, "description": STRING, "schema": {"type": "object"},
                "strict": nullable(BOOLEAN)}, ["schema"])}, ["type", "json_schema"]),
            obj({"type": {"type": "string", "enum": ["json", "regex", "json_schema"]},
                 "value": {}}, ["type", "value"])]},
        # vLLM's: one of them.
        "structured_outputs": obj({
            key: only(True, BOOLEAN) if key == "json_object" else parameter(name, limits)
            for key, name in openai.STRUCTURED_OUTPUTS.items()}, closed=True),
        **typed({**openai.IGNORED_FIELDS, **openai.IGNORED_HINTS}),
        **{name: neutral(values) for name, values in openai.NEUTRAL_VALUES.items()},
        # Prefill/decode disaggregation, as vLLM's proxy sends it and a prefill answers it.
        openai.KV_TRANSFER_FIELD: ref("KVTransferParams"),
    }


# --- request bodies -------------------------------------------------------------------------

TEXT_PART = obj({"type": only("text", STRING), "text": STRING}, ["type", "text"])
TOOL_CALL = obj({"id": STRING, "type": only("function", STRING),
                 "function": obj({"name": STRING, "arguments": STRING}, ["name", "arguments"])},
                ["id", "function"])
MESSAGE = obj({"role": {"type": "string",
                        "enum": ["system", "developer", "user", "assistant", "tool"]},
               "content": nullable({"oneOf": [STRING, array(TEXT_PART)]}),
               # An assistant's calls; a tool message's answer to one of them.
               "tool_calls": array(TOOL_CALL), "tool_call_id": STRING}, ["role"])
FUNCTION: dict[str, JSON] = {"name": TEXT, "description": STRING,
                             "parameters": {"type": "object"}, "strict": nullable(BOOLEAN)}
TOOL_CHOICE_MODES: JSON = {"type": "string", "enum": ["none", "auto", "required"]}
# Chat's tools nest the function; the Responses API's are the function.
TOOL = obj({"type": only("function", STRING), "function": obj(FUNCTION, ["name"])},
           ["type", "function"])
# A named choice without its type is TGI's.
TOOL_CHOICE = {"oneOf": [TOOL_CHOICE_MODES,
                         obj({"type": only("function", STRING),
                              "function": obj({"name": TEXT}, ["name"])}, ["function"])]}
RESPONSES_TOOL = obj({"type": only("function", STRING), **FUNCTION}, ["type", "name"])
RESPONSES_TOOL_CHOICE = {"oneOf": [TOOL_CHOICE_MODES,
                                   obj({"type": only("function", STRING), "name": TEXT},
                                       ["type", "name"])]}
# vLLM's options of the chat template's rendering: more template variables; where it ends
# (continue_final_message needs add_generation_prompt false and an assistant's last message).
CHAT_TEMPLATE_OPTIONS: dict[str, JSON] = {
    "chat_template_kwargs": {"type": "object"}, "add_generation_prompt": BOOLEAN,
    "continue_final_message": BOOLEAN}
# Triton's vLLM backend interface's inputs beside text_input (a JSON value, or an array of one).
VLLM_BACKEND_INPUTS: dict[str, JSON] = {
    name: BOOLEAN if datatype == "BOOL" else STRING for name, datatype in CONTROL_INPUTS.items()}
# A prompt: at least one token.
PROMPT = TEXT
PROMPT_IDS = array(TOKEN_ID, minItems=1)
# KServe v2 tensors in JSON (the binary extension's `binary_data_size` needs a binary body).
TOKEN_IDS_INPUT = obj({"name": only("input0", STRING), "datatype": only("UINT32", STRING),
                       "shape": array(integer(1), minItems=1, maxItems=2), "data": PROMPT_IDS},
                      ["name", "datatype", "shape", "data"], closed=True)
TEXT_INPUT = obj({"name": only("text_input", STRING), "datatype": only("BYTES", STRING),
                  "shape": array(only(1, integer()), minItems=1, maxItems=1),
                  "data": array(PROMPT, minItems=1, maxItems=1)},
                 ["name", "datatype", "shape", "data"], closed=True)


def requests(limits: Limits) -> dict[str, JSON]:
    """The request bodies' schemas, their parameters within the server's `limits`."""
    mindie = mindie_parameters(limits)
    generate = {**mindie, **kserve_generate_parameters(limits), **VLLM_BACKEND_INPUTS}
    common = openai_common(limits)
    top_logprobs = parameter("top_logprobs", limits)
    max_new_tokens = parameter("max_new_tokens", limits)
    return {
        "Parameters": obj(optional(mindie), closed=True),
        "InferRequest": obj({
            "id": nullable(REQUEST_ID),
            # Not null: binary_data_output, outputs and the tensors' fields.
            "parameters": nullable(obj({**optional(mindie), "binary_data_output": BOOLEAN},
                                       closed=True)),
            "inputs": array({"oneOf": [TOKEN_IDS_INPUT, TEXT_INPUT]}, minItems=1, maxItems=1),
            # The input's output: output0 for input0, text_output for text_input.
            "outputs": array(obj({"name": {"type": "string", "enum": ["output0", "text_output"]},
                                  "parameters": obj({"binary_data": BOOLEAN}, closed=True)},
                                 ["name"], closed=True), maxItems=1),
        }, ["inputs"], closed=True),
        # Triton's generate extension: top-level fields other than these are parameters too; those
        # named as the vLLM backend interface's inputs are those tensors.
        "GenerateParameters": obj(optional(generate), closed=True),
        "GenerateRequest": obj({"id": nullable(REQUEST_ID), "text_input": PROMPT,
                                "parameters": nullable(ref("GenerateParameters")),
                                **optional(generate)},
                               ["text_input"], closed=True),
        "StopInferRequest": obj({"id": REQUEST_ID}, ["id"]),
        "RepositoryIndexRequest": obj({"ready": nullable(BOOLEAN)}, closed=True),
        "TgiParameters": obj(optional(tgi_parameters(limits)), closed=True),
        # `stream` is read by POST / only.
        "TgiRequest": obj({"inputs": PROMPT, "parameters": nullable(ref("TgiParameters")),
                           "stream": nullable(BOOLEAN)}, ["inputs"]),
        "VllmRequest": obj({"prompt": PROMPT, **optional({
            "stream": BOOLEAN, **vllm_sampling_parameters(vllm.SAMPLING_FIELDS, limits)})},
            ["prompt"], closed=True),
        "ChatCompletionRequest": obj({
            **optional(common), "messages": array(MESSAGE, minItems=1),
            **optional({"max_completion_tokens": max_new_tokens,
                        "logprobs": parameter("logprobs", limits), "top_logprobs": top_logprobs,
                        # "auto" (the default with tools) needs the server's
                        # --enable-auto-tool-choice and --tool-call-parser.
                        "tools": array(TOOL), "tool_choice": TOOL_CHOICE,
                        "parallel_tool_calls": BOOLEAN, **CHAT_TEMPLATE_OPTIONS,
                    **{name: neutral(values) for name, values in openai.CHAT_NEUTRAL_VALUES.items()
                       if name not in openai.NEUTRAL_VALUES}}),
        }, ["messages"], closed=True),
        "KVTransferParams": message_schema(sb.KVTransferParams.DESCRIPTOR),
        "ResponsesRequest": obj({
            **optional({**vllm_sampling_parameters(openai.SAMPLING_FIELDS - {"n"}, limits),
                        **typed(openai.IGNORED_FIELDS),
                        "model": STRING, "instructions": STRING,
                        "max_output_tokens": max_new_tokens, "stream": BOOLEAN,
                        "text": obj({"format": {"oneOf": [
                            obj({"type": only("text", STRING)}, ["type"]),
                            obj({"type": only("json_object", STRING)}, ["type"]),
                            obj({"type": only("json_schema", STRING), "name": STRING,
                                 "schema": {"type": "object"}, "strict": nullable(BOOLEAN)},
                                ["type", "schema"])]}}),
                        "tools": array(RESPONSES_TOOL), "tool_choice": RESPONSES_TOOL_CHOICE,
                        "include": array(only("message.output_text.logprobs", STRING)),
                        "top_logprobs": top_logprobs, "truncation": only("disabled", STRING),
                        "parallel_tool_calls": BOOLEAN}),
            "input": {"oneOf": [PROMPT, array({"oneOf": [
                obj({"type": only("message", STRING),
                     "role": {"type": "string",
                              "enum": ["system", "developer", "user", "assistant"]},
                     "content": {"oneOf": [STRING, array(obj({
                         "type": {"type": "string", "enum": ["input_text", "output_text"]},
                         "text": STRING}, ["type", "text"]))]}}, ["role", "content"]),
                obj({"type": only("function_call", STRING), "call_id": STRING, "name": STRING,
                     "arguments": STRING, "id": STRING, "status": STRING},
                    ["type", "call_id", "name", "arguments"]),
                obj({"type": only("function_call_output", STRING), "call_id": STRING,
                     "output": STRING, "id": STRING, "status": STRING},
                    ["type", "call_id", "output"])]}, minItems=1)]},
        }, ["input"], closed=True),
        "CompletionRequest": obj({
            **optional(common),
            "prompt": {"oneOf": [PROMPT, array(PROMPT, minItems=1), PROMPT_IDS,
                                 array(PROMPT_IDS, minItems=1)]},
            **optional({"logprobs": parameter(openai.COMPLETION_NAMES["logprobs"], limits),
                        "echo": BOOLEAN, "best_of": parameter("best_of", limits),
                        "max_tokens": {**max_new_tokens, "minimum": 0, "description": (
                            "0 only with echo: the prompt alone, with its tokens' logprobs")}}),
            # Refused unless null.
            "suffix": only(None, STRING),
        }, ["prompt"], closed=True),
        "MindIEInferRequest": obj({"inputs": PROMPT, "id": nullable(REQUEST_ID),
                                   "stream": nullable(BOOLEAN),
                                   "parameters": nullable(ref("Parameters"))}, ["inputs"]),
        "MindIEInferTokenRequest": obj({"input_id": PROMPT_IDS, "id": nullable(REQUEST_ID),
                                        "stream": nullable(BOOLEAN),
                                        "parameters": nullable(ref("Parameters"))},
                                       ["input_id"]),
        "TokenizerRequest": obj({"inputs": STRING, "do_decode": nullable(BOOLEAN)}, ["inputs"]),
        "VllmTokenizeRequest": {"oneOf": [
            obj({"model": STRING, "prompt": STRING, "add_special_tokens": BOOLEAN,
                 "return_token_strs": BOOLEAN}, ["prompt"], closed=True),
            obj({"model": STRING, "messages": array(MESSAGE, minItems=1),
                 "add_special_tokens": only(False, BOOLEAN), "return_token_strs": BOOLEAN,
                 **optional(CHAT_TEMPLATE_OPTIONS)},
                ["messages"], closed=True)]},
        "VllmDetokenizeRequest": obj({"model": STRING, "tokens": array(TOKEN_ID)}, ["tokens"],
                                     closed=True),
    }



# --- replies ----------------------------------------------------------------------------------

def counts(*names: str) -> dict[str, JSON]:
    return {name: integer(0) for name in names}


# TGI's token, which KServe's generate extension shares.
TOKEN = obj({"id": integer(0), "text": STRING, "logprob": nullable(number()),
             "special": BOOLEAN}, ["id", "text", "logprob", "special"])
TGI_DETAILS = obj({
    "finish_reason": STRING, **counts("generated_tokens", "prompt_tokens"),
    # TGI's Option<u64>: null where the answer was greedy.
    "seed": nullable(integer(0)),
    "prefill": array(obj({"id": integer(0), "text": STRING, "logprob": nullable(number())})),
    "tokens": array(TOKEN), "top_tokens": array(array(TOKEN)),
    "best_of_sequences": array({"type": "object"}),
}, ["finish_reason", "generated_tokens", "seed", "prompt_tokens", "prefill", "tokens"])
OPENAI_HEADER: dict[str, JSON] = {"id": STRING, "object": STRING, "created": integer(0),
                                  "model": STRING, "system_fingerprint": STRING}
OPENAI_CHOICE: dict[str, JSON] = {"index": integer(0), "logprobs": nullable({"type": "object"}),
                                  "finish_reason": STRING}
USAGE = obj({**counts("prompt_tokens", "completion_tokens", "total_tokens"),
             "prompt_tokens_details": obj(counts("cached_tokens")),
             # With the server's --reasoning-parser, where the answer reasoned.
             "completion_tokens_details": obj(counts("reasoning_tokens"))},
            ["prompt_tokens", "completion_tokens", "total_tokens"])
TENSOR_METADATA = obj({"name": STRING, "datatype": STRING, "shape": array(integer())},
                      ["name", "datatype", "shape"])
MINDIE_DETAILS = obj({"finish_reason": STRING, **counts("generated_tokens"), "seed": integer(0)},
                     ["finish_reason", "generated_tokens", "seed"])
MINDIE_REPLY: dict[str, JSON] = {"generated_text": STRING, "details": MINDIE_DETAILS}

REPLIES: dict[str, JSON] = {
    "ServerMetadata": obj({"name": STRING, "version": STRING, "extensions": array(STRING)},
                          ["name", "version", "extensions"]),
    "ModelMetadata": obj({"name": STRING, "versions": array(STRING), "platform": STRING,
                          "inputs": array(TENSOR_METADATA), "outputs": array(TENSOR_METADATA)},
                         ["name", "versions", "platform", "inputs", "outputs"]),
    "ModelConfig": obj({"name": STRING}, ["name"]),
    "RepositoryIndex": array(obj({"name": STRING, "version": STRING, "state": STRING,
                                  "reason": STRING}, ["name", "version", "state", "reason"])),
    "ModelStatistics": obj({"model_stats": array(obj({
        "name": STRING, "version": STRING,
        **counts("last_inference", "inference_count", "execution_count"),
        "inference_stats": {"type": "object", "additionalProperties": obj(
            counts("count", "ns"), ["count", "ns"])},
    }, ["name", "version", "inference_count", "execution_count", "inference_stats"]))},
        ["model_stats"]),
    "InferResponse": obj({
        "model_name": STRING, "model_version": STRING, "id": STRING,
        "parameters": {"type": "object"},
        "outputs": array(obj({**TENSOR_METADATA["properties"], "data": {"type": "array"},
                              "parameters": obj(counts("binary_data_size"))},
                             ["name", "datatype", "shape"])),
    }, ["model_name", "model_version", "outputs"]),
    "GenerateResponse": obj({
        "id": STRING, "model_name": STRING, "model_version": STRING, "text_output": STRING,
        "details": obj({**counts("generated_tokens"), "finish_reason": STRING,
                        "first_token_cost": nullable(number(0)),
                        "decode_cost": nullable(number(0)),
                        "perf_stat": array(array(number(), minItems=2, maxItems=2)),
                        # KServe's generate extension, with details: each token generated.
                        "logprobs": array(TOKEN)},
                       ["generated_tokens", "first_token_cost", "decode_cost"]),
        # The vLLM backend interface's outputs (Triton's reply: no id when the request has none).
        "finish_reason": STRING, **counts("num_input_tokens", "num_output_tokens"),
    }, ["model_name", "model_version", "text_output"]),
    "StopInferResponse": obj({"id": STRING, **counts("num_stopped")}, ["id", "num_stopped"]),
    "SlotCount": obj(counts("total_slots", "free_slots", "available_tokens_length"),
                     ["total_slots", "free_slots", "available_tokens_length"]),
    "TgiResponse": obj({"generated_text": STRING, "details": TGI_DETAILS}, ["generated_text"]),
    "TgiCompatResponse": array(ref("TgiResponse"), minItems=1, maxItems=1),
    "TgiInfo": obj({"model_id": STRING, "version": STRING, "router": STRING,
                    **{name: nullable(integer(0)) for name in (
                        "max_best_of", "max_stop_sequences", "max_input_length",
                        "max_input_tokens", "max_total_tokens", "max_client_batch_size")}},
                   ["model_id", "version"]),
    "VllmResponse": obj({"text": array(STRING)}, ["text"]),
    "TgiTokens": array(obj({"id": integer(0), "text": STRING, **counts("start", "stop")},
                           ["id", "text", "start", "stop"])),
    "TgiChatTokens": obj({"tokenize_response": ref("TgiTokens"), "templated_text": STRING},
                         ["tokenize_response", "templated_text"]),
    "VllmTokens": obj({**counts("count", "max_model_len"), "tokens": array(integer(0)),
                       "token_strs": nullable(array(STRING))},
                      ["count", "max_model_len", "tokens"]),
    "VllmText": obj({"prompt": STRING}, ["prompt"]),
    "Version": obj({"version": STRING}, ["version"]),
    "Model": obj({"id": STRING, "object": only("model", STRING), "created": integer(0),
                  "owned_by": STRING, "root": STRING, "parent": nullable(STRING),
                  "max_model_len": nullable(integer(1))},
                 ["id", "object", "created", "owned_by"]),
    "ModelList": obj({"object": only("list", STRING), "data": array(ref("Model"))},
                     ["object", "data"]),
    "ChatCompletion": obj({
        **OPENAI_HEADER, "object": only("chat.completion", STRING), "usage": USAGE,
        "kv_transfer_params": ref("KVTransferParams"),
        "choices": array(obj({**OPENAI_CHOICE, "message": obj(
            {"role": only("assistant", STRING),
             # Null where the answer is only tool calls (finish_reason "tool_calls").
             "content": nullable(STRING), "refusal": NULL, "tool_calls": array(TOOL_CALL),
             "reasoning_content": STRING}, ["role", "content", "refusal"])},
            ["index", "message", "finish_reason"])),
    }, ["id", "object", "created", "model", "system_fingerprint", "choices", "usage"]),
    "TextCompletion": obj({
        **OPENAI_HEADER, "object": only("text_completion", STRING), "usage": USAGE,
        "kv_transfer_params": ref("KVTransferParams"),
        "choices": array(obj({**OPENAI_CHOICE, "text": STRING},
                             ["index", "text", "finish_reason"])),
    }, ["id", "object", "created", "model", "system_fingerprint", "choices", "usage"]),
    "Response": obj({
        "id": STRING, "object": only("response", STRING), "created_at": integer(0),
        "status": {"type": "string", "enum": ["completed", "incomplete"]},
        "incomplete_details": nullable(obj({"reason": only("max_output_tokens", STRING)})),
        "model": STRING,
        "output": array(obj({
            "id": STRING, "type": only("message", STRING), "role": only("assistant", STRING),
            "status": STRING,
            "content": array(obj({"type": only("output_text", STRING), "text": STRING},
                                 ["type", "text"]))}, ["id", "type", "role", "content"]),
            minItems=1, maxItems=1),
        "usage": obj({**counts("input_tokens", "output_tokens", "total_tokens"),
                      "input_tokens_details": obj(counts("cached_tokens"))},
                     ["input_tokens", "output_tokens", "total_tokens"]),
    }, ["id", "object", "created_at", "status", "model", "output", "usage"]),
    "MindIEResponse": obj(MINDIE_REPLY, ["generated_text"]),
    "MindIETokenResponse": obj({**MINDIE_REPLY, "generated_token_ids": array(integer(0))},
                               ["generated_text", "generated_token_ids"]),
    "TokenizerResponse": obj({**counts("token_number"),
                              "tokens": array({"oneOf": [integer(0), STRING]})},
                             ["token_number", "tokens"]),
    "HealthTimed": obj({"status": only("healthy", STRING)}, ["status"]),
    "MindIEConfig": obj({"modelName": STRING, "device": STRING, "dtype": STRING,
                         "npuMemSize": number(0), **counts(
                             "maxSeqLen", "maxInputTokenLen", "maxOutputLen", "maxIterTimes",
                             "maxBatchSize", "cacheBlockSize", "cpuMemSize", "worldSize")},
                        ["modelName", "maxSeqLen", "maxInputTokenLen", "maxOutputLen",
                         "maxBatchSize"]),
    "MindIEStatus": obj({
        "service": obj({"roleStatus": {"type": "string", "enum": [
                            status.value for status in RoleStatus]},
                        "currentRole": {"type": "string", "enum": [NO_ROLE, *ROLES]}},
                       ["roleStatus", "currentRole"]),
        "resource": obj(counts("availSlotsNum", "availBlockNum", "waitingRequestNum",
                               "runningRequestNum", "swappedRequestNum", "freeNpuBlockNums",
                               "totalNpuBlockNums", "freeCpuBlockNums", "totalCpuBlockNums")),
        "linkStatus": obj({"peers": array(obj({"target": integer(0), "link": STRING},
                                              ["target", "link"]))}),
    }, ["service", "resource", "linkStatus"]),
    # MindIE's role body: this instance (`local`) and those of the other role (`peers`), each
    # with Switchboard's `port`, its gateway's management port (roles.py checks the rest).
    "MindIERole": obj({"local": {"type": "object"},
                       "peers": array({"type": "object", "properties": {
                           "id": integer(0), "server_ip": STRING,
                           "port": integer(1, 65535)}})}, ["local"]),
    "MindIERoleResult": obj({"result": STRING}, ["result"]),
    "MetricsJson": obj({"resultType": only("vector", STRING), "result": array(obj({
        "metric": array(obj({"__name__": STRING, "job": STRING, "instance": STRING})),
        "value": STRING}, ["metric", "value"]))}, ["resultType", "result"]),
    "OpenAPIDocument": obj({"openapi": STRING, "info": {"type": "object"},
                            "paths": {"type": "object"}}, ["openapi", "info", "paths"]),
}


# --- errors -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ErrorShape:
    """A protocol's error body (component `name`), the statuses its routes may answer with it,
    and `narrow(status)`: what the body holds at that status (the error type the protocol's
    own error_body gives it), if anything."""

    name: str
    protocol: str
    description: str
    schema: JSON
    statuses: tuple[int, ...]
    narrow: Callable[[int], JSON] | None = None

    def at(self, status: int) -> JSON:
        if self.narrow is None:
            return ref(self.name)
        return {"allOf": [ref(self.name), self.narrow(status)]}


def error_type(error_body: Callable[[int, str], Mapping[str, object]]) -> Callable[[int], JSON]:
    return lambda status: obj({"error_type": only(error_body(status, "")["error_type"], STRING)})


def either(*shapes: ErrorShape) -> Callable[[int], JSON]:
    """The errors of a route answering in several shapes: at a status, the body of one of
    the shapes that have it."""
    return lambda status: {"oneOf": [shape.at(status) for shape in shapes
                                     if status in shape.statuses]}


def openai_error(status: int) -> JSON:
    error = openai.error_body(status, "", None)["error"]
    return obj({"error": obj({"type": only(error["type"], STRING),
                              "code": only(error["code"], STRING)})})


def statuses(table: Mapping[grpc.StatusCode, int], *own: int) -> tuple[int, ...]:
    """A protocol's error statuses: the server's, as `table` maps them, and the gateway's own:
    413 (a body over the limit), 415 (a Content-Encoding other than gzip or deflate), 500
    (anything unexpected) and `own`."""
    return tuple(sorted({*table.values(), 413, 415, 500, *own}))


TYPED_ERROR = obj({"error": STRING, "error_type": STRING}, ["error", "error_type"], closed=True)
KSERVE_ERROR = ErrorShape(
    "KServeError", "kserve", 'KServe v2 / Triton routes; errors are `{"error": message}`',
    obj({"error": STRING}, ["error"], closed=True), statuses(KSERVE_HTTP_STATUS))
TGI_ERROR = ErrorShape(
    "TgiError", "tgi", 'TGI\'s routes and vLLM\'s /generate; errors are `{"error", "error_type"}`',
    TYPED_ERROR, statuses(tgi.HTTP_STATUS), error_type(tgi.error_body))
OPENAI_ERROR = ErrorShape(
    "OpenAIError", "openai",
    'OpenAI\'s routes; errors are `{"error": {"message", "type", "param", "code"}}`',
    obj({"error": obj({"message": STRING, "type": STRING, "param": nullable(STRING),
                       "code": nullable(STRING)}, ["message", "type", "param", "code"],
                      closed=True)},
        ["error"], closed=True),
    statuses(openai.HTTP_STATUS), openai_error)
# MindIE's own: 400 for a body that is not JSON, 501 for what is not implemented.
MINDIE_ERROR = ErrorShape(
    "MindIEError", "mindie",
    'MindIE\'s native and management routes; errors are `{"error", "error_type"}`',
    TYPED_ERROR, statuses(mindie.HTTP_STATUS, 400, 501), error_type(mindie.error_body))


def tgi_or_openai(name: str, protocol: str, description: str) -> ErrorShape:
    """The errors of a route whose body chooses TGI's protocol or an OpenAI-style one."""
    return ErrorShape(name, protocol, description,
                      {"oneOf": [ref(TGI_ERROR.name), ref(OPENAI_ERROR.name)]},
                      tuple(sorted({*TGI_ERROR.statuses, *OPENAI_ERROR.statuses})),
                      either(TGI_ERROR, OPENAI_ERROR))


SAGEMAKER_ERROR = tgi_or_openai(
    "SageMakerError", "sagemaker",
    "SageMaker's /invocations; errors are TGI's for a body with `inputs` once it is read, "
    "OpenAI's otherwise")
TOKENIZE_ERROR = tgi_or_openai(
    "TokenizeError", "tgi",
    "POST /tokenize; errors are TGI's for a body with `inputs` (or neither `prompt` nor "
    "`messages`), vLLM's OpenAI errors for one with `prompt` or `messages`")
SHAPES = (KSERVE_ERROR, TGI_ERROR, OPENAI_ERROR, MINDIE_ERROR, SAGEMAKER_ERROR, TOKENIZE_ERROR)
# A generation route's error shape is its protocol's nearest base class's here; another
# handler's, its nearest base class's.
PROTOCOL_ERROR_SHAPES: dict[type[GenerationProtocol], ErrorShape] = {
    sagemaker.Invocations: SAGEMAKER_ERROR,
    tgi.TgiProtocol: TGI_ERROR,
    openai.OpenAIProtocol: OPENAI_ERROR,
    mindie.MindieProtocol: MINDIE_ERROR,
}
ERROR_SHAPES: dict[type[tornado.web.RequestHandler], ErrorShape] = {
    generation.TokenizeHandler: TOKENIZE_ERROR,
    generation.TgiHandler: TGI_ERROR,
    generation.OpenAIHandler: OPENAI_ERROR,
    generation.TokenizerHandler: MINDIE_ERROR,
    management.ManagementHandler: MINDIE_ERROR,
    Handler: KSERVE_ERROR,
}


def error_shape(handler: type[tornado.web.RequestHandler]) -> ErrorShape:
    if issubclass(handler, generation.GenerationRoute):
        return next(PROTOCOL_ERROR_SHAPES[base] for base in type(handler.protocol).__mro__
                    if base in PROTOCOL_ERROR_SHAPES)
    return next(ERROR_SHAPES[base] for base in handler.__mro__ if base in ERROR_SHAPES)


# --- operations -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Operation:
    """What one method of a route takes and answers: `body`, its JSON request schema (which
    may be left out unless `body_required`); `ok`, its 200 reply by media type (empty: no
    body; None: it never answers 200)."""

    summary: str
    ok: Mapping[str, JSON] | None
    body: JSON | None = None
    body_required: bool = True


def json_reply(name: str) -> dict[str, JSON]:
    return {"application/json": {"schema": ref(name)}}


NO_BODY: dict[str, JSON] = {}
HEALTH = Operation("200 (empty) when the model is ready and no stop is under way, else 503",
                   NO_BODY)
GENERATION_STREAM = "Server-Sent Events, one `data:` event per token"
SERVER_METADATA = {"get": Operation("KServe v2 server metadata", json_reply("ServerMetadata"))}
OPERATIONS: dict[str, dict[str, Operation]] = {
    "health_live": {"get": Operation("200 (empty) when the server is live", NO_BODY)},
    "health_ready": {"get": Operation("200 (empty) when the server is ready", NO_BODY)},
    "model_ready": {"get": Operation("200 (empty) when the model is ready", NO_BODY)},
    "server_metadata": SERVER_METADATA,
    "server_metadata_slash": SERVER_METADATA,
    "model_metadata": {"get": Operation("KServe v2 model metadata",
                                        json_reply("ModelMetadata"))},
    "model_config": {"get": Operation("Triton's model configuration",
                                      json_reply("ModelConfig"))},
    "repository_index": {"post": Operation(
        "Triton's model repository index (the served model; an empty body or `ready: false` "
        "lists it while it loads too)", json_reply("RepositoryIndex"),
        ref("RepositoryIndexRequest"), body_required=False)},
    "server_statistics": {"get": Operation("Triton's statistics of every model",
                                           json_reply("ModelStatistics"))},
    "model_statistics": {"get": Operation("Triton's statistics of the model",
                                          json_reply("ModelStatistics"))},
    "infer": {"post": Operation(
        "KServe v2 inference: token ids (`input0`) or text (`text_input`) in. The binary "
        "tensor data extension (`Inference-Header-Content-Length`, `binary_data_size`) is "
        "accepted too; binary outputs come as application/octet-stream",
        {**json_reply("InferResponse"),
         "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        ref("InferRequest"))},
    "generate": {"post": Operation("Triton's generate extension",
                                   json_reply("GenerateResponse"), ref("GenerateRequest"))},
    "generate_stream": {"post": Operation(f"Triton's generate extension: {GENERATION_STREAM}",
                                          SSE, ref("GenerateRequest"))},
    "stop_infer": {"post": Operation("Ends the running requests with this id early",
                                     json_reply("StopInferResponse"),
                                     ref("StopInferRequest"))},
    "slot_count": {"get": Operation("Free and total slots", json_reply("SlotCount"))},
    "tgi_compat": {
        "get": HEALTH,
        "post": Operation("TGI's compat route: a one-element array, or (`stream: true`) "
                          f"{GENERATION_STREAM}", {**json_reply("TgiCompatResponse"), **SSE},
                          ref("TgiRequest"))},
    "tgi_vllm_generate": {"post": Operation(
        "TGI's generate (a body with `inputs`) or vLLM's demo server's (a body with `prompt`; "
        "streamed, JSON objects each followed by a newline)",
        {"application/json": {"schema": {"oneOf": [ref("TgiResponse"),
                                                   ref("VllmResponse")]}},
         "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        {"oneOf": [ref("TgiRequest"), ref("VllmRequest")]})},
    "tgi_generate_stream": {"post": Operation(f"TGI's stream: {GENERATION_STREAM}", SSE,
                                              ref("TgiRequest"))},
    "tgi_info": {"get": Operation("TGI's model information", json_reply("TgiInfo"))},
    "tgi_vllm_tokenize": {"post": Operation(
        "The server's tokenizer: TGI's (a body with `inputs`: each token with its characters) "
        "or vLLM's (a body with `prompt` or `messages`)",
        {"application/json": {"schema": {"oneOf": [ref("TgiTokens"), ref("VllmTokens")]}}},
        {"oneOf": [ref("TgiRequest"), ref("VllmTokenizeRequest")]})},
    "tgi_chat_tokenize": {"post": Operation(
        "TGI's chat tokenizer: the messages as the chat template writes them, and each token "
        "with its characters there", json_reply("TgiChatTokens"), ref("ChatCompletionRequest"))},
    "vllm_detokenize": {"post": Operation("vLLM's detokenizer: token ids to text, special "
                                          "tokens included", json_reply("VllmText"),
                                          ref("VllmDetokenizeRequest"))},
    "health": {"get": HEALTH},
    "sagemaker_ping": {"get": HEALTH, "post": HEALTH},
    "sagemaker_invocations": {"post": Operation(
        "SageMaker's invocations: a body with `inputs` is served as TGI's compat route `/`, "
        "one with `messages` as OpenAI's chat completions, one with `prompt` as its "
        "completions (each streamed with `stream: true`)",
        {"application/json": {"schema": {"oneOf": [
            ref("TgiCompatResponse"), ref("ChatCompletion"), ref("TextCompletion")]}}, **SSE},
        {"oneOf": [ref("TgiRequest"), ref("ChatCompletionRequest"),
                   ref("CompletionRequest")]})},
    "vllm_version": {"get": Operation("vLLM's version route: the model server's version",
                                      json_reply("Version"))},
    "openai_models": {"get": Operation("OpenAI's model list", json_reply("ModelList"))},
    "openai_model": {"get": Operation("One OpenAI model", json_reply("Model"))},
    "openai_chat": {"post": Operation(
        f"OpenAI's chat completions (streamed: {GENERATION_STREAM}, then `data: [DONE]`)",
        {**json_reply("ChatCompletion"), **SSE}, ref("ChatCompletionRequest"))},
    "openai_completions": {"post": Operation(
        f"OpenAI's completions (streamed: {GENERATION_STREAM}, then `data: [DONE]`)",
        {**json_reply("TextCompletion"), **SSE}, ref("CompletionRequest"))},
    "openai_responses": {"post": Operation(
        "OpenAI's Responses API, function tools included, without stored responses (streamed: its "
        "Server-Sent Events, `event:` and `data:` with `type` and `sequence_number`, from "
        "response.created to response.completed)",
        {**json_reply("Response"), **SSE}, ref("ResponsesRequest"))},
    "openai_stored_response": {
        "get": Operation("OpenAI's retrieve of a stored response: none is stored (404)", None),
        "delete": Operation("OpenAI's delete of a stored response: none is stored (404)", None)},
    "openai_cancel_response": {"post": Operation(
        "OpenAI's cancel of a background response: none is stored (404)", None)},
    "mindie_infer": {"post": Operation(f"MindIE's text interface (streamed: {GENERATION_STREAM})",
                                       {**json_reply("MindIEResponse"), **SSE},
                                       ref("MindIEInferRequest"))},
    "mindie_infer_token": {"post": Operation(
        f"MindIE's token interface (streamed: {GENERATION_STREAM})",
        {**json_reply("MindIETokenResponse"), **SSE}, ref("MindIEInferTokenRequest"))},
    "mindie_tokenizer": {"post": Operation("The server's tokenizer",
                                           json_reply("TokenizerResponse"),
                                           ref("TokenizerRequest"))},
    "health_timed": {"get": Operation(
        "MindIE's deep probe: one token generated within N seconds (default 10)",
        json_reply("HealthTimed"))},
    "stop_service": {"get": Operation(
        "Graceful stop: answers (empty) once the requests in flight are answered, then exits; "
        f"with `?mode=Force`, answers at once and cuts them off after {FORCED_STOP_S:g} s",
        NO_BODY)},
    "mindie_config": {"get": Operation("MindIE's static configuration",
                                       json_reply("MindIEConfig"))},
    "mindie_status": {"get": Operation("MindIE's status", json_reply("MindIEStatus"))},
    "mindie_role": {"post": Operation("MindIE's prefill/decode role assignment",
                                      json_reply("MindIERoleResult"), ref("MindIERole"))},
    "mindie_dresult": {"get": Operation(
        "MindIE's decode results for the coordinator (NUL-terminated records)",
        {"text/event-stream": {"schema": STRING}})},
    "metrics_json": {"get": Operation("MindIE's JSON metrics", json_reply("MetricsJson"))},
    "metrics": {"get": Operation("Prometheus' text format",
                                 {"text/plain": {"schema": STRING}})},
    "openapi": {"get": Operation("This document", json_reply("OpenAPIDocument"))},
}
# Path parameters whose accepted values are narrower than their route pattern.
PATH_PARAMETERS: dict[str, JSON] = {"seconds": integer(1, MAX_HEALTH_TIMEOUT_S),
                                    "role": {"type": "string", "enum": list(ROLES)}}


# --- paths from route patterns ----------------------------------------------------------------

class Route(NamedTuple):
    plane: str
    pattern: str
    handler: type[tornado.web.RequestHandler]
    name: str


_OPTIONAL = re.compile(r"\(\?:((?:[^()]|\([^()]*\))*)\)\?")
_GROUP = re.compile(r"\(\?P<(\w+)>([^()]*)\)")
_REGEX_SYNTAX = re.compile(r"[()\[\]{}*+?|^$]")


def path_templates(pattern: str) -> list[tuple[str, dict[str, str]]]:
    """A route pattern's OpenAPI paths (an optional group gives a path without it and one
    with it), each with its path parameters' regular expressions."""
    optional = _OPTIONAL.search(pattern)
    if optional is not None:
        head, tail = pattern[:optional.start()], pattern[optional.end():]
        return [*path_templates(head + tail), *path_templates(head + optional[1] + tail)]
    parameters = dict(_GROUP.findall(pattern))
    literal = _GROUP.sub("", pattern)
    if _REGEX_SYNTAX.search(re.sub(r"\\.", "", literal)):
        raise ValueError(f"the route pattern {pattern!r} has no OpenAPI path")
    pieces = _GROUP.split(pattern)  # literal, (name, regex, literal)*
    template = _unescape(pieces[0]) + "".join(
        "{" + name + "}" + _unescape(text) for name, text in zip(pieces[1::3], pieces[3::3]))
    return [(template, parameters)]


def _unescape(literal: str) -> str:
    return re.sub(r"\\(.)", r"\1", literal)


# --- the document -----------------------------------------------------------------------------

PLANES = {
    "business": "Inference and model routes of every protocol, and Triton's health routes",
    "management": "Probes, slot count, graceful stop, configuration, status, JSON metrics",
    "metrics": "Prometheus' /metrics",
}


def document(routes: Iterable[Route], limits: Limits) -> JSON:
    """The OpenAPI document of `routes`, their parameters within the server's `limits`; a
    route served on several planes (one server, one port) is listed once, tagged with each."""
    paths: dict[str, JSON] = {}
    planes: dict[tuple[str, str], list[str]] = {}
    answered = {shape.name: set(shape.statuses) for shape in SHAPES}
    for route in routes:
        shape = error_shape(route.handler)
        # A route may map the server's statuses its own way (MindIE's stopInfer: 422).
        route_statuses = sorted({*shape.statuses,
                                 *getattr(route.handler, "status_table", {}).values()})
        answered[shape.name].update(route_statuses)
        for template, patterns in path_templates(route.pattern):
            for method, operation in OPERATIONS[route.name].items():
                served_on = planes.setdefault((template, method), [])
                served_on.append(route.plane)
                paths.setdefault(template, {})[method] = _operation(
                    route.name, method, operation, shape, route_statuses, patterns, served_on)
    used = {tag for item in paths.values() for operation in item.values()
            for tag in operation["tags"]}
    # A protocol with several error shapes (TGI's, with /tokenize's) is described by its first.
    tags: dict[str, str] = {}
    for name, description in (*PLANES.items(),
                              *((shape.protocol, shape.description) for shape in SHAPES)):
        tags.setdefault(name, description)
    return copy.deepcopy({
        "openapi": "3.0.3",
        "info": {"title": "Switchboard gateway",
                 "version": importlib.metadata.version("switchboard"),
                 "description": "REST routes of Triton / KServe v2, TGI, vLLM, OpenAI and "
                                "MindIE, transcoded into gRPC calls to the model server. Each "
                                "operation is tagged with the plane(s) serving it and with its "
                                "protocol, whose error shape its errors have."},
        "tags": [{"name": name, "description": description}
                 for name, description in tags.items() if name in used],
        "paths": paths,
        "components": {
            "schemas": {**requests(limits), **REPLIES,
                        **{shape.name: shape.schema for shape in SHAPES}},
            "responses": {f"{shape.name}{status}": {
                "description": f"{HTTPStatus(status).phrase}, in the protocol's error shape",
                "content": {"application/json": {"schema": shape.at(status)}}}
                for shape in SHAPES for status in sorted(answered[shape.name])},
        },
    })


def _operation(route: str, method: str, operation: Operation, shape: ErrorShape,
               statuses: Iterable[int], patterns: Mapping[str, str], planes: list[str]) -> JSON:
    responses: JSON = {}
    if operation.ok is not None:
        responses["200"] = {"description": operation.summary}
        if operation.ok:
            responses["200"]["content"] = dict(operation.ok)
    responses.update({str(status): {"$ref": f"#/components/responses/{shape.name}{status}"}
                      for status in statuses})
    result: JSON = {"operationId": "_".join([route, *patterns, method]),
                    "summary": operation.summary, "tags": [*planes, shape.protocol],
                    "responses": responses}
    if patterns:
        result["parameters"] = [{"name": name, "in": "path", "required": True,
                                 "schema": PATH_PARAMETERS.get(
                                     name, {"type": "string", "pattern": f"^(?:{regex})$"})}
                                for name, regex in patterns.items()]
    if operation.body is not None:
        result["requestBody"] = {"required": operation.body_required,
                                 "content": {"application/json": {"schema": operation.body}}}
    return result


def served_routes(application: tornado.web.Application) -> list[Route]:
    """The routes `application` serves, in order (make_app names each rule `plane:route`)."""
    routes = []
    for rule in application.wildcard_router.rules:
        assert isinstance(rule.matcher, tornado.routing.PathMatches) and rule.name
        plane, _, name = rule.name.partition(":")
        routes.append(Route(plane, rule.matcher.regex.pattern.removesuffix("$"), rule.target,
                            name))
    return routes


class OpenAPIHandler(Handler):
    """GET /openapi.json: the description of the routes this server serves."""

    async def get(self) -> None:
        self.write_json(document(served_routes(self.application), await self.parameter_limits()))
