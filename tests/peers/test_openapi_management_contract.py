"""The management plane's OpenAPI contract, fuzzed with schemathesis against the real gateway
and server (mutual TLS), as test_openapi_contract fuzzes the business plane's.

Why a gateway of its own: /openapi.json lists the routes of the server that answers it, and the
session gateway serves each plane on a port of its own, each with its own document (which
test_openapi_contract checks). Here the business and management planes share one port (their
TLS settings are equal), so one server serves both and its document lists both planes' routes;
the metrics plane keeps a port of its own.

Every operation tagged with the management plane is fuzzed (routes both planes serve, such as
/health, included) with test_openapi_contract's narrowing, bounds, checks and MAX_EXAMPLES, each
as a pytest subtest, except /stopService, which would stop the gateway. /v1/role/{role} stays:
it answers a first assignment without peers 503, as MindIE does, and the document declares
it, so there (only) a 503 is no server error. Afterwards the gateway still answers and
generates.

Imports none of our packages at run time (see gateway_clients); their types are for checkers.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import requests
import schemathesis
from conftest import start_gateway
from gateway_clients import MODEL, REQUEST_TIMEOUT_S, request
from test_openapi_contract import fuzz, mutual_tls, narrowed

if TYPE_CHECKING:
    from conftest import ClientFiles
    from switchboard.process import GatewayProcess, ServerProcess
    from switchboard.tls import DevPKIPaths

# Ends the gateway (and the server behind it): never fuzzed.
STOP_SERVICE = "/stopService"
# MindIE's role assignment answers 503 to a first one without peers: by design, declared in
# the document, so not a server error there (its other statuses are checked as everywhere).
ROLE = "/v1/role/{role}"
ROLE_EXPECTED_STATUSES = ["2xx", "3xx", "4xx", "503"]


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick for port 0, released at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def shared_port_gateway(pki: DevPKIPaths,
                        grpc_server: ServerProcess) -> Iterator[GatewayProcess]:
    """A gateway whose business and management planes share one fixed port (so one server)."""
    port = str(free_port())
    # Later flags win over start_gateway's port 0.
    gateway = start_gateway(pki.folder, grpc_server.address,
                            "--http-port", port, "--management-port", port)
    yield gateway
    assert gateway.stop() == 0, f"the gateway did not stop cleanly:\n{gateway.log_text()}"


@pytest.fixture(scope="module")
def served_document(shared_port_gateway: GatewayProcess, client_files: ClientFiles) -> dict:
    response = requests.get(shared_port_gateway.url("business") + "/openapi.json",
                            **mutual_tls(client_files))
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json"
    return response.json()


@pytest.fixture(scope="module")
def management_operations(shared_port_gateway: GatewayProcess, client_files: ClientFiles,
                          served_document: dict) -> list[schemathesis.APIOperation]:
    """The operations of the served document, narrowed, that the management plane serves, but
    /stopService; /v1/role/{role}'s declared 503 is no server error."""
    status, metadata = request(shared_port_gateway.url("business"), client_files,
                               f"/v2/models/{MODEL}")
    assert status == 200, metadata
    config = schemathesis.Config.from_dict({
        "base-url": shared_port_gateway.url("management"), "tls-verify": str(client_files.ca),
        "request-cert": str(client_files.cert), "request-cert-key": str(client_files.key),
        "request-timeout": REQUEST_TIMEOUT_S,
        "operations": [{"include-path": ROLE, "checks": {
            "not_a_server_error": {"expected-statuses": ROLE_EXPECTED_STATUSES}}}]})
    api = schemathesis.openapi.from_dict(narrowed(served_document, metadata["versions"]),
                                         config=config)
    # Selected here: with an `operations` entry in its config, schemathesis (4.32) ignores
    # api.include(tag=...).
    return [operation for operation in (result.ok() for result in api.get_all_operations())
            if "management" in operation.tags and operation.path != STOP_SERVICE]


def test_the_planes_share_one_server(shared_port_gateway: GatewayProcess) -> None:
    assert shared_port_gateway.url("business") == shared_port_gateway.url("management")
    assert shared_port_gateway.url("metrics") != shared_port_gateway.url("management")


def test_the_document_lists_the_business_and_management_routes(served_document: dict) -> None:
    """Both planes' routes, each listed once and tagged with the plane(s) serving it; no
    metrics route (its plane has a server of its own)."""
    paths = served_document["paths"]
    assert {"/v2/models/{model}/generate", "/v1/chat/completions", "/infer",
            "/openapi.json"} <= set(paths)
    assert {"/v1/status", "/v1/config", ROLE, "/metrics-json", STOP_SERVICE,
            "/health/timed", "/health/timed-{seconds}",
            "/v2/models/{model}/getSlotCount"} <= set(paths)
    assert "/metrics" not in paths
    assert {"business", "management"} <= set(paths["/health"]["get"]["tags"])
    assert "business" not in paths["/v1/status"]["get"]["tags"]
    assert "management" not in paths["/v2/models/{model}/generate"]["post"]["tags"]


def test_the_role_route_declares_its_503(served_document: dict) -> None:
    """/v1/role/{role} answers a first assignment without peers 503, as MindIE does: the
    contract says so, so it is fuzzed."""
    assert "503" in served_document["paths"][ROLE]["post"]["responses"]


def test_every_management_operation_keeps_its_contract(
        management_operations: list[schemathesis.APIOperation],
        subtests: pytest.Subtests) -> None:
    labels = {operation.label for operation in management_operations}
    assert {"GET /v1/status", "GET /health", f"POST {ROLE}"} <= labels
    assert "POST /v2/models/{model}/generate" not in labels
    for operation in management_operations:
        with subtests.test(operation.label):
            fuzz(operation)


def test_the_server_is_healthy_after_the_fuzz(shared_port_gateway: GatewayProcess,
                                              client_files: ClientFiles) -> None:
    status, reply = request(shared_port_gateway.url("management"), client_files, "/v1/status")
    assert status == 200, reply
    status, reply = request(shared_port_gateway.url("business"), client_files,
                            f"/v2/models/{MODEL}/generate",
                            {"text_input": "The capital of France is",
                             "parameters": {"max_new_tokens": 4, "do_sample": False}})
    assert status == 200, reply
    assert reply["text_output"]
