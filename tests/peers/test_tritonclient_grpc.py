"""Triton's own gRPC client against a real server process, over mutual TLS, with the real model.

Runs in its own pytest process (see the Makefile): tritonclient's generated modules and ours
define the same `inference.*` protobuf symbols.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "smollm2"
# MindIE's token-inference example request (its Triton token interface documentation).
MINDIE_TOKEN_IDS = [396, 319, 13996, 29877, 29901, 29907, 3333, 20718, 316, 23924]
STREAM_TIMEOUT_S = 120
# Triton's vLLM backend's optional inputs (its model.py).
VLLM_CONTROL_INPUTS = {"stream": "BOOL", "exclude_input_in_output": "BOOL",
                       "sampling_parameters": "BYTES", "return_finish_reason": "BOOL",
                       "return_num_input_tokens": "BOOL", "return_num_output_tokens": "BOOL"}


def make_client(address: str, files) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(address, ssl=True, root_certificates=str(files.ca),
                                            private_key=str(files.key),
                                            certificate_chain=str(files.cert))


@pytest.fixture(scope="module")
def client(grpc_server, client_files) -> Iterator[grpcclient.InferenceServerClient]:
    with make_client(grpc_server.address, client_files) as triton:
        yield triton


def text_input(text: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    return tensor


def token_input(token_ids: list[int]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("input0", [len(token_ids)], "UINT32")
    tensor.set_data_from_numpy(np.array(token_ids, dtype=np.uint32))
    return tensor


def generate_text(client: grpcclient.InferenceServerClient, prompt: str, **parameters) -> str:
    result = client.infer(MODEL, [text_input(prompt)], parameters=parameters)
    return result.as_numpy("text_output")[0].decode()


def test_health_and_metadata(client) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(MODEL)
    assert not client.is_model_ready("no-such-model")  # Triton's answer, not an error
    assert client.get_server_metadata().name == "switchboard"
    metadata = client.get_model_metadata(MODEL)
    assert {t.name: t.datatype for t in metadata.inputs} == {
        "input0": "UINT32", "text_input": "BYTES", **VLLM_CONTROL_INPUTS}
    assert {t.name: t.datatype for t in metadata.outputs} == {
        "output0": "UINT32", "text_output": "BYTES", "finish_reason": "BYTES",
        "num_input_tokens": "UINT32", "num_output_tokens": "UINT32"}
    config = client.get_model_config(MODEL).config
    assert config.name == MODEL
    assert config.model_transaction_policy.decoupled


def test_inference_statistics_count_the_answered_requests(client) -> None:
    def model_stats(name: str = ""):
        (stats,) = client.get_inference_statistics(name).model_stats
        return stats

    before = model_stats(MODEL)
    generate_text(client, "Hello", max_new_tokens=2)
    after = model_stats()  # no name: every model's, this one's
    assert after.name == MODEL and after.version == "1"
    assert after.inference_count == before.inference_count + 1
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_stats.success.ns > before.inference_stats.success.ns
    assert after.inference_stats.queue.count == after.inference_stats.success.count
    assert after.execution_count >= before.execution_count + 2  # the prompt, then a token
    assert abs(after.last_inference / 1000 - time.time()) < 60
    with pytest.raises(InferenceServerException) as raised:
        client.get_inference_statistics("no-such-model")
    assert raised.value.status() == "StatusCode.NOT_FOUND"


def test_unknown_model_is_not_found(client) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata("no-such-model")
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert "no-such-model" in raised.value.message()


def test_token_inference_with_mindie_example(client) -> None:
    result = client.infer(MODEL, [token_input(MINDIE_TOKEN_IDS)], parameters={"max_new_tokens": 20})
    output = result.as_numpy("output0")
    assert output.dtype == np.uint32
    assert output.ndim == 2 and output.shape[0] == 1
    assert 1 <= output.shape[1] <= 20
    parameters = result.get_response().parameters
    assert parameters["generated_tokens"].int64_param == output.shape[1]
    assert parameters["finish_reason"].string_param in ("length", "eos_token")


def test_greedy_text_inference_knows_the_capital_of_france(client) -> None:
    result = client.infer(MODEL, [text_input("The capital of France is")],
                          parameters={"do_sample": False})
    assert "Paris" in result.as_numpy("text_output")[0].decode()
    assert result.get_response().parameters["finish_reason"].string_param == "length"


def test_seeded_sampling_is_reproducible(client) -> None:
    parameters = {"do_sample": True, "temperature": 0.9, "top_p": 0.95, "seed": 1234,
                  "max_new_tokens": 16}
    first = generate_text(client, "Once upon a time", **parameters)
    assert generate_text(client, "Once upon a time", **parameters) == first


def stream(address: str, files, requests: list[dict]) -> list:
    """Send requests on one ModelStreamInfer stream; collect results (or errors) until every
    request has its final response or error."""
    received: queue.Queue = queue.Queue()
    with make_client(address, files) as triton:
        triton.start_stream(callback=lambda result, error: received.put(error or result))
        for request in requests:
            triton.async_stream_infer(MODEL, **request)
        responses = []
        open_requests = len(requests)
        while open_requests:
            item = received.get(timeout=STREAM_TIMEOUT_S)
            responses.append(item)
            final = isinstance(item, InferenceServerException) or \
                item.get_response().parameters["triton_final_response"].bool_param
            open_requests -= final
        triton.stop_stream()
    return responses


def test_stream_sends_one_response_per_token_and_matches_unary(grpc_server, client_files,
                                                               client) -> None:
    parameters = {"do_sample": False, "max_new_tokens": 24}
    prompt = "Write one sentence about the sea."
    responses = stream(grpc_server.address, client_files,
                       [{"inputs": [text_input(prompt)], "parameters": parameters,
                         "request_id": "s1"}])
    final = responses[-1].get_response()
    assert final.parameters["triton_final_response"].bool_param
    assert not any(r.get_response().parameters["triton_final_response"].bool_param
                   for r in responses[:-1])
    assert len(responses) == final.parameters["generated_tokens"].int64_param
    assert all(r.get_response().id == "s1" for r in responses)
    streamed = "".join(r.as_numpy("text_output")[0].decode() for r in responses)
    assert streamed == generate_text(client, prompt, **parameters)


def vllm_inputs(prompt: str, sampling: dict[str, str], **controls: bool
                ) -> list[grpcclient.InferInput]:
    """As the vLLM backend's sample client (samples/client.py) builds a request."""
    inputs = [text_input(prompt)]
    for name, value in controls.items():
        tensor = grpcclient.InferInput(name, [1], "BOOL")
        tensor.set_data_from_numpy(np.array([value], dtype=bool))
        inputs.append(tensor)
    parameters = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    parameters.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    return [*inputs, parameters]


def test_a_vllm_backend_client_is_served(grpc_server, client_files, client) -> None:
    """Triton's vLLM backend's interface: unstreamed, one response with the prompt and the
    text; streamed, the new text in parts; vLLM's parameter names, numbers as strings. As the
    backend's sample client, the first request sends its sampling parameters as request
    parameters too (its defaults there): the tensor's hold."""
    prompt = "The capital of France is"
    greedy = generate_text(client, prompt, do_sample=False, max_new_tokens=8)
    sampling = {"temperature": "0", "max_tokens": "8", "ignore_eos": "true"}
    [whole] = stream(grpc_server.address, client_files, [{
        "inputs": vllm_inputs(prompt, sampling, stream=False, return_finish_reason=True,
                              return_num_input_tokens=True, return_num_output_tokens=True),
        "parameters": {"temperature": "0.1", "top_p": "0.95", "max_tokens": "100"},
        "request_id": "whole"}])
    assert whole.as_numpy("text_output")[0].decode() == prompt + greedy
    assert whole.as_numpy("finish_reason")[0].decode() == "length"
    assert (whole.as_numpy("num_input_tokens")[0], whole.as_numpy("num_output_tokens")[0]) == \
        (5, 8)
    parts = stream(grpc_server.address, client_files, [{
        "inputs": vllm_inputs(prompt, sampling, stream=True, exclude_input_in_output=True),
        "request_id": "parts"}])
    assert len(parts) == 8
    assert "".join(part.as_numpy("text_output")[0].decode() for part in parts) == greedy
    [refused] = stream(grpc_server.address, client_files, [{
        "inputs": vllm_inputs(prompt, {"top_p": "1.5"}), "request_id": "bad"}])
    assert isinstance(refused, InferenceServerException) and "top_p" in refused.message()


def test_stream_reports_a_bad_request_in_band_and_serves_the_next(grpc_server, client_files) -> None:
    responses = stream(grpc_server.address, client_files, [
        {"inputs": [text_input("Hello")], "parameters": {"top_p": 1.5}, "request_id": "bad"},
        {"inputs": [token_input([504, 3575, 282])], "parameters": {"max_new_tokens": 3},
         "request_id": "good"},
    ])
    errors = [r for r in responses if isinstance(r, InferenceServerException)]
    assert len(errors) == 1 and "top_p" in errors[0].message()
    results = [r for r in responses if not isinstance(r, InferenceServerException)]
    assert len(results) == 3
    assert sum(len(r.as_numpy("output0")[0]) for r in results) == 3


@pytest.mark.parametrize(("inputs", "parameters", "named"), [
    ([token_input([1, 49152])], {}, "input0"),
    ([text_input("Hello")], {"temperature": -0.5}, "temperature"),
    ([text_input("Hello")], {"top_k": -1}, "top_k"),
    ([text_input("Hello")], {"max_new_tokens": 0}, "max_new_tokens"),
    ([text_input("Hello")], {"tempreature": 0.5}, "tempreature"),
])
def test_invalid_request_names_the_field_and_the_server_carries_on(client, inputs, parameters,
                                                                   named) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, inputs, parameters=parameters)
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert named in raised.value.message()
    assert generate_text(client, "Hi", max_new_tokens=2)


def test_priority_outside_mindie_range_is_rejected(client) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, [text_input("Hi")], priority=9)
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "priority" in raised.value.message()
    assert client.infer(MODEL, [text_input("Hi")], priority=1, timeout=30_000_000,
                        parameters={"max_new_tokens": 2}).as_numpy("text_output") is not None


@pytest.mark.parametrize("who", ["no certificate", "another CA"])
def test_clients_without_a_trusted_certificate_are_refused(grpc_server, client_files,
                                                           foreign_client_files, who) -> None:
    if who == "no certificate":
        triton = grpcclient.InferenceServerClient(grpc_server.address, ssl=True,
                                                  root_certificates=str(client_files.ca))
    else:
        triton = make_client(grpc_server.address, foreign_client_files)
    with triton, pytest.raises(InferenceServerException) as raised:
        triton.is_server_live()
    assert raised.value.status() == "StatusCode.UNAVAILABLE"


def test_cancelling_the_stream_aborts_the_generation(grpc_server, client_files) -> None:
    received: queue.Queue = queue.Queue()
    with make_client(grpc_server.address, client_files) as triton:
        triton.start_stream(callback=lambda result, error: received.put(error or result))
        triton.async_stream_infer(MODEL, [text_input("Count to one thousand:")],
                                  parameters={"max_new_tokens": 500, "do_sample": False},
                                  request_id="cancelled")
        first = received.get(timeout=STREAM_TIMEOUT_S)
        assert not first.get_response().parameters["triton_final_response"].bool_param
        triton.stop_stream(cancel_requests=True)
    deadline = time.monotonic() + 30
    while not any("aborted" in line for line in list(grpc_server.log)):
        assert time.monotonic() < deadline, grpc_server.log_text()
        time.sleep(0.1)
    with make_client(grpc_server.address, client_files) as triton:
        assert generate_text(triton, "Hi", max_new_tokens=2)
