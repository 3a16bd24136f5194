"""Pure translations between KServe v2 protobuf messages and engine types.

Wire facts (Triton's grpc_service.proto, tritonclient): tensors may arrive as
`raw_input_contents` (tritonclient's default) or typed `contents`; replies use
`raw_output_contents`, the only form tritonclient's `as_numpy` reads. BYTES elements are
4-byte little-endian length-prefixed. `priority` (uint64, 0 = default) and `timeout`
(int64 microseconds, 0 = none) are Triton's reserved request parameters.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from google.protobuf import json_format

from switchboard.engine.config import EngineLimits
from switchboard.engine.errors import InvalidRequest
from switchboard.engine.kv_transfer import KV_TRANSFER_FIELD
from switchboard.engine.params import GenerationRequest
from switchboard.engine.request import FinishReason, RequestOutput, RequestTimings
from switchboard.engine.validation import build_request
from switchboard.proto import generation_fields
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import tensor_bytes
from switchboard.proto.tensor_bytes import serialize_bytes
from switchboard.server import triton_vllm
from switchboard.server.json_text import decode_json
from switchboard.server.triton_vllm import VllmOptions

FINAL_RESPONSE_PARAMETER = "triton_final_response"
# The served model's one version.
MODEL_VERSION = "1"
# Reserved by Triton's parameters extension; they steer Triton's own scheduler, not generation.
TRITON_RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "headers",
                                        "binary_data_output"})
MICROSECONDS = 1_000_000
# Parameters whose values InferParameter has no type for, sent as JSON in a string_param:
# several values as an array, OpenAI's logit_bias and a guided_json schema as an object. Each
# is decoded where the string opens as its JSON would.
JSON_PARAMETERS = {"stop": "array", "stop_token_ids": "array", "allowed_token_ids": "array",
                   "logit_bias": "object", "guided_json": "object", "guided_choice": "array"}
JSON_OPENINGS = {"array": "[", "object": "{"}
# MindIE's Triton token interface: request ids of at most 256 of these characters, and at most
# 1024 * 1024 prompt token ids (besides maxInputTokenLen and maxSeqLen).
CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,256}")
MAX_TOKEN_INPUTS = 1024 * 1024


class InputKind(enum.Enum):
    """The two interfaces of MindIE's Triton compatibility: token ids or text."""

    TOKENS = ("input0", "UINT32", "output0")
    TEXT = ("text_input", "BYTES", "text_output")

    def __init__(self, input_name: str, datatype: str, output_name: str) -> None:
        self.input_name = input_name
        self.datatype = datatype
        self.output_name = output_name


INPUT_KINDS = {kind.input_name: kind for kind in InputKind}


@dataclass(frozen=True, slots=True)
class InferCall:
    """A ModelInferRequest, decoded: which interface, its prompt and its parameters; `vllm`:
    the options of Triton's vLLM backend interface, when the request is one of it."""

    kind: InputKind
    prompt: tuple[int, ...] | str
    parameters: Mapping[str, object]
    client_id: str
    vllm: VllmOptions | None = None
    # The outputs the request names; none: every output it produces (Triton's rule).
    requested_outputs: frozenset[str] = frozenset()
    # vLLM's kv_transfer_params, sent as a JSON string parameter of that name.
    kv_transfer: sb.KVTransferParams | None = None

    def wants(self, output: str) -> bool:
        return not self.requested_outputs or output in self.requested_outputs

    @property
    def describes_tokens(self) -> bool:
        """MindIE's `details` (KServe's generate extension's): each streamed response also
        describes its token: its text, log-probability and whether it is special."""
        return self.vllm is None and self.parameters.get("details") is True

    @property
    def streams(self) -> bool:
        """Whether ModelStreamInfer answers with a response per step (else one, at the end)."""
        return self.vllm is None or self.vllm.stream


@dataclass(frozen=True, slots=True)
class InferResult:
    """A whole generation, aggregated from its events."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    num_prompt_tokens: int
    seed: int
    kv_transfer_id: str = ""


def decode_infer_request(request: pb.ModelInferRequest) -> InferCall:
    """MindIE's Triton interfaces (one input: input0 or text_input), or Triton's vLLM
    backend's (text_input and its control tensors, see `triton_vllm`)."""
    names = [tensor.name for tensor in request.inputs]
    for name in names:
        if name not in INPUT_KINDS and name not in triton_vllm.INPUTS:
            raise InvalidRequest("inputs", f"unknown input {name!r}; expected "
                                 f"{' or '.join(INPUT_KINDS)}, and with text_input Triton's vLLM "
                                 f"backend's {', '.join(triton_vllm.CONTROL_INPUTS)}")
    prompts = [index for index, name in enumerate(names) if name in INPUT_KINDS]
    if len(prompts) != 1:
        raise InvalidRequest("inputs", f"expected exactly one input of {' or '.join(INPUT_KINDS)}"
                             f" (beside the vLLM backend's control tensors); got {len(prompts)}")
    raws = _raw_inputs(request)
    tensor, raw = request.inputs[prompts[0]], raws[prompts[0]]
    kind = INPUT_KINDS[tensor.name]
    if tensor.datatype != kind.datatype:
        raise InvalidRequest(tensor.name, f"datatype must be {kind.datatype}; got {tensor.datatype!r}")
    check_client_id(request.id)
    controls = {control.name: _control_value(control, control_raw, kind)
                for index, (control, control_raw) in enumerate(zip(request.inputs, raws))
                if index != prompts[0]}
    if len(controls) != len(request.inputs) - 1:
        raise InvalidRequest("inputs", "names an input twice")
    vllm = triton_vllm.read_options(controls) if controls else None
    _check_outputs(request, kind, vllm)
    if kind is InputKind.TOKENS:
        prompt: tuple[int, ...] | str = _token_ids(tensor, raw)
    else:
        prompt = _text(tensor, raw)
    return InferCall(kind=kind, prompt=prompt, client_id=request.id, vllm=vllm,
                     requested_outputs=frozenset(output.name for output in request.outputs),
                     kv_transfer=_kv_transfer(request.parameters),
                     parameters=parameters_from_pb(request.parameters) if vllm is None
                     else _vllm_parameters(request.parameters, controls))


def _control_value(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None,
                   kind: InputKind) -> bool | str:
    """A control tensor's one value."""
    name = tensor.name
    if name in triton_vllm.UNSUPPORTED_INPUTS:
        raise InvalidRequest(name, triton_vllm.UNSUPPORTED_INPUTS[name])
    if kind is not InputKind.TEXT:
        raise InvalidRequest(name, "is a vLLM backend input, which goes with text_input")
    if name == triton_vllm.SAMPLING_INPUT:
        if tensor.datatype != "BYTES":
            raise InvalidRequest(name, f"datatype must be BYTES; got {tensor.datatype!r}")
        return _text(tensor, raw)
    if tensor.datatype != "BOOL":
        raise InvalidRequest(name, f"datatype must be BOOL; got {tensor.datatype!r}")
    return _bool(tensor, raw)


def _check_outputs(request: pb.ModelInferRequest, kind: InputKind,
                   vllm: VllmOptions | None) -> None:
    known = {kind.output_name, *(vllm.outputs if vllm is not None else ())}
    names = [output.name for output in request.outputs]
    if len(names) > len(known) or len(set(names)) != len(names):
        raise InvalidRequest("outputs", f"expected at most {len(known)} outputs, each once; "
                             f"got {names}")
    for name in names:
        if name not in known:
            raise InvalidRequest("outputs", f"unknown output {name!r} for input "
                                 f"{kind.input_name!r}; expected one of {sorted(known)}")


def _vllm_parameters(parameters: Mapping[str, pb.InferParameter],
                     controls: Mapping[str, bool | str]) -> dict[str, object]:
    """The sampling_parameters tensor's, else the request's parameters read by vLLM's names:
    as the backend reads them, the tensor wins and the request's parameters are then ignored
    (its sample client sends both), but for Triton's priority and timeout."""
    values = parameter_values(parameters)
    sampling = controls.get(triton_vllm.SAMPLING_INPUT)
    if sampling is not None:
        scheduling = {name: values[name] for name in ("priority", "timeout") if name in values}
        values = {**triton_vllm.sampling_object(sampling), **scheduling}
    return _carried(triton_vllm.engine_parameters(values))


def check_client_id(client_id: str) -> None:
    if client_id and not CLIENT_ID.fullmatch(client_id):
        raise InvalidRequest("id", "must be at most 256 characters of A-Z, a-z, 0-9, '_' and '-'")


async def build_engine_request(call: InferCall, request_id: str,
                               encode: Callable[[str], Awaitable[list[int]]],
                               limits: EngineLimits) -> GenerationRequest:
    """Validate through the engine's one validation, under MindIE's rules (this is its
    Triton interface) or vLLM's (its backend's interface, whose errors name vLLM's fields);
    prompt errors name the input tensor."""
    try:
        token_ids = await encode(call.prompt) if isinstance(call.prompt, str) else call.prompt
        if call.vllm is None:
            parameters = typed(call.parameters, mindie=True)
            if call.describes_tokens:
                # The log-probabilities of the tokens a request's details describe.
                parameters["logprobs"] = True
            return build_request(request_id, token_ids, parameters, limits)
        return build_request(request_id, token_ids, typed(call.parameters), limits)
    except InvalidRequest as error:
        field = _field_name(call, error.field)
        if field == error.field:
            raise
        raise type(error)(field, error.reason) from None


def typed(values: Mapping[str, object], mindie: bool = False) -> dict[str, object]:
    """A KServe request's parameters as switchboard.v1's typed fields carry them, so that
    their types are checked as every protocol's are (generation_fields); `mindie`: under
    MindIE's rules, as its interfaces take them."""
    try:
        return generation_fields.typed_values(
            generation_fields.under_mindie_rules(values) if mindie else values)
    except generation_fields.FieldError as error:
        raise InvalidRequest(error.field, error.reason) from None


def _field_name(call: InferCall, field: str) -> str:
    """A validation error's field as the request's interface names it."""
    if field == "prompt":
        return call.kind.input_name
    if call.vllm is not None:
        return triton_vllm.FIELD_NAMES.get(field, field)
    return field


def _kv_transfer(parameters: Mapping[str, pb.InferParameter]) -> sb.KVTransferParams | None:
    parameter = parameters.get(KV_TRANSFER_FIELD)
    if parameter is None:
        return None
    if parameter.WhichOneof("parameter_choice") != "string_param":
        raise InvalidRequest(KV_TRANSFER_FIELD, "must be a string_param holding vLLM's "
                             "kv_transfer_params, a JSON object")
    params = sb.KVTransferParams()
    try:
        json_format.Parse(parameter.string_param, params, ignore_unknown_fields=True)
    except json_format.ParseError as error:
        raise InvalidRequest(KV_TRANSFER_FIELD, str(error)) from None
    return params


def kv_transfer_parameter(params: sb.KVTransferParams) -> pb.InferParameter:
    """A prefill's kv_transfer_params, as the JSON string parameter a request sends them in."""
    return pb.InferParameter(string_param=json_format.MessageToJson(
        params, preserving_proto_field_name=True, always_print_fields_with_no_presence=True,
        indent=None))


def parameters_from_pb(parameters: Mapping[str, pb.InferParameter]) -> dict[str, object]:
    """A KServe v2 request's parameters: those of `parameter_values` that its one-sequence,
    tensor-only responses can answer."""
    return _carried(parameter_values(parameters))


def _carried(values: dict[str, object]) -> dict[str, object]:
    """values, refused if they ask for what KServe v2 responses cannot carry."""
    for name in generation_fields.UNCARRIED & values.keys():
        raise InvalidRequest(name, "is not available over KServe v2 gRPC: its responses have no "
                             "place for log-probabilities (switchboard.v1.Generation has)")
    for name in generation_fields.SINGLE_SEQUENCE & values.keys():
        if values[name] != 1:
            raise InvalidRequest(name, "only 1 is available over KServe v2 gRPC: its responses "
                                 "carry one sequence (switchboard.v1.Generation's carry n)")
    return values


def parameter_values(parameters: Mapping[str, pb.InferParameter]) -> dict[str, object]:
    """Request parameters under MindIE's names, with Triton's priority/timeout converted."""
    values: dict[str, object] = {}
    for name, parameter in parameters.items():
        if name in TRITON_RESERVED_PARAMETERS or name.startswith("triton_") \
                or name == KV_TRANSFER_FIELD:
            continue
        choice = parameter.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidRequest(name, "has no value: set bool_param, int64_param, uint64_param, "
                                 "double_param or string_param, or leave the parameter out")
        values[name] = getattr(parameter, choice)
    for name, kind in JSON_PARAMETERS.items():
        if isinstance(values.get(name), str) and values[name].startswith(JSON_OPENINGS[kind]):
            values[name] = _json_value(name, values[name], kind)
    if values.get("priority") == 0:
        del values["priority"]
    timeout = values.pop("timeout", None)
    if isinstance(timeout, int) and not isinstance(timeout, bool) and timeout != 0:
        values["timeout"] = timeout / MICROSECONDS
    elif timeout not in (None, 0):
        raise InvalidRequest("timeout", f"must be an integer number of microseconds; got {timeout!r}")
    return values


def _json_value(name: str, text: str, kind: str) -> object:
    """A JSON_PARAMETERS value decoded; what it holds is checked by the engine's validation."""
    return decode_json(name, text, f"a JSON {kind} (it starts with '{JSON_OPENINGS[kind]}')")


def aggregate(outputs: Iterable[RequestOutput]) -> InferResult:
    token_ids: list[int] = []
    text: list[str] = []
    last: RequestOutput | None = None
    for last in outputs:
        token_ids.extend(last.new_token_ids)
        text.append(last.text)
    if last is None or last.finish_reason is None:
        raise ValueError("a generation's events must end with a finished one")
    return InferResult(token_ids=tuple(token_ids), text="".join(text),
                       finish_reason=last.finish_reason, num_prompt_tokens=last.num_prompt_tokens,
                       seed=last.seed, kv_transfer_id=last.kv_transfer_id)


def infer_response(call: InferCall, model_name: str, result: InferResult) -> pb.ModelInferResponse:
    prepends = call.vllm is not None and call.vllm.prepend_prompt
    response = _response(call, model_name, result.token_ids,
                         f"{call.prompt}{result.text}" if prepends else result.text)
    _set_finish_parameters(response, result.finish_reason, len(result.token_ids), result.seed)
    _add_vllm_outputs(response, call, result.finish_reason, result.num_prompt_tokens,
                      len(result.token_ids))
    return response


def final_stream_response(call: InferCall, model_name: str,
                          result: InferResult) -> pb.ModelStreamInferResponse:
    """The one response of an unstreamed request on ModelStreamInfer (the vLLM backend's
    `stream` false)."""
    response = infer_response(call, model_name, result)
    response.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=response)


def stream_response(call: InferCall, model_name: str, output: RequestOutput,
                    special_token_ids: frozenset[int] = frozenset()
                    ) -> pb.ModelStreamInferResponse:
    """One decoupled response per event; the last is flagged with triton_final_response.
    Each carries its token's id and timings (MindIE's perf_stat material) as parameters and,
    when the request asks for details, the token's text (as the sequence decodes, not held
    back for stop strings), log-probability and whether it is one of `special_token_ids`."""
    response = _response(call, model_name, output.new_token_ids, output.text)
    response.parameters[FINAL_RESPONSE_PARAMETER].bool_param = output.finish_reason is not None
    if len(output.new_token_ids) == 1:
        response.parameters["token_id"].int64_param = output.new_token_ids[0]
        if call.describes_tokens:
            response.parameters["token_text"].string_param = output.decoded_text
            response.parameters["token_special"].bool_param = \
                output.new_token_ids[0] in special_token_ids
            if output.logprobs:
                response.parameters["token_logprob"].double_param = output.logprobs[0].logprob
    if output.timings is not None:
        _set_timing_parameters(response, output.timings)
    if output.finish_reason is not None:
        _set_finish_parameters(response, output.finish_reason, output.num_generated_tokens,
                               output.seed)
    _add_vllm_outputs(response, call, output.finish_reason, output.num_prompt_tokens,
                      len(output.new_token_ids))
    return pb.ModelStreamInferResponse(infer_response=response)


def stream_error(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    """An in-band error, which ends its request: as Triton does, it names the request (id,
    model and version) so that a client with several requests on the stream knows which
    failed, and is that request's final response."""
    response = pb.ModelInferResponse(id=request.id, model_name=request.model_name,
                                     model_version=request.model_version or MODEL_VERSION)
    response.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
    return pb.ModelStreamInferResponse(error_message=message, infer_response=response)


def deserialize_bytes(data: bytes, field: str) -> list[bytes]:
    try:
        return tensor_bytes.deserialize_bytes(data)
    except ValueError as error:
        raise InvalidRequest(field, str(error)) from None


def _response(call: InferCall, model_name: str, token_ids: Iterable[int],
              text: str) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=model_name, model_version=MODEL_VERSION,
                                     id=call.client_id)
    if not call.wants(call.kind.output_name):
        return response
    output = response.outputs.add(name=call.kind.output_name, datatype=call.kind.datatype)
    if call.kind is InputKind.TOKENS:
        ids = np.asarray(list(token_ids), dtype="<u4")
        output.shape.extend([1, ids.size])
        response.raw_output_contents.append(ids.tobytes())
    else:
        output.shape.append(1)
        response.raw_output_contents.append(serialize_bytes([text.encode()]))
    return response


def _add_vllm_outputs(response: pb.ModelInferResponse, call: InferCall,
                      finish_reason: FinishReason | None, num_input_tokens: int,
                      num_output_tokens: int) -> None:
    """The vLLM backend's extra outputs the request asked for and, naming outputs, names
    (num_output_tokens: this response's)."""
    if call.vllm is None:
        return
    values = {"finish_reason": serialize_bytes([triton_vllm.finish_reason_text(finish_reason)
                                                .encode()]),
              "num_input_tokens": np.asarray([num_input_tokens], dtype="<u4").tobytes(),
              "num_output_tokens": np.asarray([num_output_tokens], dtype="<u4").tobytes()}
    for name, (_, datatype) in triton_vllm.EXTRA_OUTPUTS.items():
        if name in call.vllm.outputs and call.wants(name):
            response.outputs.add(name=name, datatype=datatype, shape=[1])
            response.raw_output_contents.append(values[name])


def _set_finish_parameters(response: pb.ModelInferResponse, reason: FinishReason,
                           num_generated_tokens: int, seed: int) -> None:
    response.parameters["finish_reason"].string_param = reason.value
    response.parameters["generated_tokens"].int64_param = num_generated_tokens
    response.parameters["seed"].uint64_param = seed


def _set_timing_parameters(response: pb.ModelInferResponse, timings: RequestTimings) -> None:
    """MindIE's perf_stat material: the step's batch size, the request's queue wait and this
    token's latency (since the previous token; since arrival for the first)."""
    response.parameters["batch_size"].int64_param = timings.batch_size
    response.parameters["queue_wait_us"].int64_param = round(timings.queue_wait * MICROSECONDS)
    response.parameters["token_latency_us"].int64_param = round(timings.token_latency * MICROSECONDS)


def _raw_inputs(request: pb.ModelInferRequest) -> list[bytes | None]:
    """Each input's raw data, None where it comes typed (in `contents`)."""
    if not request.raw_input_contents:
        return [None] * len(request.inputs)
    if len(request.raw_input_contents) != len(request.inputs):
        raise InvalidRequest("raw_input_contents", f"has {len(request.raw_input_contents)} "
                             f"entries for {len(request.inputs)} inputs")
    for tensor in request.inputs:
        if tensor.HasField("contents"):
            raise InvalidRequest(tensor.name, "has both contents and raw_input_contents: "
                                 "send the tensor's data in one of them")
    return list(request.raw_input_contents)


def _check_shape(tensor: pb.ModelInferRequest.InferInputTensor, allowed: str) -> int:
    shape = list(tensor.shape)
    valid = (len(shape) == 1 or (len(shape) == 2 and shape[0] == 1)) and shape[-1] >= 0
    if not valid:
        raise InvalidRequest(tensor.name, f"shape must be {allowed}; got {shape}")
    return shape[-1]


def _token_ids(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> tuple[int, ...]:
    count = _check_shape(tensor, "[n] or [1, n]")
    if count > MAX_TOKEN_INPUTS:
        raise InvalidRequest(tensor.name, f"has {count} token ids; at most {MAX_TOKEN_INPUTS} are "
                             "accepted")
    if raw is not None:
        if len(raw) != 4 * count:
            raise InvalidRequest(tensor.name, f"shape {list(tensor.shape)} needs {4 * count} bytes "
                                 f"of UINT32 data; got {len(raw)}")
        ids = np.frombuffer(raw, dtype="<u4").tolist()
    else:
        ids = list(tensor.contents.uint_contents)
        if len(ids) != count:
            raise InvalidRequest(tensor.name, f"shape {list(tensor.shape)} holds {count} elements; "
                                 f"got {len(ids)} in uint_contents")
    return tuple(ids)


def _bool(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> bool:
    count = _check_shape(tensor, "[1] or [1, 1]")
    elements = list(raw) if raw is not None else list(tensor.contents.bool_contents)
    if count != 1 or len(elements) != 1:
        raise InvalidRequest(tensor.name, f"expected one BOOL element (shape [1]); got shape "
                             f"{list(tensor.shape)} with {len(elements)} elements")
    return bool(elements[0])


def _text(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> str:
    count = _check_shape(tensor, "[1] or [1, 1]")
    elements = (deserialize_bytes(raw, tensor.name) if raw is not None
                else list(tensor.contents.bytes_contents))
    if count != 1 or len(elements) != 1:
        raise InvalidRequest(tensor.name, f"expected one string element (shape [1]); got shape "
                             f"{list(tensor.shape)} with {len(elements)} elements")
    try:
        return elements[0].decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidRequest(tensor.name, f"is not valid UTF-8 ({error.reason} at byte "
                             f"{error.start})") from None
