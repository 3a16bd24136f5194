"""Triton's generate extension as MindIE documents it, and with Triton's vLLM backend
interface: POST /v2/models/{M}/generate and /generate_stream ⇄ one text_input request on KServe
v2 ModelStreamInfer.

Request `{"id", "text_input", "parameters": {...}}`; other top-level properties count as in
`parameters`. As Triton does with a model's inputs, a property named as an input of the vLLM
backend interface (`stream`, `exclude_input_in_output`, `sampling_parameters`, `return_*`: see
proto/vllm_backend_tensors.py) is sent as that input tensor, the others as request parameters.

Without such inputs the request speaks MindIE's text interface, and KServe's generate
extension beside it (`max_tokens`, temperature and top_p from 0: see KSERVE_NAMES). Response
`{"id", "model_name", "model_version", "text_output", "details": {"finish_reason",
"generated_tokens", "first_token_cost", "decode_cost", "perf_stat"?, "logprobs"}}`; the
stream sends one event per token with the running details (KServe's `token` among them),
`prefill_time` (ms) on the first and `decode_time` (ms) on the others, `finish_reason` on the
last.

With them it speaks the vLLM backend's (its parameters by vLLM's names), and each response is
Triton's: `{"id"?, "model_name", "model_version", "text_output"}` with each further output
(`finish_reason`, `num_input_tokens`, `num_output_tokens`) under its name; /generate needs
`stream` false, as Triton answers it once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from switchboard.gateway.errors import bad_request
from switchboard.gateway.protocols.kserve import (encode_tensor, optional_string, parameters_to_json,
                                     require_object, tensor_json)
from switchboard.gateway.protocols.parameters import set_parameters
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto.tensor_bytes import deserialize_bytes
from switchboard.proto.vllm_backend_tensors import CONTROL_INPUTS

# Rendering options: they shape the reply here and are also sent on (the server accepts them).
RENDERING_OPTIONS = ("details", "perf_stat")
# KServe's generate extension (the Open Inference Protocol's generate_rest.yaml), beside
# MindIE's names: its max_tokens is max_new_tokens; its temperature and top_p reach 0, which
# is greedy (as Triton's vLLM backend and vLLM read a temperature of 0; a top_p of 0 keeps the
# most probable token alone).
KSERVE_NAMES = {"max_tokens": "max_new_tokens"}
GREEDY_AT_ZERO = ("temperature", "top_p")


@dataclass(frozen=True, slots=True)
class GenerateOptions:
    details: bool
    perf_stat: bool
    vllm: bool = False  # the vLLM backend interface: Triton's responses
    # The request's field names → the server's, where they differ (KServe's max_tokens).
    names: Mapping[str, str] = field(default_factory=dict)


def generate_request_to_pb(model: str, version: str, document: object, route_streams: bool
                           ) -> tuple[pb.ModelInferRequest, GenerateOptions]:
    """route_streams: the request came to /generate_stream."""
    document = require_object(document, "the body")
    text = document.get("text_input")
    if not isinstance(text, str):
        raise bad_request("text_input", "must be a string")
    fields = dict(require_object(document.get("parameters") or {}, "parameters"))
    for name, value in document.items():
        if name not in ("id", "text_input", "parameters"):
            fields.setdefault(name, value)
    named = {name: fields.pop(name) for name in CONTROL_INPUTS if name in fields}
    tensors = {name: value for name, value in named.items() if value is not None}  # null: absent
    options = {name: False if fields.get(name) is None else fields[name]
               for name in RENDERING_OPTIONS}
    for name, value in options.items():
        if not isinstance(value, bool):
            raise bad_request(name, "must be a boolean")
        if value and tensors:
            raise bad_request(name, f"is MindIE's; with the vLLM backend's inputs "
                              f"({', '.join(tensors)}) the reply is Triton's, without details")
    if tensors.get("stream") is True and not route_streams:
        raise bad_request("stream", "must be false on /generate, which answers once "
                          "(/generate_stream streams)")
    request = pb.ModelInferRequest(model_name=model, model_version=version,
                                   id=optional_string(document, "id"))
    _add_input(request, "text_input", "BYTES", text)
    for name, value in tensors.items():
        _add_input(request, name, CONTROL_INPUTS[name], value)
    names = {} if tensors else _read_kserve_parameters(fields)
    set_parameters(request.parameters, fields)
    return request, GenerateOptions(vllm=bool(tensors), names=names, **options)


def _read_kserve_parameters(fields: dict[str, object]) -> dict[str, str]:
    """KServe's generate-extension parameters in `fields` under MindIE's names and readings;
    returns the names the request used that the server's errors must name."""
    names = {name: ours for name, ours in KSERVE_NAMES.items() if fields.get(name) is not None}
    for name, ours in names.items():
        if ours in fields:
            raise bad_request(name, f"is KServe's name of MindIE's {ours}: send one of them")
        fields[ours] = fields.pop(name)
    for name in GREEDY_AT_ZERO:
        value = fields.get(name)
        # With do_sample true, a 0 stays for the server to refuse: sampling needs it above 0.
        if value == 0 and not isinstance(value, bool) and fields.get("do_sample") is not True:
            del fields[name]
            fields["do_sample"] = False
    return names


def _add_input(request: pb.ModelInferRequest, name: str, datatype: str, value: object) -> None:
    """A [1] tensor of a JSON value, or of an array of one."""
    values = value if isinstance(value, list) else [value]
    if len(values) != 1:
        raise bad_request(name, f"must be one value; got {len(values)}")
    request.inputs.add(name=name, datatype=datatype, shape=[1])
    request.raw_input_contents.append(encode_tensor(name, datatype, values))


def reply_stream(options: GenerateOptions) -> GenerateStream | TritonReplies:
    """What turns the request's responses into stream events and the final reply."""
    return TritonReplies() if options.vllm else GenerateStream(options)


class TritonReplies:
    """Triton's generate responses: one per response, each output under its name (a value
    of one element unwrapped); the reply is the one response /generate gets."""

    def __init__(self) -> None:
        self.last: dict[str, object] = {}

    def add(self, response: pb.ModelInferResponse) -> dict[str, object]:
        self.last = {"model_name": response.model_name, "model_version": response.model_version}
        if response.id:
            self.last["id"] = response.id
        for tensor, raw in zip(response.outputs, response.raw_output_contents):
            values = tensor_json(tensor.datatype, raw)
            self.last[tensor.name] = values[0] if len(values) == 1 else values
        return self.last

    def reply(self) -> dict[str, object]:
        return self.last


@dataclass(slots=True)
class GenerateStream:
    """Accumulates a generation's responses into stream events and the final reply."""

    options: GenerateOptions
    request_id: str = ""
    model_name: str = ""
    model_version: str = ""
    text: list[str] = field(default_factory=list)
    perf_stat: list[list[float]] = field(default_factory=list)
    first_token_ms: float | None = None
    decode_ms: float = 0.0
    generated_tokens: int = 0
    finish_reason: str | None = None
    # KServe's generate-extension tokens (id, text, logprob, special), with details.
    tokens: list[dict[str, object]] = field(default_factory=list)

    def add(self, response: pb.ModelInferResponse) -> dict[str, object]:
        """Take one response; return its stream event."""
        self.request_id, self.model_name = response.id, response.model_name
        self.model_version = response.model_version
        parameters = parameters_to_json(response.parameters)
        delta = "".join(element.decode() for element in
                        deserialize_bytes(response.raw_output_contents[0]))
        self.text.append(delta)
        latency_ms = parameters.get("token_latency_us", 0) / 1000
        prefill_ms = decode_ms = None
        if "token_id" in parameters:
            self.perf_stat.append([parameters["token_id"], round(latency_ms, 3)])
            if self.first_token_ms is None:
                self.first_token_ms = prefill_ms = round(latency_ms, 3)
            else:
                decode_ms = round(latency_ms, 3)
                self.decode_ms += latency_ms
        self.generated_tokens = parameters.get("generated_tokens", len(self.perf_stat))
        self.finish_reason = parameters.get("finish_reason")
        details = self._details()
        details["batch_size"] = parameters.get("batch_size")
        details["queue_wait_time"] = parameters.get("queue_wait_us")
        if self.options.details:
            # KServe's generate extension's stream details, beside MindIE's (whose
            # finish_reason comes on the last event only).
            details["token"] = None
            if "token_id" in parameters:
                details["token"] = {"id": parameters["token_id"],
                                    "text": parameters.get("token_text", ""),
                                    "logprob": parameters.get("token_logprob"),
                                    "special": parameters.get("token_special", False)}
                self.tokens.append(details["token"])
        return {**self._header(), "text_output": delta, "details": details,
                "prefill_time": prefill_ms, "decode_time": decode_ms}

    def reply(self) -> dict[str, object]:
        reply = {**self._header(), "text_output": "".join(self.text)}
        if self.options.details:
            # KServe's generate extension's details (finish_reason and the tokens'
            # log-probabilities), beside MindIE's.
            reply["details"] = {**self._details(), "logprobs": self.tokens}
        return reply

    def _header(self) -> dict[str, object]:
        return {"id": self.request_id, "model_name": self.model_name,
                "model_version": self.model_version}

    def _details(self) -> dict[str, object]:
        details: dict[str, object] = {
            "generated_tokens": self.generated_tokens,
            "first_token_cost": self.first_token_ms,
            "decode_cost": round(self.decode_ms, 3) if len(self.perf_stat) > 1 else None,
        }
        if self.finish_reason is not None:
            details["finish_reason"] = self.finish_reason
        if self.options.perf_stat:
            details["perf_stat"] = [list(pair) for pair in self.perf_stat]
        return details
