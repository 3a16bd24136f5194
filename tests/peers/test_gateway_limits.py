"""The gateway's limits against crowds and misbehaving clients: as MindIE's maxLinkNum
(`--max-connections`) N, N inference requests run at once and the next wait their turn, one
connection over 3 × N gets 503 while the others are served, a client that sends its request
one byte per second is cut off after `--client-timeout`, headers over `--max-header-bytes`
end the connection, and a client that leaves, even halfway through sending its body, gives
back its turn and is counted as 499, not as a server error; the gateway serves everyone else
throughout."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from urllib.parse import urlsplit

import pytest
from conftest import start_gateway
from gateway_clients import (MODEL, fetch, long_generation, open_stream, poll, request,
                             ssl_context, unique_id)

MAX_LINKS = 1  # maxLinkNum: one inference request at a time, two more connections queue
MAX_CONNECTIONS = 3 * MAX_LINKS
CLIENT_TIMEOUT_S = 5  # generous: a loaded 2-core machine must still finish a handshake within it
MAX_HEADER_BYTES = 4096
READY = f"/v2/models/{MODEL}/ready"


@pytest.fixture(scope="module")
def limited_gateway(pki, grpc_server) -> Iterator:
    # Every test client comes from one address: the whole plane's connections may be its.
    gateway = start_gateway(pki.folder, grpc_server.address,
                            "--max-client-connections", str(MAX_CONNECTIONS),
                            "--max-connections", str(MAX_LINKS),
                            "--client-timeout", str(CLIENT_TIMEOUT_S),
                            "--max-header-bytes", str(MAX_HEADER_BYTES))
    yield gateway
    assert gateway.stop() == 0, gateway.log_text()


def tls_socket(base_url: str, client_files) -> ssl.SSLSocket:
    parts = urlsplit(base_url)
    raw = socket.create_connection((parts.hostname, parts.port), timeout=30)
    return ssl_context(client_files).wrap_socket(raw, server_hostname=parts.hostname)


def read_all(connection: ssl.SSLSocket) -> bytes:
    """Everything until the server closes the connection."""
    chunks = []
    while chunk := connection.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_one_connection_over_the_limit_gets_503_and_the_others_are_served(
        limited_gateway, client_files) -> None:
    business = limited_gateway.url("business")
    with ExitStack() as stack:
        held = [stack.enter_context(tls_socket(business, client_files))
                for _ in range(MAX_CONNECTIONS)]
        refused = read_all(stack.enter_context(tls_socket(business, client_files)))
        assert refused.startswith(b"HTTP/1.1 503 "), refused
        assert b"too many connections" in refused
        held[0].sendall(f"GET {READY} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert read_all(held[0]).startswith(b"HTTP/1.1 200 ")
    # The gateway learns that the held connections closed when it reads their end, which on a
    # loaded machine may come after the next connection arrives: one arriving at once may still
    # find them counted and get 503; one a moment later is served.
    status, _ = poll(lambda: fetch(business, client_files, READY)[0], lambda code: code == 200,
                     deadline_s=CLIENT_TIMEOUT_S)
    assert status == 200


def test_a_client_sending_one_byte_per_second_is_cut_off(limited_gateway, client_files) -> None:
    request = f"GET {READY} HTTP/1.1\r\nHost: x\r\nX-Slow: {'a' * 60}\r\n\r\n".encode()
    start = time.monotonic()
    with tls_socket(limited_gateway.url("business"), client_files) as connection:
        with pytest.raises((BrokenPipeError, ConnectionResetError, ssl.SSLError)):
            for byte in request:
                connection.sendall(bytes([byte]))
                time.sleep(1)  # the slow client under test
            if not connection.recv(1):
                raise ConnectionResetError("closed by the gateway")
    assert time.monotonic() - start < CLIENT_TIMEOUT_S + 5
    assert fetch(limited_gateway.url("business"), client_files, READY)[0] == 200


def test_headers_over_the_limit_end_the_connection(limited_gateway, client_files) -> None:
    request = (f"GET {READY} HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * MAX_HEADER_BYTES}\r\n\r\n")
    with tls_socket(limited_gateway.url("business"), client_files) as connection:
        connection.sendall(request.encode())
        assert not read_all(connection).startswith(b"HTTP/1.1 200 ")
    assert fetch(limited_gateway.url("business"), client_files, READY)[0] == 200


def test_inference_requests_over_max_links_wait_their_turn_instead_of_failing(
        limited_gateway, client_files) -> None:
    business = limited_gateway.url("business")
    first = long_generation(unique_id("first"))
    first["parameters"]["max_new_tokens"] = 40
    with open_stream(business, client_files, first) as stream:
        events = stream.events()
        next(events)
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(lambda: (*request(
                business, client_files, f"/v2/models/{MODEL}/generate",
                {"text_input": "Hi", "parameters": {"max_new_tokens": 2}}), time.monotonic()))
            rest = list(events)
            first_ended_at = time.monotonic()
            status, reply, second_answered_at = second.result(timeout=120)
    assert rest[-1]["details"]["finish_reason"] == "length"
    assert status == 200 and reply["text_output"], reply
    assert second_answered_at >= first_ended_at - 0.05  # after the first, not alongside


def scrape(gateway, client_files) -> str:
    status, text = fetch(gateway.url("metrics"), client_files, "/metrics")
    assert status == 200
    return text.decode()


def in_flight(gateway, client_files) -> float:
    return float(re.search(r"^switchboard_http_inference_requests_in_flight (\S+)$",
                           scrape(gateway, client_files), re.MULTILINE).group(1))


def closed_requests(gateway, client_files) -> float:
    """How many requests the gateway counted as closed by their client (499)."""
    return sum(float(value) for value in re.findall(
        r'^switchboard_http_requests_total\{[^}]*code="499"[^}]*\} (\S+)$',
        scrape(gateway, client_files), re.MULTILINE))


def leave_after_sending(gateway, client_files, head: bytes, body: bytes) -> None:
    """Send a request, wait until the gateway counts it in flight, then close the connection."""
    with tls_socket(gateway.url("business"), client_files) as connection:
        connection.sendall(head + body)
        count, _ = poll(lambda: in_flight(gateway, client_files), lambda n: n == 1,
                        deadline_s=30)
        assert count == 1
    count, _ = poll(lambda: in_flight(gateway, client_files), lambda n: n == 0, deadline_s=30)
    assert count == 0, "the request that left still counts as in flight"


def generate_head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def test_a_client_that_leaves_while_sending_its_body_gives_back_its_turn(
        limited_gateway, client_files) -> None:
    """Tornado never finishes a request whose body stops arriving: its turn (the only one
    here) must come back when the connection closes, or every later inference request waits
    for ever and a graceful stop never ends."""
    leave_after_sending(limited_gateway, client_files,
                        generate_head(f"/v2/models/{MODEL}/generate", 100), b'{"text_input"')
    status, reply = request(limited_gateway.url("business"), client_files,
                            f"/v2/models/{MODEL}/generate",
                            {"text_input": "Hi", "parameters": {"max_new_tokens": 2}})
    assert status == 200, reply


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_a_client_that_leaves_before_its_answer_counts_as_499_without_a_traceback(
        limited_gateway, client_files, route: str) -> None:
    before = closed_requests(limited_gateway, client_files)
    body = json.dumps(long_generation(unique_id("left"))).encode()
    leave_after_sending(limited_gateway, client_files,
                        generate_head(f"/v2/models/{MODEL}/{route}", len(body)), body)
    count, _ = poll(lambda: closed_requests(limited_gateway, client_files),
                    lambda n: n == before + 1, deadline_s=30)
    assert count == before + 1
    log = limited_gateway.log_text()
    assert "Uncaught exception" not in log and "Traceback" not in log, log


# Slow bodies: 1,000 POSTs that send their headers and one byte of their body, the most one
# client address may hold open with MindIE's default maxLinkNum (1,000), as many as the
# requests forwarded at once.
NUM_SLOW_POSTS = 1000
CANARY_ADDRESS = "127.0.0.2"  # another client, on another loopback address
CANARY_ROUNDS = 3


@pytest.fixture(scope="module")
def default_gateway(pki, grpc_server) -> Iterator:
    gateway = start_gateway(pki.folder, grpc_server.address)
    yield gateway
    assert gateway.stop() == 0, gateway.log_text()


def canary_seconds(gateway, client_files) -> float:
    """The median time of CANARY_ROUNDS small generations from CANARY_ADDRESS."""
    parts = urlsplit(gateway.url("business"))
    body = json.dumps({"text_input": "Hi", "parameters": {"max_new_tokens": 2}})
    times = []
    for _ in range(CANARY_ROUNDS):
        connection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=120,
                                                 context=ssl_context(client_files),
                                                 source_address=(CANARY_ADDRESS, 0))
        start = time.monotonic()
        try:
            connection.request("POST", f"/v2/models/{MODEL}/generate", body,
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200, response.read()
            response.read()
        finally:
            connection.close()
        times.append(time.monotonic() - start)
    return statistics.median(times)


def test_slow_bodies_hold_no_turn_and_one_address_holds_at_most_its_share(
        default_gateway, client_files) -> None:
    """Each slow POST took one of the maxLinkNum turns when its headers came: a canary waited
    for the client timeout (60 s). Now a request waits for its turn once its body is in, and
    one connection more from the slow client's address gets 503."""
    business = default_gateway.url("business")
    idle_s = canary_seconds(default_gateway, client_files)
    with ExitStack() as stack:
        for _ in range(NUM_SLOW_POSTS):
            connection = stack.enter_context(tls_socket(business, client_files))
            connection.sendall(generate_head(f"/v2/models/{MODEL}/generate", 1000) + b"{")
        count, _ = poll(lambda: in_flight(default_gateway, client_files),
                        lambda n: n == NUM_SLOW_POSTS, deadline_s=60)
        assert count == NUM_SLOW_POSTS
        one_more = read_all(stack.enter_context(tls_socket(business, client_files)))
        assert one_more.startswith(b"HTTP/1.1 503 "), one_more
        assert b"too many connections from your address: at most 1000 at once" in one_more
        attacked_s = canary_seconds(default_gateway, client_files)
    assert attacked_s <= 2 * idle_s, (idle_s, attacked_s)
