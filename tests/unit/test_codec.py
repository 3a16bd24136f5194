"""server.codec: KServe v2 protobuf messages <-> engine types."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
from collections.abc import Callable

import pytest

from switchboard.engine.config import EngineLimits
from switchboard.engine.errors import InvalidRequest, PromptTooLong
from switchboard.engine.params import GenerationRequest
from switchboard.engine.request import FinishReason, RequestOutput, RequestTimings, TokenLogprob
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.server.codec import (InferCall, InferResult, InputKind, aggregate, build_engine_request,
                          decode_infer_request, deserialize_bytes, infer_response,
                          parameters_from_pb, serialize_bytes, stream_response)

LIMITS = EngineLimits(vocab_size=100, max_seq_len=64, max_input_len=63, max_iter_times=32,
                      max_token_bytes=8)
TOKENS = [5, 17, 99]
TEXT = "héllo 👍"


def engine_request(call: InferCall, encode: Callable[[str], list[int]], request_id: str = "r"
                   ) -> GenerationRequest:
    """build_engine_request with `encode` as the engine's tokenizer."""
    async def encoding(text: str) -> list[int]:
        return encode(text)
    return asyncio.run(build_engine_request(call, request_id, encoding, LIMITS))


def uint32s(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def token_request(tokens: list[int] = TOKENS, *, raw: bool = True, shape: list[int] | None = None,
                  name: str = "input0", datatype: str = "UINT32",
                  data: bytes | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="smollm2", id="client-7")
    tensor = request.inputs.add(name=name, datatype=datatype,
                                shape=shape if shape is not None else [1, len(tokens)])
    if raw:
        request.raw_input_contents.append(data if data is not None else uint32s(tokens))
    else:
        tensor.contents.uint_contents.extend(tokens)
    return request


def text_request(*, raw: bool = True, shape: list[int] | None = None,
                 data: bytes | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="smollm2", id="client-7")
    add_string(request, "text_input", TEXT.encode(), raw=raw, shape=shape, data=data)
    return request


def add_string(request: pb.ModelInferRequest, name: str, element: bytes, *, raw: bool = True,
               shape: list[int] | None = None, data: bytes | None = None) -> None:
    """A BYTES input of one element; `data`: raw bytes sent instead of it."""
    tensor = request.inputs.add(name=name, datatype="BYTES",
                                shape=shape if shape is not None else [1])
    if raw:
        request.raw_input_contents.append(data if data is not None else serialize_bytes([element]))
    else:
        tensor.contents.bytes_contents.append(element)


def rejection(request: pb.ModelInferRequest) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        decode_infer_request(request)
    return caught.value


def with_parameters(request: pb.ModelInferRequest, **values: object) -> pb.ModelInferRequest:
    for name, value in values.items():
        set_parameter(request.parameters[name], value)
    return request


def set_parameter(parameter: pb.InferParameter, value: object) -> None:
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = value


def pb_parameters(**values: object) -> dict[str, object]:
    return parameters_from_pb(with_parameters(pb.ModelInferRequest(), **values).parameters)


def output(text: str, token_id: int, generated: int,
           finish_reason: FinishReason | None = None) -> RequestOutput:
    return RequestOutput(request_id="r", new_token_ids=(token_id,), text=text, num_prompt_tokens=3,
                         num_generated_tokens=generated, seed=42, finish_reason=finish_reason)


@pytest.mark.parametrize("raw", [True, False], ids=["raw_input_contents", "typed_contents"])
def test_token_request_decodes_to_the_prompt_ids(raw: bool) -> None:
    request = with_parameters(token_request(raw=raw), temperature=0.5, max_new_tokens=8)
    assert decode_infer_request(request) == InferCall(
        kind=InputKind.TOKENS, prompt=tuple(TOKENS),
        parameters={"temperature": 0.5, "max_new_tokens": 8}, client_id="client-7")


@pytest.mark.parametrize("raw", [True, False], ids=["raw_input_contents", "typed_contents"])
def test_text_request_decodes_to_the_prompt_text(raw: bool) -> None:
    request = with_parameters(text_request(raw=raw), stop="###")
    assert decode_infer_request(request) == InferCall(
        kind=InputKind.TEXT, prompt=TEXT, parameters={"stop": "###"}, client_id="client-7")


@pytest.mark.parametrize("shape", [[3], [1, 3]])
def test_token_shape_may_be_n_or_1_by_n(shape: list[int]) -> None:
    assert decode_infer_request(token_request(shape=shape)).prompt == tuple(TOKENS)


@pytest.mark.parametrize("elements", [[], [b""], [b"a", "héllo".encode(), bytes(300)]])
def test_bytes_length_prefix_round_trip(elements: list[bytes]) -> None:
    data = serialize_bytes(elements)
    assert len(data) == sum(4 + len(element) for element in elements)
    assert deserialize_bytes(data, "text_input") == elements


def test_bytes_length_prefix_is_little_endian() -> None:
    assert serialize_bytes([b"hi"]) == b"\x02\x00\x00\x00hi"


@pytest.mark.parametrize(("data", "reason"), [
    (b"\x02\x00\x00\x00hi\x01\x00", "ends inside a 4-byte length prefix"),
    (b"\x05\x00\x00\x00hi", "element of 5 bytes runs past the data"),
])
def test_malformed_bytes_data_is_rejected(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        deserialize_bytes(data, "text_input")
    assert caught.value.field == "text_input"
    assert reason in caught.value.reason


def two_inputs() -> pb.ModelInferRequest:
    request = token_request()
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    return request


def two_raw_contents() -> pb.ModelInferRequest:
    request = token_request()
    request.raw_input_contents.append(uint32s(TOKENS))
    return request


def typed_and_raw_contents() -> pb.ModelInferRequest:
    request = token_request()
    request.inputs[0].contents.uint_contents.extend([1, 2, 3])
    return request


def unknown_output() -> pb.ModelInferRequest:
    request = token_request()
    request.outputs.add(name="text_output")
    return request


@pytest.mark.parametrize(("make", "field", "reason"), [
    (lambda: token_request(name="prompt"), "inputs", "unknown input 'prompt'"),
    (two_inputs, "inputs", "expected exactly one input"),
    (lambda: pb.ModelInferRequest(), "inputs", "got 0"),
    (lambda: token_request(datatype="INT64"), "input0", "datatype must be UINT32"),
    (lambda: token_request(shape=[2, 3]), "input0", "shape must be [n] or [1, n]"),
    (lambda: token_request(shape=[]), "input0", "shape must be"),
    (lambda: token_request(shape=[4]), "input0", "needs 16 bytes of UINT32 data; got 12"),
    (lambda: token_request(raw=False, shape=[4]), "input0", "holds 4 elements; got 3"),
    (two_raw_contents, "raw_input_contents", "has 2 entries for 1 inputs"),
    (typed_and_raw_contents, "input0", "has both contents and raw_input_contents"),
    (unknown_output, "outputs", "unknown output 'text_output'"),
    (lambda: text_request(shape=[2]), "text_input", "expected one string element"),
    (lambda: text_request(data=serialize_bytes([b"a", b"b"])), "text_input",
     "expected one string element"),
    (lambda: text_request(data=serialize_bytes([b"\xff\xfe"])), "text_input",
     "is not valid UTF-8"),
    (lambda: text_request(data=b"\x09\x00\x00\x00short"), "text_input", "runs past the data"),
])
def test_invalid_infer_request_names_the_field_at_fault(make: Callable[[], pb.ModelInferRequest],
                                                        field: str, reason: str) -> None:
    error = rejection(make())
    assert error.field == field
    assert reason in error.reason


@pytest.mark.parametrize("reserved", ["sequence_id", "sequence_start", "binary_data_output",
                                      "triton_enable_empty_final_response"])
def test_reserved_triton_parameters_are_dropped(reserved: str) -> None:
    assert pb_parameters(**{reserved: True, "top_k": 3}) == {"top_k": 3}


def test_a_parameter_without_a_value_is_refused_by_name() -> None:
    request = pb.ModelInferRequest()
    request.parameters["top_k"].int64_param = 3
    request.parameters["temperature"].SetInParent()
    with pytest.raises(InvalidRequest) as caught:
        parameters_from_pb(request.parameters)
    assert caught.value.field == "temperature"
    assert "has no value" in caught.value.reason


@pytest.mark.parametrize(("priority", "expected"), [(0, {}), (3, {"priority": 3})])
def test_priority_zero_means_default(priority: int, expected: dict[str, object]) -> None:
    request = pb.ModelInferRequest()
    request.parameters["priority"].uint64_param = priority
    assert parameters_from_pb(request.parameters) == expected


@pytest.mark.parametrize(("microseconds", "expected"), [
    (2_000_000, {"timeout": 2.0}),
    (1_500, {"timeout": 0.0015}),
    (0, {}),
])
def test_timeout_microseconds_become_seconds(microseconds: int,
                                             expected: dict[str, object]) -> None:
    assert pb_parameters(timeout=microseconds) == expected


@pytest.mark.parametrize("timeout", [2.5, "10"])
def test_timeout_that_is_not_an_integer_is_rejected(timeout: object) -> None:
    with pytest.raises(InvalidRequest) as caught:
        pb_parameters(timeout=timeout)
    assert caught.value.field == "timeout"
    assert "integer number of microseconds" in caught.value.reason


@pytest.mark.parametrize(("stop", "expected"), [
    ('["###", "\\n\\nUser:"]', ["###", "\n\nUser:"]),
    ("###", "###"),
    ("[]", []),
])
def test_stop_may_be_a_json_array_of_strings(stop: str, expected: object) -> None:
    assert pb_parameters(stop=stop) == {"stop": expected}


@pytest.mark.parametrize("stop", ["[not json", '["a",'])
def test_stop_that_starts_like_an_array_but_is_not_json_is_rejected(stop: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        pb_parameters(stop=stop)
    assert caught.value.field == "stop"
    assert "not a JSON array" in caught.value.reason


def test_logit_bias_travels_as_a_json_object() -> None:
    assert pb_parameters(logit_bias='{"5": -100, "7": 2.5}') == \
        {"logit_bias": {"5": -100, "7": 2.5}}


@pytest.mark.parametrize("logit_bias", ["{5: 1}", '{"5": 1'])
def test_logit_bias_that_starts_like_an_object_but_is_not_json_is_rejected(logit_bias: str
                                                                            ) -> None:
    with pytest.raises(InvalidRequest) as caught:
        pb_parameters(logit_bias=logit_bias)
    assert caught.value.field == "logit_bias"
    assert "not a JSON object" in caught.value.reason


def test_parameters_keep_their_types() -> None:
    values = pb_parameters(do_sample=True, top_k=5, temperature=0.5, stop="end")
    assert values == {"do_sample": True, "top_k": 5, "temperature": 0.5, "stop": "end"}
    assert [type(values[name]) for name in ("do_sample", "top_k", "temperature", "stop")] == \
        [bool, int, float, str]


def test_build_engine_request_validates_tokens_and_parameters() -> None:
    call = decode_infer_request(with_parameters(token_request(), max_new_tokens=5, seed=11))
    request = engine_request(call, lambda text: [], "server-id-1")
    assert request.request_id == "server-id-1"
    assert request.prompt_token_ids == tuple(TOKENS)
    assert (request.sampling.max_new_tokens, request.sampling.seed) == (5, 11)


def test_build_engine_request_encodes_text_prompts() -> None:
    call = decode_infer_request(text_request())
    request = engine_request(call, lambda text: [len(text), 1])
    assert request.prompt_token_ids == (len(TEXT), 1)


@pytest.mark.parametrize(("make", "encoded", "field"), [
    (lambda: token_request([5, 100]), None, "input0"),
    (text_request, [5, 100], "text_input"),
])
def test_prompt_errors_name_the_input_tensor(make: Callable[[], pb.ModelInferRequest],
                                             encoded: list[int] | None, field: str) -> None:
    call = decode_infer_request(make())
    with pytest.raises(InvalidRequest) as caught:
        engine_request(call, lambda text: encoded)
    assert caught.value.field == field
    assert "token id 100 at position 1" in caught.value.reason
    assert caught.value.message.startswith(f"{field}: ")


def test_prompt_too_long_keeps_its_kind_under_the_input_name() -> None:
    call = decode_infer_request(token_request([1] * 64))
    with pytest.raises(PromptTooLong) as caught:
        engine_request(call, lambda text: [])
    assert caught.value.field == "input0"


def test_parameter_errors_keep_their_field() -> None:
    call = decode_infer_request(with_parameters(token_request(), temperature=0.0))
    with pytest.raises(InvalidRequest) as caught:
        engine_request(call, lambda text: [])
    assert caught.value.field == "temperature"


def test_token_infer_response_carries_uint32_ids_and_finish_parameters() -> None:
    call = decode_infer_request(token_request())
    result = InferResult(token_ids=(7, 70000, 2), text="ignored", finish_reason=FinishReason.EOS,
                         num_prompt_tokens=3, seed=2**63 + 5)
    response = infer_response(call, "smollm2", result)
    assert (response.model_name, response.model_version, response.id) == \
        ("smollm2", "1", "client-7")
    [tensor] = response.outputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("output0", "UINT32", [1, 3])
    assert list(response.raw_output_contents) == [uint32s([7, 70000, 2])]
    assert response.parameters["finish_reason"].string_param == "eos_token"
    assert response.parameters["generated_tokens"].int64_param == 3
    assert response.parameters["seed"].uint64_param == 2**63 + 5


def test_text_infer_response_carries_one_length_prefixed_utf8_string() -> None:
    call = decode_infer_request(text_request())
    result = InferResult(token_ids=(1, 2), text=TEXT, finish_reason=FinishReason.LENGTH,
                         num_prompt_tokens=4, seed=9)
    response = infer_response(call, "smollm2", result)
    [tensor] = response.outputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("text_output", "BYTES", [1])
    encoded = TEXT.encode()
    assert list(response.raw_output_contents) == [struct.pack("<I", len(encoded)) + encoded]
    assert response.parameters["finish_reason"].string_param == "length"
    assert response.parameters["generated_tokens"].int64_param == 2


@pytest.mark.parametrize("make", [token_request, text_request], ids=["tokens", "text"])
def test_stream_responses_flag_only_the_final_one(
        make: Callable[[], pb.ModelInferRequest]) -> None:
    call = decode_infer_request(make())
    intermediate = stream_response(call, "smollm2", output("he", 7, 1)).infer_response
    final = stream_response(call, "smollm2", output("llo", 8, 2, FinishReason.STOP)).infer_response
    assert intermediate.parameters["triton_final_response"].bool_param is False
    assert set(intermediate.parameters) == {"triton_final_response", "token_id"}
    assert intermediate.parameters["token_id"].int64_param == 7
    assert final.parameters["triton_final_response"].bool_param is True
    assert final.parameters["finish_reason"].string_param == "stop_sequence"
    assert final.parameters["generated_tokens"].int64_param == 2
    assert final.parameters["seed"].uint64_param == 42
    expected = ([uint32s([7])], [uint32s([8])]) if call.kind is InputKind.TOKENS else \
        ([serialize_bytes([b"he"])], [serialize_bytes([b"llo"])])
    assert (list(intermediate.raw_output_contents), list(final.raw_output_contents)) == expected


def test_aggregate_concatenates_the_events() -> None:
    events = [output("Hel", 1, 1), output("", 2, 2), output("lo", 3, 3, FinishReason.EOS)]
    result = aggregate(events)
    assert result == InferResult(token_ids=(1, 2, 3), text="Hello", finish_reason=FinishReason.EOS,
                                 num_prompt_tokens=3, seed=42)


@pytest.mark.parametrize("events", [[], [output("a", 1, 1)]], ids=["empty", "unfinished"])
def test_aggregate_needs_a_finished_last_event(events: list[RequestOutput]) -> None:
    with pytest.raises(ValueError, match="must end with a finished one"):
        aggregate(events)


def test_stop_token_ids_travel_as_a_json_array() -> None:
    assert pb_parameters(stop_token_ids="[2, 0]") == {"stop_token_ids": [2, 0]}


@pytest.mark.parametrize("name", ["logprobs", "top_logprobs"])
def test_logprob_parameters_are_refused_over_grpc(name: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        pb_parameters(**{name: True if name == "logprobs" else 3})
    assert caught.value.field == name


@pytest.mark.parametrize("name", ["n", "best_of"])
def test_several_sequences_are_refused_over_grpc(name: str) -> None:
    assert pb_parameters(**{name: 1}) == {name: 1}
    with pytest.raises(InvalidRequest) as caught:
        pb_parameters(**{name: 2})
    assert caught.value.field == name


def test_stream_responses_carry_the_token_timings_in_microseconds() -> None:
    call = decode_infer_request(text_request())
    event = dataclasses.replace(output("he", 7, 1), timings=RequestTimings(
        queue_wait=0.0015, first_token=0.25, step_time=100.0, token_latency=0.0425, batch_size=3))
    parameters = stream_response(call, "smollm2", event).infer_response.parameters
    assert parameters["batch_size"].int64_param == 3
    assert parameters["queue_wait_us"].int64_param == 1500
    assert parameters["token_latency_us"].int64_param == 42500


def test_details_describe_each_streamed_token_as_kserves_generate_extension() -> None:
    """With MindIE's details (KServe's generate extension's), the engine scores the tokens
    and each response names its token's text, log-probability and whether it is special."""
    call = decode_infer_request(with_parameters(text_request(), details=True))
    assert engine_request(call, lambda text: [1]).sampling.logprobs == 0
    event = dataclasses.replace(output("", 2, 1), decoded_text="</s>",
                                logprobs=(TokenLogprob(2, -0.25),))
    parameters = stream_response(call, "smollm2", event, frozenset({2})).infer_response.parameters
    assert (parameters["token_id"].int64_param, parameters["token_text"].string_param,
            parameters["token_logprob"].double_param, parameters["token_special"].bool_param) \
        == (2, "</s>", -0.25, True)


def test_without_details_responses_describe_no_token() -> None:
    call = decode_infer_request(text_request())
    assert engine_request(call, lambda text: [1]).sampling.logprobs is None
    parameters = stream_response(call, "smollm2", output("he", 7, 1)).infer_response.parameters
    assert set(parameters) == {"triton_final_response", "token_id"}


def test_a_stopped_request_ends_with_an_empty_final_response() -> None:
    call = decode_infer_request(text_request())
    stopped = RequestOutput(request_id="r", new_token_ids=(), text="", num_prompt_tokens=3,
                            num_generated_tokens=4, seed=42, finish_reason=FinishReason.STOPPED)
    response = stream_response(call, "smollm2", stopped).infer_response
    assert response.parameters["finish_reason"].string_param == "stopped"
    assert response.parameters["triton_final_response"].bool_param is True
    assert "token_id" not in response.parameters


@pytest.mark.parametrize("client_id", ["x" * 257, "has space", "semi;colon"])
def test_client_ids_follow_mindies_rule(client_id: str) -> None:
    request = token_request()
    request.id = client_id
    with pytest.raises(InvalidRequest) as raised:
        decode_infer_request(request)
    assert raised.value.field == "id"


def test_more_outputs_than_inputs_are_refused() -> None:
    request = token_request()
    request.outputs.add(name="output0")
    request.outputs.add(name="output0")
    with pytest.raises(InvalidRequest) as raised:
        decode_infer_request(request)
    assert raised.value.field == "outputs"
