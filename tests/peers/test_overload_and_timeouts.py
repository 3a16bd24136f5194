"""A server that can hold one request at a time (maxBatchSize 1, maxQueueLen 0): one more is
refused at once in each protocol's terms (TGI 429, 503 elsewhere, gRPC RESOURCE_EXHAUSTED),
and a request whose `timeout` passes ends with 504 and frees its slot; the server serves the
next request normally after either."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import own_service
from gateway_clients import (MODEL, curl_with, long_generation, open_stream, poll, slot_count,
                             unique_id)
from tritonclient.utils import InferenceServerException

from switchboard.process import GatewayProcess, ServerProcess

FREED_WITHIN_S = 2.0  # the engine frees a timed-out request within a step
REFUSED = (
    ("/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}, 429, "overloaded"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, 503, None),
    ("/generate", {"prompt": "Hi", "max_tokens": 2}, 503, None),
    ("/infer", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}, 503, "Service Unavailable"),
    (f"/v2/models/{MODEL}/generate", {"text_input": "Hi", "parameters": {"max_new_tokens": 2}},
     503, None),
)


@pytest.fixture(scope="module")
def single_slot(pki, tmp_path_factory) -> Iterator[tuple[ServerProcess, GatewayProcess]]:
    config = tmp_path_factory.mktemp("single-slot") / "config.json"
    config.write_text(json.dumps({"maxBatchSize": 1, "maxQueueLen": 0}))
    with own_service(pki.folder, server_args=("--config", str(config))) as (server, gateway):
        yield server, gateway
        assert gateway.stop() == 0, gateway.log_text()
        assert server.stop() == 0, server.log_text()


def test_a_request_over_the_limit_is_refused_in_each_protocols_terms(single_slot, pki,
                                                                      client_files) -> None:
    server, gateway = single_slot
    business = gateway.url("business")
    with open_stream(business, client_files, long_generation(unique_id("hold"))) as stream:
        next(stream.events())  # the one slot is taken
        for path, body, status, error_type in REFUSED:
            reply = curl_with(client_files, business + path, body=body)
            assert reply.status == status, (path, reply.body)
            error = reply.json()["error"]
            assert error if error_type is None else reply.json()["error_type"] == error_type
        client = grpcclient.InferenceServerClient(
            server.address, ssl=True, root_certificates=str(pki.ca_cert),
            private_key=str(pki.client_key), certificate_chain=str(pki.client_cert))
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"Hi"], dtype=object))
        with pytest.raises(InferenceServerException) as refused:
            client.infer(MODEL, [text], parameters={"max_new_tokens": 2})
        assert "RESOURCE_EXHAUSTED" in str(refused.value.status())
        stream.drop()
    served = curl_with(client_files, f"{business}/v2/models/{MODEL}/generate",
                       body={"text_input": "The capital of France is",
                             "parameters": {"max_new_tokens": 3, "do_sample": False}})
    assert served.status == 200 and "Paris" in served.json()["text_output"], served.body


def test_a_request_past_its_timeout_gets_504_and_frees_its_slot(single_slot,
                                                                client_files) -> None:
    _, gateway = single_slot
    business = gateway.url("business")
    reply = curl_with(client_files, f"{business}/infer", body={
        "inputs": "Write a long story.",
        "parameters": {"max_new_tokens": 500, "ignore_eos": True, "timeout": 1}})
    assert reply.status == 504, reply.body
    # The server's own error, not grpc's "Deadline Exceeded" from the gateway's call.
    assert reply.json()["error"].startswith("request timed out"), reply.body
    assert reply.json()["error_type"]
    slots, _ = poll(lambda: slot_count(gateway, client_files),
                    lambda slots: slots["free_slots"] == 1, FREED_WITHIN_S)
    assert slots["free_slots"] == 1, slots
    served = curl_with(client_files, f"{business}/infer",
                       body={"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
    assert served.status == 200, served.body
