"""Mutual TLS on both of the gateway's hops, with the real curl binary: no certificate or one
from another CA fails the handshake; a gateway that cannot verify its upstream answers 503."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import start_gateway
from gateway_clients import MODEL, curl, curl_with

from switchboard.tls import DevPKIPaths, write_dev_pki

PLANES = ("business", "management", "metrics")
PLANE_PATHS = {"business": f"/v2/models/{MODEL}/ready", "management": "/v2/health/live",
               "metrics": "/metrics"}


# curl's exit codes for a TLS session the server ends: 35 handshake, 55 send, 56 receive
# (TLS 1.3 reports the server's "certificate required" alert on the first read or write).
TLS_REFUSED = {35, 55, 56}


def assert_handshake_refused(result) -> None:
    assert result.exit_code in TLS_REFUSED, (result.exit_code, result.stderr)
    assert result.status is None, f"got an HTTP answer: {result.status} {result.body!r}"


@pytest.mark.parametrize("plane", PLANES)
def test_the_real_client_certificate_is_accepted(gateway, client_files, plane) -> None:
    reply = curl_with(client_files, gateway.url(plane) + PLANE_PATHS[plane])
    assert (reply.exit_code, reply.status) == (0, 200), reply.stderr


@pytest.mark.parametrize("plane", PLANES)
def test_no_client_certificate_fails_the_handshake(gateway, client_files, plane) -> None:
    assert_handshake_refused(curl(gateway.url(plane) + PLANE_PATHS[plane], client_files.ca))


@pytest.mark.parametrize("plane", PLANES)
def test_a_client_certificate_from_another_ca_fails_the_handshake(gateway, foreign_client_files,
                                                                  plane) -> None:
    assert_handshake_refused(curl_with(foreign_client_files,
                                       gateway.url(plane) + PLANE_PATHS[plane]))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> DevPKIPaths:
    return write_dev_pki(tmp_path_factory.mktemp("other-pki"))


@pytest.fixture(scope="module")
def misconfigured_gateway(other_pki, grpc_server) -> Iterator:
    """A gateway whose TLS folder is another CA's: it cannot verify the real server."""
    gateway = start_gateway(other_pki.folder, grpc_server.address)
    yield gateway
    assert gateway.stop() == 0, gateway.log_text()


def test_gateway_refuses_an_upstream_not_signed_by_its_ca(misconfigured_gateway,
                                                          other_pki) -> None:
    def other_client(path: str, **kwargs):
        return curl(misconfigured_gateway.url("business") + path, other_pki.ca_cert,
                    other_pki.client_cert, other_pki.client_key, **kwargs)

    reply = other_client(f"/v2/models/{MODEL}/generate",
                         body={"text_input": "Hi", "parameters": {"max_new_tokens": 1}})
    assert reply.status == 503, (reply.body, misconfigured_gateway.log_text())
    assert isinstance(reply.json()["error"], str)
    ready = other_client("/v2/health/ready")
    assert ready.status is not None and ready.status != 200


@pytest.fixture(scope="module")
def small_body_gateway(pki, grpc_server) -> Iterator:
    """A gateway with a 1 KiB body limit, server-only TLS on its management plane and plain
    HTTP on its loopback metrics plane."""
    gateway = start_gateway(pki.folder, grpc_server.address, "--max-body-bytes", "1024",
                            "--management-tls", "server", "--metrics-tls", "none")
    yield gateway
    assert gateway.stop() == 0, gateway.log_text()


def test_a_body_over_the_limit_gets_413_and_the_next_request_is_served(small_body_gateway,
                                                                        client_files) -> None:
    url = f"{small_body_gateway.url('business')}/v2/models/{MODEL}/generate"
    too_big = curl_with(client_files, url, body={"text_input": "x" * 2000})
    assert too_big.status == 413, too_big.body
    assert "limit" in too_big.json()["error"]
    fine = curl_with(client_files, url, body={"text_input": "Hi", "parameters": {"max_new_tokens": 2}})
    assert fine.status == 200, fine.body


def test_a_plane_may_serve_plain_http_on_loopback(small_body_gateway, client_files) -> None:
    metrics = small_body_gateway.url("metrics")
    assert metrics.startswith("http://")
    result = curl(f"{metrics}/metrics", ca=client_files.ca)
    assert result.status == 200 and b"switchboard_http_requests_total" in result.body


def test_a_probe_without_a_certificate_reaches_management_but_not_inference(
        small_body_gateway, client_files) -> None:
    """Kubernetes' probe on a server-TLS management plane; the business plane stays mutual."""
    probe = curl(small_body_gateway.url("management") + "/health/timed-5", ca=client_files.ca)
    assert (probe.status, probe.json()) == (200, {"status": "healthy"}), probe.stderr
    assert_handshake_refused(curl(small_body_gateway.url("business") + "/infer", client_files.ca,
                                  body={"inputs": "Hi", "parameters": {"max_new_tokens": 1}}))
