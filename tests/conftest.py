"""Fixtures shared by every test layer: TLS material in a temporary folder, a real server
process and a real gateway process in front of it, on free ports (port 0, the ports read back
from their "ready" lines).

This module must not load `proto`: tests under tests/peers import tritonclient, whose
generated modules would collide with ours in protobuf's descriptor pool (server.process
uses the standard library only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from switchboard.process import GatewayProcess, ServerProcess
from switchboard.tls import DevPKIPaths, create_ca, issue_certificate, write_dev_pki


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked onednn_bf16 runs where oneDNN multiplies bf16 on this CPU; an AVX2-only
    one (AMD's Zen 3) skips it, as a server there never takes that path."""
    if item.get_closest_marker("onednn_bf16") is not None:
        from switchboard.engine.measured_choice import onednn_multiplies_bf16

        if not onednn_multiplies_bf16():
            pytest.skip("oneDNN multiplies no bf16 on this CPU (it needs AVX-512 or "
                        "AVX-NE-CONVERT)")


def child_processes(pid: int, marker: bytes) -> list[int]:
    """The children of process `pid` whose command line holds `marker`."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError):
                if marker in Path(f"/proc/{child}/cmdline").read_bytes():
                    children.append(int(child))
    return children


@dataclass(frozen=True, slots=True)
class ClientFiles:
    """PEM files a client presents: the CA it trusts, its certificate and key."""

    ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPKIPaths:
    return write_dev_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def client_files(pki: DevPKIPaths) -> ClientFiles:
    return ClientFiles(ca=pki.ca_cert, cert=pki.client_cert, key=pki.client_key)


@pytest.fixture(scope="session")
def gateway_identity_files(pki: DevPKIPaths) -> ClientFiles:
    """The gateway's own client certificate: a management identity on the gRPC server."""
    return ClientFiles(ca=pki.ca_cert, cert=pki.gateway_cert, key=pki.gateway_key)


@pytest.fixture(scope="session")
def foreign_client_files(pki: DevPKIPaths, tmp_path_factory: pytest.TempPathFactory) -> ClientFiles:
    """A client certificate signed by a CA the server does not trust."""
    folder = tmp_path_factory.mktemp("foreign")
    other_ca = create_ca("another CA")
    client = issue_certificate(other_ca, "intruder", kind="client", hosts=["intruder"])
    (folder / "client.pem").write_bytes(client.certificate_pem())
    (folder / "client.key.pem").write_bytes(client.private_key_pem())
    return ClientFiles(ca=pki.ca_cert, cert=folder / "client.pem", key=folder / "client.key.pem")


@pytest.fixture(scope="session")
def grpc_server(pki: DevPKIPaths) -> Iterator[ServerProcess]:
    server = ServerProcess("--tls-dir", str(pki.folder))
    server.wait_ready()
    yield server
    assert server.stop() == 0, f"the server did not stop cleanly:\n{server.log_text()}"


def start_gateway(tls_dir: Path, upstream: str, *args: str) -> GatewayProcess:
    gateway = GatewayProcess("--tls-dir", str(tls_dir), "--upstream", upstream, "--http-port", "0",
                             "--management-port", "0", "--metrics-port", "0", *args)
    gateway.wait_ready()
    return gateway


@contextlib.contextmanager
def own_service(tls_dir: Path, *args: str, server_args: Sequence[str] = ()
                ) -> Iterator[tuple[ServerProcess, GatewayProcess]]:
    """A server and a gateway in front of it, of the caller's own: `args` go to both,
    `server_args` to the server alone. Both are stopped at the end; their `stop()` then
    gives their exit status."""
    server = ServerProcess("--tls-dir", str(tls_dir), *server_args, *args)
    try:
        server.wait_ready()
        gateway = start_gateway(tls_dir, server.address, *args)
        try:
            yield server, gateway
        finally:
            gateway.stop()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gateway(pki: DevPKIPaths, grpc_server: ServerProcess) -> Iterator[GatewayProcess]:
    """The gateway, mutual TLS on its three planes and on its upstream hop to `grpc_server`."""
    gateway = start_gateway(pki.folder, grpc_server.address)
    yield gateway
    assert gateway.stop() == 0, f"the gateway did not stop cleanly:\n{gateway.log_text()}"
