"""The gateway while its gRPC server is away: it answers 503 promptly, in each protocol's
shape, and serves again as soon as the server is back, without a restart of its own."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from conftest import own_service
from gateway_clients import MODEL, curl_with, poll

from switchboard.process import ServerProcess

PROMPT = {"text_input": "The capital of France is", "parameters": {"max_new_tokens": 3}}
PROMPT_ANSWER_S = 5.0  # a refusal while the server is away comes well within this
BACK_WITHIN_S = 10.0  # from the restarted server's ready line to the gateway serving again


@pytest.fixture
def server_and_gateway(pki) -> Iterator[tuple[ServerProcess, object]]:
    with own_service(pki.folder) as (server, gateway):
        yield server, gateway
        assert gateway.stop() == 0, gateway.log_text()


def test_the_gateway_refuses_while_the_server_is_away_and_serves_once_it_is_back(
        server_and_gateway, pki, client_files) -> None:
    server, gateway = server_and_gateway
    generate = f"{gateway.url('business')}/v2/models/{MODEL}/generate"
    assert curl_with(client_files, generate, body=PROMPT).status == 200
    port = server.address.rpartition(":")[2]
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(30)

    for path, body, keys in ((f"/v2/models/{MODEL}/generate", PROMPT, {"error"}),
                             ("/infer", {"inputs": "Hi"}, {"error", "error_type"}),
                             ("/v1/completions", {"prompt": "Hi"}, {"error"})):
        start = time.monotonic()
        reply = curl_with(client_files, gateway.url("business") + path, body=body)
        assert reply.status == 503, (path, reply.status, reply.body)
        assert set(reply.json()) == keys
        assert time.monotonic() - start < PROMPT_ANSWER_S

    restarted = ServerProcess("--tls-dir", str(pki.folder), "--grpc-port", port)
    try:
        restarted.wait_ready()
        reply, took_s = poll(lambda: curl_with(client_files, generate, body=PROMPT),
                             lambda reply: reply.status == 200, BACK_WITHIN_S, every_s=0.2)
        assert reply.status == 200, (took_s, reply.body, gateway.log_text())
        assert "Paris" in reply.json()["text_output"]
    finally:
        assert restarted.stop() == 0, restarted.log_text()
