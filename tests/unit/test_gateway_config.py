"""Gateway configuration: the three planes' TLS rules and their SSL contexts, checked with
in-memory TLS handshakes (no sockets)."""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from switchboard.gateway.config import GatewayConfig, Plane, PlaneConfig, TLSMode, UpstreamConfig
from switchboard.proto.constants import MAX_MESSAGE_BYTES
from switchboard.tls import DevPKIPaths, TLSConfigError, TLSFiles


@pytest.fixture(scope="module")
def server_files(pki: DevPKIPaths) -> TLSFiles:
    return TLSFiles(pki.ca_cert, pki.server_cert, pki.server_key)


@pytest.fixture(scope="module")
def client_tls(pki: DevPKIPaths) -> TLSFiles:
    return TLSFiles(pki.ca_cert, pki.client_cert, pki.client_key)


def planes(server_files: TLSFiles, port: int = 1025) -> tuple[PlaneConfig, ...]:
    return tuple(PlaneConfig(plane, "0.0.0.0", port + offset, tls=server_files)
                 for offset, plane in enumerate(Plane))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.0.1", "::1", "localhost"])
def test_plain_http_is_allowed_on_loopback(host: str) -> None:
    plane = PlaneConfig(Plane.METRICS, host, 1027, TLSMode.NONE)
    assert (plane.scheme, plane.ssl_context()) == ("http", None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "metrics.example.com"])
def test_plain_http_is_refused_elsewhere(host: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        PlaneConfig(Plane.METRICS, host, 1027, TLSMode.NONE)


@pytest.mark.parametrize("mode", [TLSMode.MUTUAL, TLSMode.SERVER])
def test_tls_modes_need_files(mode: TLSMode) -> None:
    with pytest.raises(ValueError, match=f"business plane needs TLS files for {mode.value} TLS"):
        PlaneConfig(Plane.BUSINESS, "127.0.0.1", 1025, mode)


@pytest.mark.parametrize("port", [-1, 65536, True, "1025"])
def test_port_must_be_in_range(port: object, server_files: TLSFiles) -> None:
    with pytest.raises(ValueError, match="port must be in"):
        PlaneConfig(Plane.BUSINESS, "0.0.0.0", port, tls=server_files)  # type: ignore[arg-type]


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    """Run a TLS handshake through memory BIOs; raises the SSLError of whichever side fails."""
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    server_end = server.wrap_bio(pipes[0], pipes[1], server_side=True)
    client_end = client.wrap_bio(pipes[2], pipes[3], server_hostname="localhost")
    pending = [client_end, server_end]
    for _ in range(10):
        for end in list(pending):
            try:
                end.do_handshake()
                pending.remove(end)
            except ssl.SSLWantReadError:
                pass
        pipes[0].write(pipes[3].read())
        pipes[2].write(pipes[1].read())
        if not pending:
            # TLS 1.3 reports a refused client certificate on the client's first read.
            client_end.write(b"ping")
            pipes[0].write(pipes[3].read())
            assert server_end.read(4) == b"ping"
            return
    raise AssertionError("the handshake did not finish")


def client_context(pki: DevPKIPaths, with_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    if with_certificate:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


def test_mutual_mode_requires_a_client_certificate(pki: DevPKIPaths,
                                                   server_files: TLSFiles) -> None:
    context = PlaneConfig(Plane.BUSINESS, "0.0.0.0", 1025, tls=server_files).ssl_context()
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    handshake(context, client_context(pki, with_certificate=True))
    with pytest.raises(ssl.SSLError):
        handshake(context, client_context(pki, with_certificate=False))


def test_server_mode_encrypts_without_a_client_certificate(pki: DevPKIPaths,
                                                           server_files: TLSFiles) -> None:
    plane = PlaneConfig(Plane.MANAGEMENT, "0.0.0.0", 1026, TLSMode.SERVER, server_files)
    context = plane.ssl_context()
    assert plane.scheme == "https" and context.verify_mode is ssl.CERT_NONE
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    handshake(context, client_context(pki, with_certificate=False))


def test_gateway_config_needs_each_plane_once(server_files: TLSFiles) -> None:
    config = GatewayConfig(planes(server_files), UpstreamConfig())
    assert config.plane(Plane.METRICS).port == 1027
    business, management, _ = planes(server_files)
    for bad in [(business, management), (business, management, business)]:
        with pytest.raises(ValueError, match="exactly one business, management and metrics"):
            GatewayConfig(bad, UpstreamConfig())
    for limit in ("max_body_bytes", "max_connections", "client_timeout_s", "max_header_bytes",
                  "max_client_connections"):
        with pytest.raises(ValueError, match=limit):
            GatewayConfig(planes(server_files), UpstreamConfig(), **{limit: 0})


def test_one_client_address_holds_as_many_connections_as_max_links_unless_told(
        server_files: TLSFiles) -> None:
    config = GatewayConfig(planes(server_files), UpstreamConfig(), max_connections=40)
    assert config.connections_per_client == 40
    config = GatewayConfig(planes(server_files), UpstreamConfig(), max_connections=40,
                           max_client_connections=120)
    assert config.connections_per_client == 120


def test_a_body_limit_past_what_the_server_takes_as_a_message_is_refused(
        server_files: TLSFiles) -> None:
    """A body becomes a gRPC message of up to twice its size: one the server would refuse as
    RESOURCE_EXHAUSTED, which clients read as an overload."""
    assert GatewayConfig(planes(server_files), UpstreamConfig()).max_body_bytes == \
        MAX_MESSAGE_BYTES // 2
    with pytest.raises(ValueError, match="max_body_bytes must be at most"):
        GatewayConfig(planes(server_files), UpstreamConfig(),
                      max_body_bytes=MAX_MESSAGE_BYTES // 2 + 1)


def test_planes_may_share_a_port_only_with_the_same_tls(server_files: TLSFiles,
                                                        client_tls: TLSFiles) -> None:
    business, management, metrics = planes(server_files)
    shared = replace(management, port=1025)
    GatewayConfig((business, shared, metrics), UpstreamConfig())
    for other in [replace(shared, tls_mode=TLSMode.SERVER), replace(shared, tls=client_tls)]:
        with pytest.raises(ValueError, match="share 0.0.0.0:1025 but not their TLS settings"):
            GatewayConfig((business, other, metrics), UpstreamConfig())
    # Port 0 asks for a fresh port each, so nothing is shared.
    GatewayConfig(tuple(replace(plane, port=0) for plane in (business, shared,
                  replace(metrics, tls_mode=TLSMode.SERVER))), UpstreamConfig())


def test_upstream_credentials(client_tls: TLSFiles, pki: DevPKIPaths) -> None:
    assert UpstreamConfig().credentials() is None
    assert isinstance(UpstreamConfig(tls=client_tls).credentials(), grpc.ChannelCredentials)
    mismatched = TLSFiles(pki.ca_cert, pki.client_cert, pki.server_key)
    with pytest.raises(TLSConfigError, match="does not match"):
        UpstreamConfig(tls=mismatched).credentials()


@pytest.mark.parametrize("hard", [None, 512], ids=["hard-limit-allows", "hard-limit-short"])
def test_the_gateway_raises_its_open_files_limit_for_the_connections_it_may_hold(
        hard: int | None) -> None:
    """In a process of its own: the limits are the process's."""
    script = (
        "import logging, resource\n"
        "from gateway.app import _allow_open_files\n"
        "logging.basicConfig()\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        f"hard = {hard} or hard\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "_allow_open_files(1000)\n"
        "print(*resource.getrlimit(resource.RLIMIT_NOFILE))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    soft, hard_now = map(int, result.stdout.split())
    assert soft == min(1000, hard_now)
    assert ("open files are limited to 512" in result.stderr) is (hard == 512)


@pytest.mark.parametrize("target", ["127.0.0.1:8001", "localhost:8001", "[::1]:8001"])
def test_an_upstream_is_host_and_port(target: str) -> None:
    assert UpstreamConfig(target=target).target == target


@pytest.mark.parametrize("target", ["8001", "127.0.0.1", ":8001", "127.0.0.1:0",
                                    "127.0.0.1:65536", "127.0.0.1:port",
                                    "https://127.0.0.1:8001"])
def test_an_upstream_that_is_not_host_and_port_is_refused(target: str) -> None:
    """It used to be accepted, and every request then failed with 503."""
    with pytest.raises(ValueError, match=re.escape(f"upstream must be the gRPC server's "
                                                   f"HOST:PORT (no scheme, a port in "
                                                   f"[1, 65535]); got {target!r}")):
        UpstreamConfig(target=target)
