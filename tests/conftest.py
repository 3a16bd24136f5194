"""Fixtures shared by every test layer: TLS material in a temporary folder and a real server
process on a free port (port 0, the port read back from its "ready" line).

This module must not import `proto` or `server`: tests under tests/peers import tritonclient,
whose generated modules would collide with ours in protobuf's descriptor pool.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tls import DevPKIPaths, create_ca, issue_certificate, write_dev_pki

READY_LINE = re.compile(r"ready: serving model '(?P<model>[^']+)' over gRPC on (?P<host>\S+):(?P<port>\d+)")
# The first start on a fresh machine converts the GGUF model once (~30 s on 2 cores).
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 30


@dataclass(frozen=True, slots=True)
class ClientFiles:
    """PEM files a client presents: the CA it trusts, its certificate and key."""

    ca: Path
    cert: Path
    key: Path


@dataclass(slots=True)
class ServerProcess:
    process: subprocess.Popen[str]
    log: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=400))
    address: str = ""
    model_name: str = ""

    def log_text(self) -> str:
        return "\n".join(self.log)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPKIPaths:
    return write_dev_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def client_files(pki: DevPKIPaths) -> ClientFiles:
    return ClientFiles(ca=pki.ca_cert, cert=pki.client_cert, key=pki.client_key)


@pytest.fixture(scope="session")
def foreign_client_files(pki: DevPKIPaths, tmp_path_factory: pytest.TempPathFactory) -> ClientFiles:
    """A client certificate signed by a CA the server does not trust."""
    folder = tmp_path_factory.mktemp("foreign")
    other_ca = create_ca("another CA")
    client = issue_certificate(other_ca, "intruder", kind="client", hosts=["intruder"])
    (folder / "client.pem").write_bytes(client.certificate_pem())
    (folder / "client.key.pem").write_bytes(client.private_key_pem())
    return ClientFiles(ca=pki.ca_cert, cert=folder / "client.pem", key=folder / "client.key.pem")


def start_server(*args: str) -> ServerProcess:
    """Start `switchboard serve` and wait for its ready line; raise with its log if it fails."""
    process = subprocess.Popen(
        [sys.executable, "-m", "server", "serve", "--grpc-port", "0", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    server = ServerProcess(process)
    ready = threading.Event()

    def drain() -> None:
        for line in process.stdout:
            server.log.append(line.rstrip())
            match = READY_LINE.search(line)
            if match:
                server.address = f"{match['host']}:{match['port']}"
                server.model_name = match["model"]
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(START_TIMEOUT_S) or not server.address:
        stop_server(server)
        raise RuntimeError(f"the server did not become ready:\n{server.log_text()}")
    return server


def stop_server(server: ServerProcess) -> int:
    server.process.send_signal(signal.SIGTERM)
    try:
        return server.process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait()


@pytest.fixture(scope="session")
def grpc_server(pki: DevPKIPaths) -> Iterator[ServerProcess]:
    server = start_server("--tls-dir", str(pki.folder))
    yield server
    assert stop_server(server) == 0, f"the server did not stop cleanly:\n{server.log_text()}"
