"""The gateway's pure translations: KServe v2 REST (JSON + binary tensor extension) and
MindIE's generate routes ⇄ KServe v2 gRPC messages, the parameter conversions, the gRPC status
→ HTTP table and SSE framing. No network; server replies are built by hand."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from switchboard.engine.errors import InvalidRequest, Overloaded
from switchboard.gateway.errors import (KSERVE_HTTP_STATUS, RequestError, client_message,
                                        field_violation, http_status)
from switchboard.gateway.protocols import kserve, triton
from switchboard.gateway.handler import UPSTREAM_GRACE_S, deadline_of
from switchboard.gateway.protocols.parameters import set_parameters, to_parameter
from switchboard.gateway.sse import sse_event
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import model_config_pb2 as mc
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto.tensor_bytes import deserialize_bytes, serialize_bytes
from switchboard.server.errors import refusal

UINT32_MAX = 2**32 - 1


def refused(call, *args) -> str:
    """`call(*args)` must refuse the request with a 400; returns the message."""
    with pytest.raises(RequestError) as info:
        call(*args)
    assert info.value.status == 400
    return info.value.message


def infer(document: object, binary: bytes = b"") -> tuple[pb.ModelInferRequest,
                                                          kserve.OutputOptions]:
    return kserve.infer_request_to_pb("smollm2", "", document, binary)


def uint32_input(data: object = None, **extra: object) -> dict[str, object]:
    tensor = {"name": "input0", "datatype": "UINT32", "shape": [1, 3], **extra}
    if data is not None:
        tensor["data"] = data
    return tensor


def server_response(*outputs: tuple[str, str, list[int], bytes]) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name="smollm2", model_version="1", id="a")
    for name, datatype, shape, raw in outputs:
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw)
    return response


# --- KServe /infer ---------------------------------------------------------------------------

def test_tritonclient_binary_body_round_trips() -> None:
    """What tritonclient.http sends by default: JSON header, then the ids as raw UINT32."""
    header = json.dumps({
        "id": "req-1",
        "inputs": [uint32_input(parameters={"binary_data_size": 12})],
        "outputs": [{"name": "output0", "parameters": {"binary_data": True}}],
        "parameters": {"binary_data_output": True, "max_new_tokens": 4},
    }).encode()
    body = header + np.array([[1, 2, 70000]], dtype="<u4").tobytes()

    document, binary = kserve.split_body(body, str(len(header)))
    request, options = infer(document, binary)

    assert (request.model_name, request.model_version, request.id) == ("smollm2", "", "req-1")
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("input0", "UINT32", [1, 3])
    assert np.frombuffer(request.raw_input_contents[0], "<u4").tolist() == [1, 2, 70000]
    assert [output.name for output in request.outputs] == ["output0"]
    # binary_data_output is the gateway's rendering option, not a model parameter.
    assert dict(request.parameters) == {"max_new_tokens": pb.InferParameter(int64_param=4)}

    response = server_response(("output0", "UINT32", [1, 2], np.array([7, 8], "<u4").tobytes()))
    response.parameters["finish_reason"].string_param = "length"
    response.parameters["seed"].uint64_param = 2**64 - 1
    reply = kserve.infer_response_to_http(response, options)

    assert reply.header_length is not None
    head = json.loads(reply.body[:reply.header_length])
    assert head == {"model_name": "smollm2", "model_version": "1", "id": "a",
                    "parameters": {"finish_reason": "length", "seed": 2**64 - 1},
                    "outputs": [{"name": "output0", "datatype": "UINT32", "shape": [1, 2],
                                 "parameters": {"binary_data_size": 8}}]}
    assert np.frombuffer(reply.body[reply.header_length:], "<u4").tolist() == [7, 8]


def test_binary_inputs_take_their_bytes_in_order_and_mix_with_json_data() -> None:
    first, second = np.array([1, 2], "<u4").tobytes(), np.array([3], "<u4").tobytes()
    request, _ = infer({"inputs": [
        {"name": "a", "datatype": "UINT32", "shape": [2], "parameters": {"binary_data_size": 8}},
        {"name": "b", "datatype": "UINT32", "shape": [2], "data": [9, 9]},
        {"name": "c", "datatype": "UINT32", "shape": [1], "parameters": {"binary_data_size": 4}},
    ]}, first + second)
    assert [np.frombuffer(raw, "<u4").tolist() for raw in request.raw_input_contents] == \
        [[1, 2], [9, 9], [3]]


@pytest.mark.parametrize("data", [[1, 2, UINT32_MAX], [[1, 2, UINT32_MAX]]], ids=["flat", "nested"])
def test_json_uint32_data_is_encoded_little_endian(data: list[object]) -> None:
    request, options = infer({"inputs": [uint32_input(data)]})
    assert request.raw_input_contents[0] == np.array([1, 2, UINT32_MAX], "<u4").tobytes()
    assert not options.is_binary("output0")


@pytest.mark.parametrize("data", [["hi", "thé"], [["hi", "thé"]]], ids=["flat", "nested"])
def test_json_bytes_data_is_length_prefixed(data: list[object]) -> None:
    request, _ = infer({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 2],
                                       "data": data}]})
    raw = request.raw_input_contents[0]
    assert raw == b"\x02\x00\x00\x00hi\x04\x00\x00\x00th\xc3\xa9"
    assert deserialize_bytes(raw) == [b"hi", "thé".encode()]


def test_json_response_renders_uint32_as_ints_and_bytes_as_strings() -> None:
    _, options = infer({"inputs": [uint32_input([1, 2, 3])]})
    response = server_response(
        ("output0", "UINT32", [1, 2], np.array([7, UINT32_MAX], "<u4").tobytes()),
        ("text_output", "BYTES", [1], serialize_bytes(["héllo".encode()])))
    reply = kserve.infer_response_to_http(response, options)
    assert reply.header_length is None
    outputs = json.loads(reply.body)["outputs"]
    assert outputs == [
        {"name": "output0", "datatype": "UINT32", "shape": [1, 2], "data": [7, UINT32_MAX]},
        {"name": "text_output", "datatype": "BYTES", "shape": [1], "data": ["héllo"]}]


def test_binary_data_per_output_overrides_the_default() -> None:
    _, options = infer({"inputs": [uint32_input([1, 2, 3])],
                           "parameters": {"binary_data_output": True},
                           "outputs": [{"name": "text_output",
                                        "parameters": {"binary_data": False}}]})
    response = server_response(
        ("output0", "UINT32", [1, 1], np.array([5], "<u4").tobytes()),
        ("text_output", "BYTES", [1], serialize_bytes([b"x"])))
    reply = kserve.infer_response_to_http(response, options)
    head = json.loads(reply.body[:reply.header_length])
    assert [output.get("data") for output in head["outputs"]] == [None, ["x"]]
    assert reply.body[reply.header_length:] == np.array([5], "<u4").tobytes()


def test_split_body_without_header_length_is_all_json() -> None:
    assert kserve.split_body(b'{"a": 1}', None) == ({"a": 1}, b"")


@pytest.mark.parametrize(("header_length", "rule"), [
    ("abc", "must be an integer; got 'abc'"), ("1.5", "must be an integer; got '1.5'"),
    ("0", "must be in [1, 12] (the body's bytes); got 0"), ("-1", "in [1, 12]"),
    ("13", "in [1, 12]")])
def test_split_body_refuses_a_bad_header_length(header_length: str, rule: str) -> None:
    message = refused(kserve.split_body, b'{"a": 1}xyzw', header_length)  # 12 bytes
    assert message.startswith("Inference-Header-Content-Length:") and rule in message


@pytest.mark.parametrize(("body", "header_length"), [
    (b"{not json", None), (b'{"a": "\xff"}', None), (b'{"a": 1}', "4")])
def test_split_body_refuses_invalid_json(body: bytes, header_length: str | None) -> None:
    assert "not valid JSON" in refused(kserve.split_body, body, header_length)


@pytest.mark.parametrize(("body", "ready"), [
    (b"", False), (b" ", False), (b"{}", False), (b'{"ready": null}', False),
    (b'{"ready": false}', False), (b'{"ready": true}', True)])
def test_repository_index_request_is_an_empty_body_or_ready(body: bytes, ready: bool) -> None:
    assert kserve.repository_index_request(body) == pb.RepositoryIndexRequest(ready=ready)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"ready": "yes"}', "ready: must be true or false; got a string"),
    (b'{"ready": true, "repository": "x"}', "repository: unknown field"),
    (b"[]", "the body: must be a JSON object; got an array")])
def test_repository_index_request_refuses_a_bad_body_naming_the_field(body: bytes,
                                                                      message: str) -> None:
    assert refused(kserve.repository_index_request, body) == message


BINARY_12 = np.array([1, 2, 3], "<u4").tobytes()


@pytest.mark.parametrize(("document", "binary", "field"), [
    ([], b"", "the body"),
    ({}, b"", "inputs"),
    ({"inputs": []}, b"", "inputs"),
    ({"inputs": {"name": "input0"}}, b"", "inputs"),
    ({"inputs": ["input0"]}, b"", "inputs[0]"),
    ({"inputs": [{"datatype": "UINT32", "shape": [3], "data": [1]}]}, b"", "inputs[0].name"),
    ({"inputs": [{"name": "input0", "shape": [3], "data": [1]}]}, b"", "input0.datatype"),
    ({"inputs": [{"name": "input0", "datatype": "UINT32", "data": [1]}]}, b"", "input0.shape"),
    ({"inputs": [uint32_input([1], shape=[1.5])]}, b"", "input0.shape"),
    ({"inputs": [uint32_input()]}, b"", "input0"),
    ({"inputs": [uint32_input(parameters={"binary_data_size": 16})]}, BINARY_12,
     "input0.parameters.binary_data_size"),
    ({"inputs": [uint32_input(parameters={"binary_data_size": -4})]}, BINARY_12,
     "input0.parameters.binary_data_size"),
    ({"inputs": [uint32_input(parameters={"binary_data_size": 8})]}, BINARY_12, "inputs"),
    ({"inputs": [uint32_input([1, 2, 3])]}, BINARY_12, "inputs"),
    ({"inputs": [uint32_input([1, -1, 3])]}, b"", "input0"),
    ({"inputs": [uint32_input([1, 2**32, 3])]}, b"", "input0"),
    ({"inputs": [uint32_input([1, 2.5, 3])]}, b"", "input0"),
    ({"inputs": [uint32_input(["1"])]}, b"", "input0"),
    ({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": [1]}]}, b"", "t"),
    ({"inputs": [uint32_input([1], datatype="UINT128")]}, b"", "input0.datatype"),
    ({"inputs": [uint32_input([1])], "outputs": {"name": "output0"}}, b"", "outputs"),
    ({"inputs": [uint32_input([1])], "outputs": [{}]}, b"", "outputs[0].name"),
    ({"inputs": [uint32_input([1])], "outputs": [{"name": "o", "parameters": {"binary_data": 1}}]},
     b"", "outputs[0].parameters.binary_data"),
    ({"inputs": [uint32_input([1])], "parameters": {"binary_data_output": "yes"}}, b"",
     "parameters.binary_data_output"),
    ({"inputs": [uint32_input([1])], "parameters": [1]}, b"", "parameters"),
    ({"inputs": [uint32_input([1])], "id": 7}, b"", "id"),
    ({"inputs": [uint32_input([1])], "parameters": {"stop": {"a": 1}}}, b"", "stop"),
])
def test_infer_refuses_a_bad_body_naming_the_field(document: object, binary: bytes,
                                                  field: str) -> None:
    assert refused(infer, document, binary).startswith(f"{field}: ")


def test_leftover_binary_bytes_are_counted() -> None:
    document = {"inputs": [uint32_input(parameters={"binary_data_size": 8})]}
    assert "4 bytes of binary data are not claimed" in refused(infer, document, BINARY_12)


def test_metadata_and_config_json() -> None:
    server = pb.ServerMetadataResponse(name="switchboard", version="0.1", extensions=["parameters"])
    assert kserve.server_metadata_json(server) == {
        "name": "switchboard", "version": "0.1",
        "extensions": ["parameters", "binary_tensor_data", "generate"]}
    model = pb.ModelMetadataResponse(name="smollm2", versions=["1"], platform="switchboard")
    model.inputs.add(name="input0", datatype="UINT32", shape=[1, -1])
    model.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    assert kserve.model_metadata_json(model) == {
        "name": "smollm2", "versions": ["1"], "platform": "switchboard",
        "inputs": [{"name": "input0", "datatype": "UINT32", "shape": [1, -1]}],
        "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}]}
    config = mc.ModelConfig(name="smollm2", input=[mc.ModelInput(name="input0",
                                                                 data_type=mc.TYPE_UINT32)])
    assert kserve.model_config_json(config) == {
        "name": "smollm2", "input": [{"name": "input0", "data_type": "TYPE_UINT32"}]}


def test_model_config_dims_are_numbers_as_triton_renders_them() -> None:
    config = mc.ModelConfig(name="smollm2", input=[mc.ModelInput(
        name="input0", data_type=mc.TYPE_UINT32, dims=[-1])])
    assert kserve.model_config_json(config)["input"][0]["dims"] == [-1]


# --- parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    (True, pb.InferParameter(bool_param=True)),
    (5, pb.InferParameter(int64_param=5)),
    (-2**63, pb.InferParameter(int64_param=-2**63)),
    (2**63 - 1, pb.InferParameter(int64_param=2**63 - 1)),
    (2**63, pb.InferParameter(uint64_param=2**63)),
    (2**64 - 1, pb.InferParameter(uint64_param=2**64 - 1)),
    (0.5, pb.InferParameter(double_param=0.5)),
    ("x", pb.InferParameter(string_param="x")),
    (["\n\n", "END"], pb.InferParameter(string_param='["\\n\\n", "END"]')),
])
def test_to_parameter_picks_the_type(value: object, expected: pb.InferParameter) -> None:
    assert to_parameter("seed", value) == expected


@pytest.mark.parametrize(("value", "reason"), [
    (2**64, "does not fit in 64 bits"), (-2**63 - 1, "does not fit in 64 bits"),
    ({"a": 1}, "got an object")])
def test_to_parameter_refuses_naming_the_field(value: object, reason: str) -> None:
    message = refused(to_parameter, "seed", value)
    assert message.startswith("seed: ") and reason in message


def test_set_parameters_converts_priority_and_timeout_and_skips_nulls() -> None:
    request = pb.ModelInferRequest()
    set_parameters(request.parameters, {"priority": 1, "timeout": 2.5, "top_k": None})
    assert dict(request.parameters) == {"priority": pb.InferParameter(uint64_param=1),
                                        "timeout": pb.InferParameter(int64_param=2_500_000)}


def test_a_timeout_under_a_microsecond_is_one_not_the_default() -> None:
    """gRPC's timeout 0 means the default (600 s): 1e-7 s must not become it."""
    request = pb.ModelInferRequest()
    set_parameters(request.parameters, {"timeout": 1e-7})
    assert request.parameters["timeout"].int64_param == 1


@pytest.mark.parametrize(("name", "value"), [
    ("priority", 0), ("priority", -1), ("priority", "1"), ("priority", True), ("priority", 2.0),
    ("timeout", 0), ("timeout", -1), ("timeout", "10"), ("timeout", True), ("timeout", float("nan")),
])
def test_set_parameters_refuses_mindie_priority_and_timeout(name: str, value: object) -> None:
    """What would change meaning on the way: gRPC reads a priority or timeout of 0 as the
    default."""
    assert refused(set_parameters, pb.ModelInferRequest().parameters, {name: value}) \
        .startswith(f"{name}: ")


@pytest.mark.parametrize(("value", "sent"), [(6, 6), (2**70, 2**64 - 1)])
def test_a_priority_past_the_servers_range_travels_for_it_to_refuse(value: int, sent: int) -> None:
    """The server owns the range (1 to 5), as it owns the timeout's."""
    request = pb.ModelInferRequest()
    set_parameters(request.parameters, {"priority": value})
    assert request.parameters["priority"].uint64_param == sent


LONGEST_S = 3600.0


@pytest.mark.parametrize(("request_", "deadline_s"), [
    (sb.GenerateRequest(), LONGEST_S),
    (sb.GenerateRequest(scheduling=sb.Scheduling(timeout=1.5)), 1.5),
    (sb.GenerateRequest(scheduling=sb.Scheduling(timeout=5000.0)), LONGEST_S),
    (pb.ModelInferRequest(), LONGEST_S),
    (pb.ModelInferRequest(parameters={"timeout": pb.InferParameter(int64_param=2_500_000)}), 2.5),
], ids=["switchboard-none", "switchboard-own", "switchboard-past-the-longest", "kserve-none",
        "kserve-own"])
def test_a_calls_deadline_is_its_timeout_within_the_servers_longest_and_a_grace_later(
        request_, deadline_s: float) -> None:
    """The server ends a request at its timeout with an error naming it; the call's deadline
    comes a grace later so that this error is what the client reads. Without a timeout (or
    past what the server takes, which it refuses) the bound is the server's longest."""
    assert deadline_of(request_, LONGEST_S) == deadline_s + UPSTREAM_GRACE_S


# --- MindIE /generate ------------------------------------------------------------------------

MINDIE_EXAMPLE = {"id": "a123", "text_input": "My name is Olivier and I", "parameters": {
    "details": True, "do_sample": True, "max_new_tokens": 20, "repetition_penalty": 1.03,
    "seed": 5, "temperature": 0.5, "top_k": 10, "top_p": 0.95, "batch_size": 1, "typical_p": 0.5,
    "watermark": False, "perf_stat": True, "priority": 5, "timeout": 10}}


def test_mindie_generate_example_translates_with_typed_parameters() -> None:
    request, options = triton.generate_request_to_pb("smollm2", "1", MINDIE_EXAMPLE, False)
    assert (request.model_name, request.model_version, request.id) == ("smollm2", "1", "a123")
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("text_input", "BYTES", [1])
    assert deserialize_bytes(request.raw_input_contents[0]) == [b"My name is Olivier and I"]
    assert options == triton.GenerateOptions(details=True, perf_stat=True)
    P = pb.InferParameter
    assert dict(request.parameters) == {
        "details": P(bool_param=True), "do_sample": P(bool_param=True),
        "max_new_tokens": P(int64_param=20), "repetition_penalty": P(double_param=1.03),
        "seed": P(int64_param=5), "temperature": P(double_param=0.5), "top_k": P(int64_param=10),
        "top_p": P(double_param=0.95), "batch_size": P(int64_param=1),
        "typical_p": P(double_param=0.5), "watermark": P(bool_param=False),
        "perf_stat": P(bool_param=True), "priority": P(uint64_param=5),
        "timeout": P(int64_param=10_000_000)}


def test_generate_top_level_properties_are_parameters_the_object_wins() -> None:
    request, options = triton.generate_request_to_pb("m", "", {
        "text_input": "x", "seed": 2**63, "top_k": 3, "details": True, "parameters": {"top_k": 4}},
        False)
    assert request.parameters["seed"] == pb.InferParameter(uint64_param=2**63)
    assert request.parameters["top_k"].int64_param == 4
    assert options == triton.GenerateOptions(details=True, perf_stat=False)


@pytest.mark.parametrize(("document", "field"), [
    ([], "the body"),
    ({}, "text_input"),
    ({"text_input": 5}, "text_input"),
    ({"text_input": "x", "parameters": "top_k=1"}, "parameters"),
    ({"text_input": "x", "id": 5}, "id"),
    ({"text_input": "x", "parameters": {"details": "yes"}}, "details"),
    ({"text_input": "x", "details": 1}, "details"),
    ({"text_input": "x", "parameters": {"perf_stat": "true"}}, "perf_stat"),
    *(({"text_input": "x", "parameters": {"priority": value}}, "priority")
      for value in (0, -1, "1", True)),
    *(({"text_input": "x", "parameters": {"timeout": value}}, "timeout") for value in (0, -1, "10")),
    ({"text_input": "x", "parameters": {"seed": 2**64}}, "seed"),
    ({"text_input": "x", "parameters": {"stop": {"a": 1}}}, "stop"),
])
def test_generate_refuses_a_bad_body_naming_the_field(document: object, field: str) -> None:
    assert refused(triton.generate_request_to_pb, "m", "", document, False).startswith(f"{field}: ")


def test_generate_takes_kserves_generate_extension_parameters() -> None:
    """The Open Inference Protocol's generate_rest.yaml: max_tokens, temperature and top_p
    from 0 (greedy), stop as an array; errors about max_new_tokens name max_tokens."""
    request, options = triton.generate_request_to_pb("m", "", {"text_input": "x", "parameters": {
        "max_tokens": 8, "temperature": 0, "top_p": 0.0, "stop": ["\n"], "details": True}}, False)
    P = pb.InferParameter
    assert dict(request.parameters) == {
        "max_new_tokens": P(int64_param=8), "do_sample": P(bool_param=False),
        "stop": P(string_param='["\\n"]'), "details": P(bool_param=True)}
    assert options.names == {"max_tokens": "max_new_tokens"} and options.details


@pytest.mark.parametrize("parameters", [{"temperature": 0.5, "top_p": 0}, {"top_p": 0}])
def test_a_kserve_top_p_of_0_is_greedy(parameters: dict) -> None:
    request, _ = triton.generate_request_to_pb("m", "", {"text_input": "x",
                                                         "parameters": parameters}, False)
    assert request.parameters["do_sample"].bool_param is False
    assert "top_p" not in request.parameters


def test_a_temperature_of_0_with_do_sample_is_left_for_the_server_to_refuse() -> None:
    request, _ = triton.generate_request_to_pb("m", "", {"text_input": "x", "parameters": {
        "temperature": 0, "do_sample": True}}, False)
    assert request.parameters["temperature"].int64_param == 0
    assert request.parameters["do_sample"].bool_param is True


def test_max_tokens_and_max_new_tokens_together_are_refused() -> None:
    assert refused(triton.generate_request_to_pb, "m", "", {"text_input": "x", "parameters": {
        "max_tokens": 8, "max_new_tokens": 8}}, False).startswith("max_tokens: ")


@pytest.mark.parametrize("value", [0, ""], ids=["zero", "empty-string"])
def test_generate_refuses_falsy_non_boolean_details(value: object) -> None:
    refused(triton.generate_request_to_pb, "m", "", {"text_input": "x", "details": value}, False)


def test_timeout_overflowing_to_infinity_is_a_400() -> None:
    document = kserve.parse_json(b'{"text_input": "x", "parameters": {"timeout": 1e400}}')
    refused(triton.generate_request_to_pb, "m", "", document, False)


# --- Triton's vLLM backend interface on /generate ---------------------------------------------

# Triton's generate extension's own example (and the vLLM backend's quickstart).
TRITON_EXAMPLE = {"text_input": "client input", "parameters": {"stream": False, "temperature": 0}}


def inputs_of(request: pb.ModelInferRequest) -> dict[str, tuple[str, list[int], bytes]]:
    return {tensor.name: (tensor.datatype, list(tensor.shape), raw)
            for tensor, raw in zip(request.inputs, request.raw_input_contents)}


def test_a_field_named_as_a_vllm_backend_input_becomes_that_tensor() -> None:
    """As Triton maps a generate request's fields to the model's inputs by name: `stream` is
    the BOOL tensor the vLLM backend reads, `temperature` stays a request parameter."""
    request, options = triton.generate_request_to_pb("m", "", TRITON_EXAMPLE, False)
    assert inputs_of(request) == {"text_input": ("BYTES", [1], serialize_bytes([b"client input"])),
                                  "stream": ("BOOL", [1], b"\x00")}
    assert dict(request.parameters) == {"temperature": pb.InferParameter(int64_param=0)}
    assert options.vllm and not options.details


def test_vllm_backend_inputs_come_top_level_or_as_arrays_of_one() -> None:
    request, options = triton.generate_request_to_pb("m", "", {
        "text_input": "x", "stream": [True], "return_finish_reason": True,
        "sampling_parameters": '{"max_tokens": "5"}'}, True)
    assert inputs_of(request) == {
        "text_input": ("BYTES", [1], serialize_bytes([b"x"])), "stream": ("BOOL", [1], b"\x01"),
        "return_finish_reason": ("BOOL", [1], b"\x01"),
        "sampling_parameters": ("BYTES", [1], serialize_bytes([b'{"max_tokens": "5"}']))}
    assert not request.parameters and options.vllm


@pytest.mark.parametrize(("document", "route_streams", "field"), [
    ({"text_input": "x", "stream": True}, False, "stream"),
    ({"text_input": "x", "parameters": {"stream": "true"}}, True, "stream"),
    ({"text_input": "x", "stream": [True, False]}, True, "stream"),
    ({"text_input": "x", "sampling_parameters": {"max_tokens": 5}}, False, "sampling_parameters"),
    ({"text_input": "x", "return_num_input_tokens": 1}, False, "return_num_input_tokens"),
    ({"text_input": "x", "stream": False, "details": True}, False, "details"),
    ({"text_input": "x", "stream": True, "perf_stat": True}, True, "perf_stat"),
])
def test_vllm_backend_inputs_are_checked_naming_the_field(document: object, route_streams: bool,
                                                          field: str) -> None:
    """A stream on /generate, which Triton answers once; a value of the wrong type; MindIE's
    details, which the vLLM backend's replies do not have."""
    assert refused(triton.generate_request_to_pb, "m", "", document, route_streams) \
        .startswith(f"{field}: ")


def vllm_response(text: str, **outputs: tuple[str, bytes]) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    response.raw_output_contents.append(serialize_bytes([text.encode()]))
    for name, (datatype, raw) in outputs.items():
        response.outputs.add(name=name, datatype=datatype, shape=[1])
        response.raw_output_contents.append(raw)
    return response


def test_vllm_backend_replies_are_tritons_each_output_under_its_name() -> None:
    replies = triton.reply_stream(triton.GenerateOptions(False, False, vllm=True))
    first = replies.add(vllm_response(" Paris", finish_reason=("BYTES", serialize_bytes([b"None"]))))
    assert first == {"model_name": "m", "model_version": "1", "text_output": " Paris",
                     "finish_reason": "None"}
    last = vllm_response(".", finish_reason=("BYTES", serialize_bytes([b"length"])),
                         num_output_tokens=("UINT32", np.uint32(1).tobytes()))
    last.id = "a1"
    assert replies.add(last) == replies.reply() == {
        "id": "a1", "model_name": "m", "model_version": "1", "text_output": ".",
        "finish_reason": "length", "num_output_tokens": 1}


# --- MindIE /generate_stream accumulation ----------------------------------------------------

def generated(text: str, token_id: int | None = None, latency_us: int | None = None,
              **parameters: object) -> pb.ModelInferResponse:
    response = server_response(("text_output", "BYTES", [1], serialize_bytes([text.encode()])))
    if token_id is not None:
        response.parameters["token_id"].int64_param = token_id
    if latency_us is not None:
        response.parameters["token_latency_us"].int64_param = latency_us
        response.parameters["batch_size"].int64_param = 2
        response.parameters["queue_wait_us"].int64_param = 150
    for name, value in parameters.items():
        response.parameters[name].CopyFrom(to_parameter(name, value))
    return response


# Three tokens, then the final response of a request stopped by a stop sequence: no token.
# KServe's generate-extension tokens of them, as the server describes them with details.
TOKENS = [{"id": 5, "text": "Hello", "logprob": -0.5, "special": False},
          {"id": 6, "text": " wor", "logprob": -1.25, "special": False},
          {"id": 7, "text": "ld!", "logprob": -0.125, "special": False}]
STREAM = [*(generated(token["text"], token["id"], latency_us, token_text=token["text"],
                      token_logprob=token["logprob"], token_special=token["special"])
            for token, latency_us in zip(TOKENS, (12_000, 3_000, 2_500))),
          generated("", finish_reason="stop", generated_tokens=3)]


def run(options: triton.GenerateOptions) -> tuple[list[dict[str, object]], dict[str, object]]:
    stream = triton.GenerateStream(options)
    events = [stream.add(response) for response in STREAM]
    return events, stream.reply()


def test_stream_events_carry_running_details() -> None:
    events, _ = run(triton.GenerateOptions(details=False, perf_stat=True))
    assert [(e["text_output"], e["prefill_time"], e["decode_time"]) for e in events] == [
        ("Hello", 12.0, None), (" wor", None, 3.0), ("ld!", None, 2.5), ("", None, None)]
    assert [e["details"]["generated_tokens"] for e in events] == [1, 2, 3, 3]
    assert [e["details"].get("finish_reason") for e in events] == [None, None, None, "stop"]
    assert [e["details"]["decode_cost"] for e in events] == [None, 3.0, 5.5, 5.5]
    assert events[0]["details"] == {
        "generated_tokens": 1, "first_token_cost": 12.0, "decode_cost": None,
        "perf_stat": [[5, 12.0]], "batch_size": 2, "queue_wait_time": 150}
    assert events[-1]["details"]["perf_stat"] == [[5, 12.0], [6, 3.0], [7, 2.5]]
    assert all(e["id"] == "a" and e["model_name"] == "smollm2" and e["model_version"] == "1"
               for e in events)


@pytest.mark.parametrize(("details", "perf_stat"), [(False, False), (True, False), (True, True)])
def test_stream_reply_shows_details_and_perf_stat_only_when_asked(details: bool,
                                                                 perf_stat: bool) -> None:
    _, reply = run(triton.GenerateOptions(details=details, perf_stat=perf_stat))
    expected: dict[str, object] = {"id": "a", "model_name": "smollm2", "model_version": "1",
                                   "text_output": "Hello world!"}
    if details:
        expected["details"] = {"generated_tokens": 3, "first_token_cost": 12.0,
                               "decode_cost": 5.5, "finish_reason": "stop", "logprobs": TOKENS}
        if perf_stat:
            expected["details"]["perf_stat"] = [[5, 12.0], [6, 3.0], [7, 2.5]]
    assert reply == expected


def test_stream_events_with_details_carry_kserves_token() -> None:
    events, _ = run(triton.GenerateOptions(details=True, perf_stat=False))
    assert [e["details"].get("finish_reason") for e in events] == [None, None, None, "stop"]
    assert [e["details"]["token"] for e in events] == [*TOKENS, None]
    assert events[0]["details"]["first_token_cost"] == 12.0  # MindIE's keys stay


def test_request_stopped_before_any_token() -> None:
    stream = triton.GenerateStream(triton.GenerateOptions(True, True))
    event = stream.add(generated("", finish_reason="stop", generated_tokens=0))
    assert (event["prefill_time"], event["decode_time"]) == (None, None)
    assert stream.reply()["details"] == {"generated_tokens": 0, "first_token_cost": None,
                                         "decode_cost": None, "finish_reason": "stop",
                                         "perf_stat": [], "logprobs": []}


def test_last_token_carrying_the_finish_reason_counts_as_a_token() -> None:
    stream = triton.GenerateStream(triton.GenerateOptions(True, True))
    stream.add(generated("a", 1, 1_000))
    last = stream.add(generated("b", 2, 2_000, finish_reason="length", generated_tokens=2))
    assert (last["decode_time"], last["details"]["finish_reason"]) == (2.0, "length")
    assert stream.reply()["details"]["perf_stat"] == [[1, 1.0], [2, 2.0]]


# --- errors and SSE ---------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "status"), [
    (grpc.StatusCode.INVALID_ARGUMENT, 400), (grpc.StatusCode.OUT_OF_RANGE, 400),
    (grpc.StatusCode.CANCELLED, 400), (grpc.StatusCode.NOT_FOUND, 404),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 503), (grpc.StatusCode.UNAVAILABLE, 503),
    (grpc.StatusCode.DEADLINE_EXCEEDED, 504), (grpc.StatusCode.UNIMPLEMENTED, 501),
    (grpc.StatusCode.INTERNAL, 500), (grpc.StatusCode.UNKNOWN, 500),
])
def test_grpc_status_maps_to_http(code: grpc.StatusCode, status: int) -> None:
    assert http_status(code, KSERVE_HTTP_STATUS) == status


@pytest.mark.parametrize(("code", "details", "message"), [
    (grpc.StatusCode.INVALID_ARGUMENT, "top_k: must be >= 0", "top_k: must be >= 0"),
    (grpc.StatusCode.INTERNAL, "Traceback: CUDA error at /opt/engine.py", "internal error"),
    (grpc.StatusCode.UNKNOWN, "KeyError('x')", "internal error"),
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to 10.0.0.7:8001",
     "the inference server is unavailable; retry later"),
    (grpc.StatusCode.UNAVAILABLE, "the model is not ready: loading",
     "the model is not ready: loading"),
    (grpc.StatusCode.UNAVAILABLE, None, "the inference server is unavailable; retry later"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, None, "the request timed out"),
    (grpc.StatusCode.NOT_FOUND, None, "not_found"),
])
def test_client_message_hides_internals(code: grpc.StatusCode, details: str | None,
                                        message: str) -> None:
    assert client_message(code, details) == message


def rpc_error(status: grpc.Status) -> grpc.aio.AioRpcError:
    """The error a gateway's call ends with when the server aborts with `status`."""
    return grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(),
                                grpc.aio.Metadata(*status.trailing_metadata), status.details)


def test_a_refused_field_travels_in_the_status_details_not_the_text() -> None:
    refused = rpc_error(refusal(InvalidRequest("stop[1]", "is empty")))
    assert (refused.code(), refused.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                   "stop[1]: is empty")
    assert field_violation(refused) == ("stop[1]", "is empty")


@pytest.mark.parametrize("error", [
    rpc_error(refusal(Overloaded("too many requests"))),
    # Text shaped as "field: reason" names no field without the status details.
    grpc.aio.AioRpcError(grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(),
                         grpc.aio.Metadata(), "top_k: must be >= 0")],
    ids=["overloaded", "text-only"])
def test_a_status_without_a_field_violation_names_no_field(error: grpc.aio.AioRpcError) -> None:
    assert field_violation(error) is None


def test_sse_event_is_one_compact_utf8_line() -> None:
    event = sse_event({"text_output": "a\nb", "é": [1, None]})
    assert event == 'data: {"text_output":"a\\nb","é":[1,null]}\n\n'.encode()
    assert event.count(b"\n") == 2
