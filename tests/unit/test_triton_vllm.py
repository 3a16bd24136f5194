"""Triton's vLLM backend interface over KServe v2 (server.triton_vllm, through server.codec):
text_input with its control tensors, vLLM's sampling parameters, and its extra outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_codec import (TEXT, add_string, engine_request, output, rejection, text_request,
                        token_request, with_parameters)

from switchboard.engine.errors import InvalidRequest
from switchboard.engine.request import FinishReason
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.server.codec import (InferResult, decode_infer_request,
                          final_stream_response, infer_response, serialize_bytes,
                          stream_response)
from switchboard.server.triton_vllm import VllmOptions


def add_bool(request: pb.ModelInferRequest, name: str, value: bool, *, raw: bool = True) -> None:
    tensor = request.inputs.add(name=name, datatype="BOOL", shape=[1])
    if raw:
        request.raw_input_contents.append(np.array([value], dtype=bool).tobytes())
    else:
        tensor.contents.bool_contents.append(value)


def vllm_request(*, sampling: dict | str | None = None, raw: bool = True,
                 **controls: bool) -> pb.ModelInferRequest:
    """text_input with the given BOOL controls and sampling_parameters (a dict as JSON)."""
    request = text_request(raw=raw)
    for name, value in controls.items():
        add_bool(request, name, value, raw=raw)
    if sampling is not None:
        text = sampling if isinstance(sampling, str) else json.dumps(sampling)
        add_string(request, "sampling_parameters", text.encode(), raw=raw)
    return request


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_sampling_parameters_are_vllms_with_numbers_as_strings(raw: bool) -> None:
    """As the backend's sample client sends them: {"temperature": "0.1", ...}."""
    call = decode_infer_request(vllm_request(
        raw=raw, stream=False, sampling={"temperature": "0", "max_tokens": "8", "top_k": "-1",
                                         "ignore_eos": "true", "stop": ["\n"], "seed": None}))
    assert call.prompt == TEXT
    assert call.parameters == {"max_new_tokens": 8, "do_sample": False, "top_k": 0,
                               "ignore_eos": True, "stop": ["\n"]}
    assert call.vllm == VllmOptions(stream=False, prepend_prompt=True, outputs=frozenset())
    assert not call.streams


def test_vllms_defaults_hold_sampling_and_16_tokens() -> None:
    call = decode_infer_request(vllm_request(stream=True))
    assert call.parameters == {"max_new_tokens": 16, "do_sample": True}
    assert call.vllm == VllmOptions(stream=True, prepend_prompt=False, outputs=frozenset())
    assert call.streams


def test_without_the_tensor_the_request_parameters_are_read_by_vllms_names() -> None:
    request = with_parameters(vllm_request(stream=False), max_tokens=5, temperature=0.0,
                              priority=2)
    assert decode_infer_request(request).parameters == {"max_new_tokens": 5, "do_sample": False,
                                                        "priority": 2}


def test_the_tensor_wins_over_the_request_parameters_but_tritons_priority_and_timeout() -> None:
    """As the backend reads them: its sample client sends the sampling parameters both as the
    tensor and as request parameters (as strings), and the request parameters are ignored."""
    request = with_parameters(vllm_request(sampling={"max_tokens": 3}), priority=1,
                              timeout=2_000_000, max_tokens="100", top_p="0.95")
    assert decode_infer_request(request).parameters == {
        "max_new_tokens": 3, "do_sample": True, "priority": 1, "timeout": 2.0}


def vllm_engine_request(sampling: dict) -> object:
    call = decode_infer_request(vllm_request(stream=False, sampling=sampling))
    return engine_request(call, lambda text: [1, 2]).sampling


@pytest.mark.parametrize(("seed", "engine_seed"), [(0, 0), (7, 7), (-2, 2**64 - 2)])
def test_seeds_are_vllms_int64s_0_included(seed: int, engine_seed: int) -> None:
    assert vllm_engine_request({"temperature": 0.7, "seed": seed}).seed == engine_seed


def test_seed_minus_1_draws_a_random_seed_as_vllm_reads_it() -> None:
    call = decode_infer_request(vllm_request(sampling={"seed": -1}))
    assert "seed" not in call.parameters


def test_structured_outputs_in_vllms_object_are_the_engines_patterns() -> None:
    for holder in ("guided_decoding", "structured_outputs"):
        call = decode_infer_request(vllm_request(sampling={holder: {
            "choice": ["yes", "no"], "backend": "xgrammar"}}))
        assert call.parameters["guided_choice"] == ["yes", "no"]
    call = decode_infer_request(vllm_request(sampling={"structured_outputs": {
        "json_object": True}, "spaces_between_special_tokens": "false"}))
    assert call.parameters["guided_json"] == {"type": "object"}
    assert "spaces_between_special_tokens" not in call.parameters


def test_exclude_input_in_output_and_the_extra_outputs_asked_for() -> None:
    call = decode_infer_request(vllm_request(exclude_input_in_output=True,
                                             return_finish_reason=True,
                                             return_num_output_tokens=True,
                                             return_num_input_tokens=False))
    assert call.vllm == VllmOptions(stream=False, prepend_prompt=False,
                                    outputs=frozenset({"finish_reason", "num_output_tokens"}))


@pytest.mark.parametrize(("request_", "field", "reason"), [
    (vllm_request(stream=True, exclude_input_in_output=False), "exclude_input_in_output",
     "must not be false when streaming"),
    (vllm_request(return_logprobs=True), "return_logprobs", "not available over KServe v2"),
    (vllm_request(sampling="temperature=0"), "sampling_parameters", "is not JSON"),
    (vllm_request(sampling="[1]"), "sampling_parameters", "must be a JSON object"),
    (vllm_request(sampling={"max_tokens": "many"}), "max_tokens", "must be a number"),
    (vllm_request(sampling={"ignore_eos": "yes"}), "ignore_eos", "must be true or false"),
    (vllm_request(sampling={"logprobs": 2}), "logprobs", "not available over KServe v2"),
    (vllm_request(sampling={"n": 2}), "n", "only 1"),
    (vllm_request(sampling={"guided_decoding": {"grammar": "root ::= x"}}),
     "guided_decoding.grammar", "is not supported"),
    (vllm_request(sampling={"structured_outputs": ["x"]}), "structured_outputs",
     "must be an object"),
    (vllm_request(sampling={"spaces_between_special_tokens": 1}),
     "spaces_between_special_tokens", "must be true or false"),
    (vllm_request(sampling={"temperature": "-0.5"}), "temperature",
     "must be a number in [0, inf) (0: greedy); got -0.5"),
    (vllm_request(sampling={"seed": 2**63}), "seed",
     f"must be an integer in [{-2**63}, {2**63 - 1}] (-1: random); got {2**63}"),
])
def test_invalid_vllm_requests_name_the_field(request_: pb.ModelInferRequest, field: str,
                                              reason: str) -> None:
    error = rejection(request_)
    assert error.field == field and reason in error.reason


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens() -> None:
    call = decode_infer_request(vllm_request(sampling={"truncate_prompt_tokens": "1"}))
    assert call.parameters["truncate"] == 1
    assert engine_request(call, lambda text: [1, 2]).prompt_token_ids == (2,)


@pytest.mark.parametrize(("sampling", "field"), [
    ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": -1}, "min_tokens"),
    ({"truncate_prompt_tokens": -1}, "truncate_prompt_tokens"),
    ({"seed": 2**64}, "seed"), ({"top_p": 2}, "top_p")])
def test_engine_validation_errors_name_vllms_fields(sampling: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        vllm_engine_request(sampling)
    assert caught.value.field == field and caught.value.message.startswith(f"{field}: ")


def test_control_tensors_go_with_text_input_and_their_datatype() -> None:
    request = token_request()
    add_bool(request, "stream", True)
    assert rejection(request).field == "stream"
    request = text_request()
    request.inputs.add(name="stream", datatype="INT32", shape=[1])
    request.raw_input_contents.append(b"\x01\x00\x00\x00")
    error = rejection(request)
    assert (error.field, error.reason) == ("stream", "datatype must be BOOL; got 'INT32'")
    request = vllm_request(stream=True)
    add_bool(request, "stream", False)
    assert rejection(request).field == "inputs"


def outputs_of(response: pb.ModelInferResponse) -> dict[str, bytes]:
    return {tensor.name: data
            for tensor, data in zip(response.outputs, response.raw_output_contents)}


def uint32(value: int) -> bytes:
    return np.array([value], dtype="<u4").tobytes()


def test_unstreamed_reply_leads_with_the_prompt_and_carries_the_outputs_asked_for() -> None:
    call = decode_infer_request(vllm_request(stream=False, return_finish_reason=True,
                                             return_num_input_tokens=True,
                                             return_num_output_tokens=True))
    result = InferResult(token_ids=(1, 2), text=" and more", finish_reason=FinishReason.EOS,
                         num_prompt_tokens=4, seed=9)
    response = final_stream_response(call, "smollm2", result).infer_response
    assert response.parameters["triton_final_response"].bool_param
    assert outputs_of(response) == {
        "text_output": serialize_bytes([(TEXT + " and more").encode()]),
        "finish_reason": serialize_bytes([b"stop"]), "num_input_tokens": uint32(4),
        "num_output_tokens": uint32(2)}
    assert outputs_of(infer_response(call, "smollm2", result)) == outputs_of(response)


def test_streamed_responses_carry_their_own_tokens_and_none_until_the_end() -> None:
    call = decode_infer_request(vllm_request(stream=True, return_finish_reason=True,
                                             return_num_output_tokens=True))
    first = stream_response(call, "smollm2", output("he", 7, 1)).infer_response
    last = stream_response(call, "smollm2", output("llo", 8, 2, FinishReason.LENGTH)
                           ).infer_response
    assert outputs_of(first) == {"text_output": serialize_bytes([b"he"]),
                                 "finish_reason": serialize_bytes([b"None"]),
                                 "num_output_tokens": uint32(1)}
    assert outputs_of(last)["finish_reason"] == serialize_bytes([b"length"])


def test_a_request_naming_outputs_gets_those_alone() -> None:
    """Triton's rule: the extra output asked for but not named is left out, and so is
    text_output when the request names only an extra output."""
    request = vllm_request(stream=False, return_finish_reason=True,
                           return_num_output_tokens=True)
    request.outputs.add(name="num_output_tokens")
    call = decode_infer_request(request)
    result = InferResult(token_ids=(1, 2), text="x", finish_reason=FinishReason.LENGTH,
                         num_prompt_tokens=4, seed=9)
    assert outputs_of(infer_response(call, "smollm2", result)) == {
        "num_output_tokens": uint32(2)}
    request.outputs.add(name="text_output")
    assert outputs_of(infer_response(decode_infer_request(request), "smollm2", result)) == {
        "text_output": serialize_bytes([(TEXT + "x").encode()]), "num_output_tokens": uint32(2)}


def test_mindies_text_interface_is_unchanged_without_control_tensors() -> None:
    call = decode_infer_request(text_request())
    assert call.vllm is None and call.streams
    result = InferResult(token_ids=(1,), text="x", finish_reason=FinishReason.LENGTH,
                         num_prompt_tokens=4, seed=9)
    assert outputs_of(infer_response(call, "smollm2", result)) == {
        "text_output": serialize_bytes([b"x"])}
