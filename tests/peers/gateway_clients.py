"""Real HTTPS clients of the gateway, with mutual TLS: the `curl` binary, and the standard
library's http.client for requests that need to hold or drop a connection.

Standard library only (no `proto`, no `gateway`): modules under tests/peers share a pytest
process with tritonclient.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

MODEL = "smollm2"
REQUEST_TIMEOUT_S = 120
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CurlResult:
    exit_code: int
    status: int | None  # None: no HTTP response at all
    headers: dict[str, str]
    body: bytes
    stderr: str

    def json(self) -> object:
        return json.loads(self.body)

    def events(self) -> list[dict]:
        """The `data:` events of a Server-Sent Events body."""
        return [json.loads(line[len(b"data:"):]) for line in self.body.splitlines()
                if line.startswith(b"data:")]


def curl(url: str, ca: Path, cert: Path | None = None, key: Path | None = None, *,
         body: object = None, stream: bool = False) -> CurlResult:
    """GET `url`, or POST `body` (JSON-encoded unless already bytes/str)."""
    args = ["curl", "-sS", "-i", "--max-time", str(REQUEST_TIMEOUT_S), "--cacert", str(ca)]
    if cert is not None:
        args += ["--cert", str(cert), "--key", str(key)]
    if body is not None:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        args += ["-X", "POST", "-H", "Content-Type: application/json", "-H", "Expect:",
                 "--data-binary", "@-"]
    else:
        data = b""
    if stream:
        args.append("-N")
    ran = subprocess.run([*args, url], input=data.encode() if isinstance(data, str) else data,
                         capture_output=True, timeout=REQUEST_TIMEOUT_S + 30)
    head, _, payload = ran.stdout.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/"):
        return CurlResult(ran.returncode, None, {}, ran.stdout, ran.stderr.decode())
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in header_lines)}
    return CurlResult(ran.returncode, int(status_line.split()[1]), headers, payload,
                      ran.stderr.decode())


GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which("grpcurl")


def grpcurl(address: str, files, *args: str) -> subprocess.CompletedProcess[str]:
    """grpcurl with the client's certificate: options, then the method, called on `address`."""
    command = [GRPCURL, "-cacert", str(files.ca), "-cert", str(files.cert), "-key", str(files.key),
               *args[:-1], address, args[-1]]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def curl_with(files, url: str, **kwargs) -> CurlResult:
    """curl presenting `files` (a ClientFiles: ca, cert, key)."""
    return curl(url, files.ca, files.cert, files.key, **kwargs)


def ssl_context(files) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(str(files.cert), str(files.key))
    return context


def connect(base_url: str, files) -> http.client.HTTPSConnection:
    parts = urlsplit(base_url)
    return http.client.HTTPSConnection(parts.hostname, parts.port, context=ssl_context(files),
                                       timeout=REQUEST_TIMEOUT_S)


def fetch(base_url: str, files, path: str, body: object = None) -> tuple[int, bytes]:
    """One GET (or POST of `body`) on a fresh connection: (status, body bytes)."""
    connection = connect(base_url, files)
    try:
        if body is None:
            connection.request("GET", path)
        else:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            connection.request("POST", path, data, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def request(base_url: str, files, path: str, body: object = None) -> tuple[int, object]:
    """`fetch` with a JSON reply: (status, the decoded body or None)."""
    status, payload = fetch(base_url, files, path, body)
    return status, json.loads(payload) if payload else None


@dataclass(slots=True)
class OpenStream:
    """A /generate_stream reply being read, on a connection the test may drop."""

    connection: http.client.HTTPSConnection
    response: http.client.HTTPResponse

    def events(self) -> Iterator[dict]:
        for line in self.response:
            if line.startswith(b"data:"):
                yield json.loads(line[len(b"data:"):])

    def drop(self) -> None:
        """Close the TCP connection abruptly (RST), as a crashed client would."""
        sock = self.connection.sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.response.close()
        self.connection.close()


@contextlib.contextmanager
def open_stream(base_url: str, files, body: dict) -> Iterator[OpenStream]:
    connection = connect(base_url, files)
    try:
        connection.request("POST", f"/v2/models/{MODEL}/generate_stream", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        yield OpenStream(connection, response)
    finally:
        connection.close()


def slot_count(gateway, files) -> dict:
    """MindIE's getSlotCount on the management plane: total_slots, free_slots, …"""
    status, reply = request(gateway.url("management"), files, f"/v2/models/{MODEL}/getSlotCount")
    assert status == 200, reply
    return reply


def long_generation(request_id: str) -> dict:
    """A greedy request that runs 200 tokens unless stopped."""
    return {"id": request_id, "text_input": "Write a long story about a dragon.",
            "parameters": {"max_new_tokens": 200, "ignore_eos": True, "do_sample": False}}


def unique_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def poll(probe: Callable[[], T], done: Callable[[T], bool], deadline_s: float,
         every_s: float = 0.05) -> tuple[T, float]:
    """Call `probe` every `every_s` until `done(value)` or the deadline; returns the last
    value and the seconds it took (over `deadline_s` when it never got there)."""
    start = time.monotonic()
    while True:
        value = probe()
        elapsed = time.monotonic() - start
        if done(value) or elapsed > deadline_s:
            return value, elapsed
        time.sleep(every_s)
