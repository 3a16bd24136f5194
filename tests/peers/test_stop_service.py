"""The graceful stop, end to end: MindIE's /stopService on the management plane, and SIGTERM.
Streams in flight finish in full, new inference requests get 503, and both processes exit 0.

Each test stops its own server and gateway; streams are read on threads of their own.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest
from conftest import own_service
from gateway_clients import (MODEL, REQUEST_TIMEOUT_S, connect, curl_with, fetch, grpcurl,
                             long_generation, open_stream, poll, request, unique_id)

from switchboard.process import GatewayProcess, ServerProcess

TOKENS = 80  # long enough to outlast the checks made during the drain
FORCED_STOP_S = 5  # MindIE's /stopService?mode=Force kills its processes after 5 s
EXIT_TIMEOUT_S = 20  # from the end of the drain
# A stream the forced stop must cut off: far more tokens than one stream decodes in
# FORCED_STOP_S (a fast processor decoded 500 within it).
UNFINISHABLE_TOKENS = 4000
PROMPTS = ("Write a long story about a dragon.", "Describe the sea in detail.")
# A new request of each protocol family during the drain, and its error body's keys.
REFUSED = (
    ("/infer", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}, {"error", "error_type"}),
    ("/generate_stream", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}},
     {"error", "error_type"}),
    (f"/v2/models/{MODEL}/generate", {"text_input": "Hi", "parameters": {"max_new_tokens": 2}},
     {"error"}),
    # Refused before its body is read: in OpenAI's shape, whatever API the body is for.
    ("/invocations", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}, {"error"}),
)


@pytest.fixture
def service(pki) -> Iterator[tuple[ServerProcess, GatewayProcess]]:
    """A server and a gateway of this test's own (the test stops them)."""
    with own_service(pki.folder) as pair:
        yield pair


@pytest.fixture
def long_streams_service(pki, tmp_path) -> Iterator[tuple[ServerProcess, GatewayProcess]]:
    """A server and a gateway of this test's own that allow UNFINISHABLE_TOKENS a stream."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"maxIterTimes": UNFINISHABLE_TOKENS,
                                  "maxSeqLen": 2 * UNFINISHABLE_TOKENS}))
    with own_service(pki.folder, server_args=("--config", str(config))) as pair:
        yield pair


def in_thread(function: Callable[[], object]) -> Future:
    """Run `function` on a daemon thread; the Future holds its result or its exception."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(function())
        except BaseException as error:  # handed to the test by future.result()
            future.set_exception(error)

    threading.Thread(target=run, daemon=True).start()
    return future


class InferStream:
    """A streamed POST /infer of `tokens` tokens, read on a thread: its events, and an Event set
    by the first.

    held: the reader stops after the first event until this Event is set, then reads the rest
    without blocking: every event must by then be waiting on its socket (sent before whatever
    set the Event), else the read fails. An order checked on the wire, not between threads."""

    def __init__(self, gateway: GatewayProcess, client_files, prompt: str,
                 tokens: int = TOKENS, held: threading.Event | None = None) -> None:
        self.events: list[dict] = []
        self.first_event = threading.Event()
        self._held = held
        self.body = {"inputs": prompt, "stream": True, "parameters": {
            "max_new_tokens": tokens, "ignore_eos": True, "do_sample": False, "details": True}}
        self.done = in_thread(lambda: self._read(gateway.url("business"), client_files))

    def _read(self, url: str, client_files) -> None:
        connection = connect(url, client_files)
        try:
            connection.request("POST", "/infer", json.dumps(self.body),
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200, response.read()
            for line in response:
                if line.startswith(b"data:"):
                    event = json.loads(line[len(b"data:"):])
                    self.events.append(event)
                    self.first_event.set()
                    if event.get("generated_text") is not None:
                        break
                    if self._held is not None and len(self.events) == 1:
                        assert self._held.wait(REQUEST_TIMEOUT_S)
                        connection.sock.setblocking(False)
            else:
                raise AssertionError(f"the stream ended before its last event: {self.events[-1:]}")
        finally:
            connection.close()
            self.first_event.set()  # wake the test up on a failure too

    def assert_complete(self) -> None:
        self.done.result(timeout=REQUEST_TIMEOUT_S)
        *tokens, last = self.events
        assert all(event.get("generated_text") is None for event in tokens)
        assert last["details"]["finish_reason"] == "length"
        assert last["details"]["generated_tokens"] == len(self.events) == TOKENS
        assert last["generated_text"] == "".join(event["token"]["text"] for event in self.events)


def wait_until_stopping(gateway: GatewayProcess, client_files) -> None:
    """The stop has begun once the management plane's readiness probe answers 503."""
    status, _ = poll(lambda: fetch(gateway.url("management"), client_files, "/v2/health/ready")[0],
                     lambda status: status != 200, deadline_s=30)
    assert status == 503


def assert_exits_cleanly(*processes) -> None:
    for process in processes:
        assert process.wait_exit(EXIT_TIMEOUT_S) == 0, process.log_text()


def test_stop_service_drains_the_streams_then_both_processes_exit(service, client_files) -> None:
    server, gateway = service
    management = gateway.url("management")
    stop_answered = threading.Event()
    streams = [InferStream(gateway, client_files, prompt, held=stop_answered)
               for prompt in PROMPTS]
    for stream in streams:
        assert stream.first_event.wait(REQUEST_TIMEOUT_S) and stream.events, stream.done
    stop = in_thread(lambda: fetch(management, client_files, "/stopService"))
    wait_until_stopping(gateway, client_files)

    for path, body, keys in REFUSED:
        status, document = request(gateway.url("business"), client_files, path, body)
        assert status == 503 and set(document) == keys, (path, status, document)
        if path == "/infer":
            assert document["error_type"] == "Service Unavailable"
    again = request(management, client_files, "/stopService")
    assert again[0] == 500 and set(again[1]) == {"error", "error_type"}, again
    assert request(management, client_files, "/health/timed-5") == (200, {"status": "healthy"})
    assert fetch(management, client_files, f"/v2/models/{MODEL}/ready")[0] == 503
    assert fetch(gateway.url("business"), client_files, "/health", {})[0] == 405  # no inference
    for ping in (None, {}):  # SageMaker's probe: GET, and POST as vLLM takes it
        assert request(gateway.url("business"), client_files, "/ping", ping) == \
            (503, {"error": "unhealthy", "error_type": "healthcheck"})
    assert not stop.done(), "the drain ended too early to test"

    assert stop.result(timeout=REQUEST_TIMEOUT_S) == (200, b"")
    stop_answered.set()  # each stream's last event came before the answer: read at once
    for stream in streams:
        stream.assert_complete()
    assert_exits_cleanly(gateway, server)


def test_stop_service_goes_through_when_its_caller_gives_up(service, client_files) -> None:
    server, gateway = service
    stream = InferStream(gateway, client_files, PROMPTS[0])
    assert stream.first_event.wait(REQUEST_TIMEOUT_S) and stream.events, stream.done
    caller = connect(gateway.url("management"), client_files)
    caller.request("GET", "/stopService")
    wait_until_stopping(gateway, client_files)
    caller.close()  # an operator's client timing out
    stream.assert_complete()
    assert_exits_cleanly(gateway, server)


def test_a_forced_stop_answers_at_once_and_cuts_the_streams_off_within_seconds(
        long_streams_service, client_files) -> None:
    server, gateway = long_streams_service
    management = gateway.url("management")
    assert request(management, client_files, "/stopService?mode=Soon")[0] == 400
    stream = InferStream(gateway, client_files, PROMPTS[0], tokens=UNFINISHABLE_TOKENS)
    assert stream.first_event.wait(REQUEST_TIMEOUT_S) and stream.events, stream.done
    asked_at = time.monotonic()
    assert fetch(management, client_files, "/stopService?mode=Force")[:2] == (200, b"")
    assert time.monotonic() - asked_at < 2
    assert_exits_cleanly(gateway, server)
    assert time.monotonic() - asked_at < FORCED_STOP_S + EXIT_TIMEOUT_S
    stream.done.exception(timeout=REQUEST_TIMEOUT_S)  # the reader ended, however it did
    assert 0 < len(stream.events) < UNFINISHABLE_TOKENS
    assert all(event.get("generated_text") is None for event in stream.events)  # no last event


def test_sigterm_finishes_the_stream_in_flight_then_both_processes_exit(service,
                                                                       client_files) -> None:
    server, gateway = service
    body = long_generation(unique_id("sigterm"))
    body["parameters"] |= {"max_new_tokens": TOKENS, "details": True}
    with open_stream(gateway.url("business"), client_files, body) as stream:
        events = stream.events()
        first = next(events)
        gateway.terminate()
        server.terminate()
        wait_until_stopping(gateway, client_files)
        refused = curl_with(client_files, gateway.url("business") + "/infer",
                            body={"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
        assert refused.status == 503 or (refused.status is None and refused.exit_code == 7), \
            refused
        rest = list(events)
    assert rest and all("error" not in event for event in rest), rest[-1:]
    assert rest[-1]["details"]["finish_reason"] == "length"
    assert rest[-1]["details"]["generated_tokens"] == 1 + len(rest) == TOKENS
    assert all("finish_reason" not in event["details"] for event in [first, *rest[:-1]])
    assert_exits_cleanly(gateway, server)


def test_stop_service_on_grpc_is_denied_to_an_ordinary_client_certificate(
        grpc_server, gateway, client_files) -> None:
    """Only a management identity (the gateway's own certificate by default, which keeps
    /stopService working above) may stop the server; reading its state stays open."""
    for force in ("{}", '{"force": true}'):
        refused = grpcurl(grpc_server.address, client_files, "-d", force,
                          "switchboard.v1.Management/StopService")
        assert refused.returncode != 0, refused.stdout
        assert "Code: PermissionDenied" in refused.stderr, refused.stderr
        assert "StopService needs a management identity" in refused.stderr, refused.stderr
    status = grpcurl(grpc_server.address, client_files, "switchboard.v1.Management/GetStatus")
    assert status.returncode == 0 and json.loads(status.stdout)["ready"], status.stderr
    assert request(gateway.url("business"), client_files, f"/v2/models/{MODEL}/generate",
                   {"text_input": "Hi", "parameters": {"max_new_tokens": 2}})[0] == 200
