"""A prompt too big to be one is refused by its size before anything tokenizes it, on every
route, gRPC or REST, within a second of arriving, with the server's memory barely moved and a
canary generation running beside it as fast as it runs alone: one of 60 MB as a body over the
gateway's limit (413) or a gRPC message over the server's (RESOURCE_EXHAUSTED), before it is
parsed; one of a few MB, past what `maxInputTokenLen` tokens can hold, in the protocol's error
shape naming its prompt field. A prompt at the size limit is still tokenized.

The machine is shared and busy: the canary's slowdown is a ratio to its own idle latency,
measured in the same test, and a median over many calls."""

from __future__ import annotations

import json
import statistics
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from gateway_clients import MODEL, connect, request
from tritonclient.grpc import service_pb2

HUGE_PROMPT_BYTES = 60 * 2**20
# Over the prompt size limit, under the gateway's body limit and the server's message limit.
LONG_PROMPT_BYTES = 3 * 2**20
# From the body's last byte to the refusal.
REFUSAL_DEADLINE_S = 1.0
# A gRPC call's time includes sending its message, which for 60 MB over TLS on the shared
# machine takes about a second by itself: gRPC tells no "last byte sent" apart.
HUGE_MESSAGE_DEADLINE_S = 3.0
MAX_RSS_GROWTH_BYTES = 200 * 2**20
# The canary's median latency under attack against its idle one; the floor keeps a canary
# that takes a few milliseconds from failing on a scheduling hiccup of the shared machine.
MAX_CANARY_SLOWDOWN = 2.0
CANARY_FLOOR_S = 0.1
NUM_CANARIES = 7
CANARY = {"text_input": "Hi", "parameters": {"max_new_tokens": 1}}


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    body: Callable[[str], dict]
    status: int
    field: Callable[[dict], str]  # where the error document names the field


def named_in_message(key: str) -> Callable[[dict], str]:
    return lambda document: document[key].split(":", 1)[0]


def openai_param(document: dict) -> str:
    return document["error"]["param"]


ROUTES = {
    "text_input": Route(f"/v2/models/{MODEL}/generate", lambda text: {"text_input": text},
                        400, named_in_message("error")),
    "inputs": Route("/generate", lambda text: {"inputs": text}, 422, named_in_message("error")),
    "prompt": Route("/v1/completions", lambda text: {"model": MODEL, "prompt": text}, 400,
                    openai_param),
    "messages": Route("/v1/chat/completions", lambda text: {
        "model": MODEL, "messages": [{"role": "user", "content": text}]}, 400, openai_param),
    "tgi_tokenize": Route("/tokenize", lambda text: {"inputs": text}, 422,
                          named_in_message("error")),
    "vllm_tokenize": Route("/tokenize", lambda text: {"prompt": text}, 400, openai_param),
}
FIELDS = {"tgi_tokenize": "inputs", "vllm_tokenize": "prompt"}


def reset_peak_rss(pid: int) -> None:
    """Start VmHWM over from the resident memory now (proc(5), clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def post_timed(base_url: str, files, path: str, body: bytes) -> tuple[int, dict, float]:
    """POST `body`; the status, JSON reply and seconds from its last byte to the reply."""
    connection = connect(base_url, files)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        sent = time.monotonic()
        response = connection.getresponse()
        reply = json.loads(response.read())
        return response.status, reply, time.monotonic() - sent
    finally:
        connection.close()


class Canary:
    """Small generations through the gateway, one after another, timed."""

    def __init__(self, gateway, client_files) -> None:
        self._url = gateway.url("business")
        self._files = client_files

    def once(self) -> float:
        start = time.monotonic()
        status, reply = request(self._url, self._files, f"/v2/models/{MODEL}/generate", CANARY)
        assert status == 200, reply
        return time.monotonic() - start

    def median_while(self, attack: Callable[[], None]) -> tuple[float, float]:
        """The median latency of canaries alone, then of those run while `attack` runs (and
        at least as many)."""
        idle = statistics.median(self.once() for _ in range(NUM_CANARIES))
        done = threading.Event()
        latencies: list[float] = []
        with ThreadPoolExecutor(1) as pool:
            attacking = pool.submit(lambda: (attack(), done.set()))
            while not done.is_set() or len(latencies) < NUM_CANARIES:
                latencies.append(self.once())
            attacking.result()
        return idle, statistics.median(latencies)


@pytest.fixture(scope="module")
def canary(gateway, client_files) -> Canary:
    canary = Canary(gateway, client_files)
    canary.once()  # warm: connections, first-call costs
    return canary


def assert_bounded(server, canary: Canary, attack: Callable[[], None]) -> None:
    """`attack` moves the server's peak memory little and leaves the canary its pace."""
    reset_peak_rss(server.process.pid)
    before = server.rss_bytes()
    idle, under_attack = canary.median_while(attack)
    assert server.peak_rss_bytes() - before < MAX_RSS_GROWTH_BYTES
    assert under_attack <= MAX_CANARY_SLOWDOWN * max(idle, CANARY_FLOOR_S), (under_attack, idle)


@pytest.mark.parametrize("name", ROUTES)
def test_a_prompt_too_big_is_refused_at_once_on_every_rest_route(
        name: str, gateway, grpc_server, client_files, canary: Canary) -> None:
    route = ROUTES[name]
    url = gateway.url("business")
    huge = json.dumps(route.body("a" * HUGE_PROMPT_BYTES)).encode()
    long = json.dumps(route.body("a" * LONG_PROMPT_BYTES)).encode()
    outcomes = []

    def attack() -> None:
        # In a process of its own, so that sending 60 MB over TLS does not slow the canary's
        # own client in this one.
        with ProcessPoolExecutor(1) as sender:
            outcomes.extend(sender.map(post_timed, *zip(*[
                (url, client_files, route.path, body) for body in (huge, long)])))

    assert_bounded(grpc_server, canary, attack)
    (too_big, refusal, huge_elapsed), (status, reply, elapsed) = outcomes
    assert too_big == 413 and "limit" in json.dumps(refusal), refusal
    assert huge_elapsed < REFUSAL_DEADLINE_S, huge_elapsed
    assert status == route.status, reply
    assert route.field(reply) == FIELDS.get(name, name), reply
    assert "bytes" in json.dumps(reply), reply
    assert elapsed < REFUSAL_DEADLINE_S, elapsed


def serialized_text_request(size: int) -> bytes:
    """A KServe v2 ModelInferRequest with a text_input of `size` bytes, serialized (so that
    the time it takes the client to build it is not counted as the server's)."""
    return service_pb2.ModelInferRequest(
        model_name=MODEL, inputs=[service_pb2.ModelInferRequest.InferInputTensor(
            name="text_input", datatype="BYTES", shape=[1])],
        raw_input_contents=[struct.pack("<I", size) + b"a" * size]).SerializeToString()


def test_a_prompt_too_big_is_refused_at_once_over_grpc(grpc_server, client_files,
                                                       canary: Canary) -> None:
    requests = [serialized_text_request(size) for size in (HUGE_PROMPT_BYTES, LONG_PROMPT_BYTES)]
    credentials = grpc.ssl_channel_credentials(*(path.read_bytes() for path in (
        client_files.ca, client_files.key, client_files.cert)))
    outcomes = []

    def attack() -> None:
        for serialized in requests:  # each on a channel of its own: the first floods its own
            with grpc.secure_channel(grpc_server.address, credentials,
                                     [("grpc.max_send_message_length", -1)]) as channel:
                grpc.channel_ready_future(channel).result(timeout=60)
                infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
                start = time.monotonic()
                with pytest.raises(grpc.RpcError) as refused:
                    infer(serialized, timeout=60)
                outcomes.append((refused.value, time.monotonic() - start))

    assert_bounded(grpc_server, canary, attack)
    (too_big, huge_elapsed), (too_long, elapsed) = outcomes
    assert too_big.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, too_big
    assert "larger than max" in too_big.details(), too_big
    assert huge_elapsed < HUGE_MESSAGE_DEADLINE_S, huge_elapsed
    assert too_long.code() is grpc.StatusCode.INVALID_ARGUMENT, too_long
    assert too_long.details().startswith("text_input: is over "), too_long
    assert elapsed < REFUSAL_DEADLINE_S, elapsed


def prompt_size_limit(gateway, client_files) -> int:
    status, config = request(gateway.url("business"), client_files, f"/v2/models/{MODEL}/config")
    assert status == 200, config
    return int(config["parameters"]["max_prompt_bytes"]["string_value"])


@pytest.mark.parametrize("name", ["tgi_tokenize", "vllm_tokenize"])
def test_the_tokenizers_take_a_prompt_up_to_the_limit_and_refuse_one_byte_more(
        name: str, gateway, client_files) -> None:
    route = ROUTES[name]
    limit = prompt_size_limit(gateway, client_files)
    status, reply = request(gateway.url("business"), client_files, route.path,
                            route.body(" " * limit))
    assert status == 200, reply
    status, reply = request(gateway.url("business"), client_files, route.path,
                            route.body(" " * (limit + 1)))
    assert status == route.status and route.field(reply) == FIELDS[name], reply
