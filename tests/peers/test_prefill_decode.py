"""Prefill/decode disaggregation between two real servers (each behind its gateway, mutual
TLS on every hop, the KV cache moved server to server over mutual TLS), driven two ways:
- vLLM's request-level contract: a driver that does what vLLM's disaggregation proxy does
  sends a request to the prefill instance with kv_transfer_params {do_remote_decode: true},
  max_tokens 1 and stream false, and the original request with the answer's
  kv_transfer_params to the decode instance, whose answer is the client's;
- a third gateway coordinating the pair itself (`--prefill P --upstream D`).

vLLM's router (`vllm-router --vllm-pd-disaggregation`) drives the same exchange, but it has
no client certificate for workers that ask for one (no flag or setting for it), so it is not
used here.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import own_service, start_gateway
from gateway_clients import MODEL, OpenStream, connect, fetch, poll, request

LEASE_S = 2.0
# The packaged model's weights unquantized: a quantized model's products take other kernels
# for other numbers of rows, so its greedy answer may turn at a near tie with the batch it
# ran in, on one instance as on two; in float32 it does not.
FLOAT32 = ("--quantization", "none")
SHARED = "You are a patient geography teacher. Answer in one short sentence. "
PROMPTS = ["What is the capital of France?", "Name a river in Spain.",
           SHARED + "What is the capital of Italy?", SHARED + "What is the capital of Peru?",
           "Hi", "Tell me a story about a dragon who learns to fly over the mountains and "
           "the sea, with a friend, in spring.", SHARED + "Where is Lima?",
           "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,"]
# What vLLM's proxy adds to a request for the prefill instance.
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                  "remote_engine_id": None, "remote_block_ids": None, "remote_host": None,
                  "remote_port": None}


@dataclass(frozen=True)
class Pair:
    prefill: object
    decode: object
    files: object

    def call(self, gateway, path: str, body: dict) -> dict:
        status, reply = request(gateway.url("business"), self.files, path, body)
        assert status == 200, reply
        return reply

    def prefilled(self, path: str, body: dict) -> dict:
        """The prefill instance's kv_transfer_params for the request."""
        reply = self.call(self.prefill, path, {**body, "max_tokens": 1, "stream": False,
                                               "kv_transfer_params": PREFILL_PARAMS})
        return reply["kv_transfer_params"]

    def disaggregated(self, path: str, body: dict) -> dict:
        return self.call(self.decode, path, {**body, "kv_transfer_params":
                                             self.prefilled(path, body)})

    def free_blocks(self, gateway) -> tuple[int, int]:
        status, reply = request(gateway.url("management"), self.files, "/v1/status")
        assert status == 200, reply
        return reply["resource"]["freeNpuBlockNums"], reply["resource"]["totalNpuBlockNums"]

    def assert_no_block_kept(self, within_s: float = 3.0) -> None:
        for gateway in (self.prefill, self.decode):
            (free, total), _ = poll(lambda: self.free_blocks(gateway),
                                    lambda counts: counts[0] == counts[1], within_s)
            assert free == total


@pytest.fixture(scope="module")
def servers(pki) -> Iterator[tuple[object, object, object, object]]:
    """(prefill server, its gateway, decode server, its gateway)"""
    with own_service(pki.folder, server_args=(*FLOAT32, "--kv-transfer-lease", str(LEASE_S))
                     ) as p, own_service(pki.folder, server_args=FLOAT32) as d:
        yield (*p, *d)


@pytest.fixture(scope="module")
def pair(servers, client_files) -> Pair:
    _, prefill, _, decode = servers
    return Pair(prefill, decode, client_files)


@contextlib.contextmanager
def coordinator(pki, prefill: str, decode: str) -> Iterator[object]:
    gateway = start_gateway(pki.folder, decode, "--prefill", prefill)
    try:
        yield gateway
    finally:
        gateway.stop()


def completion(prompt: str) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "ignore_eos": True}


def test_greedy_completions_through_the_pair_equal_one_instances(pair) -> None:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        split = list(pool.map(lambda p: pair.disaggregated("/v1/completions", completion(p)),
                              PROMPTS))
        alone = list(pool.map(lambda p: pair.call(pair.prefill, "/v1/completions",
                                                  completion(p)), PROMPTS))
    assert [reply["choices"][0]["text"] for reply in split] == \
        [reply["choices"][0]["text"] for reply in alone]
    # Every prompt token but the last came from the prefill (or the decoder's own cache).
    assert [reply["usage"]["prompt_tokens_details"]["cached_tokens"] for reply in split] == \
        [reply["usage"]["prompt_tokens"] - 1 for reply in split]
    pair.assert_no_block_kept()


def test_a_seeded_sampled_chat_streamed_from_the_decoder_gives_one_instances_text(pair) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about Paris."}],
            "max_tokens": 16, "temperature": 0.8, "seed": 7}
    alone = pair.call(pair.prefill, "/v1/chat/completions", body)
    params = pair.prefilled("/v1/chat/completions", body)
    status, stream = fetch(pair.decode.url("business"), pair.files, "/v1/chat/completions",
                           {**body, "stream": True, "kv_transfer_params": params})
    assert status == 200, stream
    chunks = [json.loads(line[len(b"data: "):]) for line in stream.splitlines()
              if line.startswith(b"data: {")]
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks
                   if chunk["choices"])
    assert text == alone["choices"][0]["message"]["content"]
    pair.assert_no_block_kept()


def test_a_prefill_nobody_reads_frees_its_blocks_when_the_lease_runs_out(pair) -> None:
    params = pair.prefilled("/v1/completions", completion(PROMPTS[5]))
    free, total = pair.free_blocks(pair.prefill)
    assert free < total
    pair.assert_no_block_kept(within_s=LEASE_S + 2)
    # The decoder, finding the KV cache gone, computes the prompt itself.
    reply = pair.call(pair.decode, "/v1/completions",
                      {**completion(PROMPTS[5]), "kv_transfer_params": params})
    assert reply["choices"][0]["text"] == pair.call(
        pair.prefill, "/v1/completions", completion(PROMPTS[5]))["choices"][0]["text"]


def test_a_prefill_instance_that_is_gone_leaves_the_decoder_to_compute_the_prompt(
        pair) -> None:
    params = pair.prefilled("/v1/completions", completion(PROMPTS[0]))
    with contextlib.closing(socket.socket()) as unused:
        unused.bind(("127.0.0.1", 0))
        params["remote_port"] = unused.getsockname()[1]
    reply = pair.call(pair.decode, "/v1/completions",
                      {**completion(PROMPTS[0]), "kv_transfer_params": params})
    assert reply["choices"][0]["text"] == pair.call(
        pair.prefill, "/v1/completions", completion(PROMPTS[0]))["choices"][0]["text"]
    pair.assert_no_block_kept(within_s=LEASE_S + 2)


def test_remote_prefill_without_its_address_is_refused_naming_the_field(pair) -> None:
    status, reply = request(pair.decode.url("business"), pair.files, "/v1/completions",
                            {**completion(PROMPTS[0]),
                             "kv_transfer_params": {"do_remote_prefill": True}})
    assert status == 400, reply
    assert reply["error"]["param"] == "kv_transfer_params"
    assert "remote_host" in reply["error"]["message"]


def test_a_gateway_coordinating_the_pair_answers_as_one_instance(pki, servers, pair) -> None:
    prefill_server, _, decode_server, _ = servers
    question = {"model": MODEL, "max_tokens": 12, "temperature": 0,
                "messages": [{"role": "user", "content": "What is the capital of Chile?"}]}
    alone = pair.call(pair.prefill, "/v1/chat/completions", question)
    with coordinator(pki, prefill_server.address, decode_server.address) as gateway:
        split = pair.call(gateway, "/v1/chat/completions", question)
        status, reply = request(gateway.url("business"), pair.files, "/v1/completions",
                                {**completion(PROMPTS[1]), "n": 2, "temperature": 0.7})
    assert split["choices"][0]["message"] == alone["choices"][0]["message"]
    usage = split["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert status == 200 and len(reply["choices"]) == 2  # n > 1: decoded where prefilled
    pair.assert_no_block_kept()


def decoding_a_long_stream(gateway, files) -> tuple[http.client.HTTPSConnection,
                                                    http.client.HTTPResponse]:
    """A streamed completion of 2,000 tokens through `gateway`, once its first event came."""
    connection = connect(gateway.url("business"), files)
    connection.request("POST", "/v1/completions", json.dumps(
        {**completion(PROMPTS[5]), "max_tokens": 2000, "stream": True}),
        {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # decoding has begun
    return connection, response


def test_a_client_leaving_a_coordinated_stream_leaves_no_block_kept(pki, servers, pair) -> None:
    prefill_server, _, decode_server, _ = servers
    with coordinator(pki, prefill_server.address, decode_server.address) as gateway:
        OpenStream(*decoding_a_long_stream(gateway, pair.files)).drop()
        pair.assert_no_block_kept()


def test_a_decode_server_killed_mid_stream_ends_the_stream_with_an_error_and_keeps_nothing(
        pki, servers, pair) -> None:
    """The client reads an error event where the stream stops, in OpenAI's shape; the
    prefill server keeps no KV cache, its reader gone or not; while the decode server is away
    the coordinator answers 503, and the prefill it made for that request is freed by the
    lease."""
    prefill_server, _, _, _ = servers
    with own_service(pki.folder, server_args=FLOAT32) as (doomed, _), \
            coordinator(pki, prefill_server.address, doomed.address) as gateway:
        connection, response = decoding_a_long_stream(gateway, pair.files)
        doomed.process.kill()
        events = [line[len(b"data: "):].strip() for line in response
                  if line.startswith(b"data: ")]
        connection.close()
        errors = [json.loads(event)["error"] for event in events
                  if event.startswith(b"{") and "error" in json.loads(event)]
        assert len(errors) == 1 and errors[0]["code"] == "503", events[-3:]
        status, reply = request(gateway.url("business"), pair.files, "/v1/completions",
                                completion(PROMPTS[0]))
        assert status == 503 and reply["error"]["code"] == "503", reply
    pair.assert_no_block_kept(within_s=LEASE_S + 2)


def test_a_coordinator_whose_prefill_server_is_gone_has_the_decoder_compute(pki, servers,
                                                                              pair) -> None:
    _, _, decode_server, _ = servers
    with contextlib.closing(socket.socket()) as unused:
        unused.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{unused.getsockname()[1]}"
    with coordinator(pki, gone, decode_server.address) as gateway:
        reply = pair.call(gateway, "/v1/completions", completion(PROMPTS[0]))
    assert reply["choices"][0]["text"] == pair.call(
        pair.prefill, "/v1/completions", completion(PROMPTS[0]))["choices"][0]["text"]


def test_kserve_clients_hand_a_prefill_over_as_a_string_parameter(servers, client_files,
                                                                   pair) -> None:
    """tritonclient over KServe v2 gRPC: the same JSON as a `kv_transfer_params` parameter."""
    prefill_server, _, decode_server, _ = servers

    def infer(address: str, **parameters):
        prompt = grpcclient.InferInput("text_input", [1], "BYTES")
        prompt.set_data_from_numpy(np.array([PROMPTS[2].encode()], dtype=np.object_))
        with grpcclient.InferenceServerClient(
                address, ssl=True, root_certificates=str(client_files.ca),
                private_key=str(client_files.key),
                certificate_chain=str(client_files.cert)) as client:
            return client.infer(MODEL, [prompt], parameters={"max_new_tokens": 12, **parameters})

    prefilled = infer(prefill_server.address, max_new_tokens=1,
                      kv_transfer_params=json.dumps({"do_remote_decode": True}))
    params = prefilled.get_response().parameters["kv_transfer_params"].string_param
    assert json.loads(params)["do_remote_prefill"] is True
    split = infer(decode_server.address, kv_transfer_params=params)
    free, total = pair.free_blocks(pair.prefill)
    assert free == total  # read and released by the decode server, not left to the lease
    alone = infer(prefill_server.address)
    assert split.as_numpy("text_output")[0] == alone.as_numpy("text_output")[0]
    pair.assert_no_block_kept()


# MindIE's roles, PD headers and /dresult --------------------------------------------------------

DEVICE = {"device_ip": "127.0.0.1", "device_id": "0", "device_logical_id": "0"}


def instance(identifier: int, gateway) -> dict[str, object]:
    """MindIE's role body's description of an instance, with Switchboard's `port`: its
    gateway's management port."""
    return {"server_ip": "127.0.0.1", "id": identifier, "host_ip": "127.0.0.1",
            "device": [DEVICE], "port": urlsplit(gateway.url("management")).port}


class DResultReader:
    """GET /dresult, read in a thread: the records so far (NUL-terminated, in order)."""

    def __init__(self, gateway, files) -> None:
        self.connection = connect(gateway.url("business"), files)
        self.connection.request("GET", "/dresult")
        self.response = self.connection.getresponse()
        self.data = b""
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError, http.client.HTTPException):
            while chunk := self.response.read1():
                self.data += chunk
        self.ended.set()

    def records(self) -> list[bytes]:
        return self.data.split(b"\0")[:-1]

    def wait_for(self, record: bytes, within_s: float) -> list[bytes]:
        records, _ = poll(self.records, lambda found: record in found, within_s)
        assert record in records, records
        return records

    def results(self, request_id: str) -> list[tuple[str, bytes]]:
        """The (kind, body) records of one request."""
        records, found = self.records(), []
        for name, record in zip(records, records[1:]):
            if name == b"reqId:" + request_id.encode():
                kind, _, body = record.partition(b":")
                found.append((kind.decode(), body))
        return found

    def whole_answer(self, request_id: str) -> dict:
        """A request's answer when not streamed: one lastData record, the whole answer."""
        self.wait_for(b"reqId:" + request_id.encode(), within_s=60)
        [(kind, whole)] = self.results(request_id)
        assert kind == "lastData"
        return json.loads(whole)

    def close(self) -> None:
        self.connection.close()


@pytest.fixture(scope="module")
def roles_assigned(pair) -> Pair:
    status, reply = request(pair.decode.url("management"), pair.files, "/v1/role/decode",
                            {"local": instance(2, pair.decode),
                             "peers": [instance(1, pair.prefill)]})
    assert (status, reply) == (200, {"result": "ok"})
    status, reply = request(pair.prefill.url("management"), pair.files, "/v1/role/prefill",
                            {"local": instance(1, pair.prefill),
                             "peers": [instance(2, pair.decode)]})
    assert (status, reply) == (200, {"result": "ok"})
    for gateway in (pair.prefill, pair.decode):
        ready, _ = poll(lambda: request(gateway.url("management"), pair.files, "/v1/status")[1],
                        lambda status: status["service"]["roleStatus"] == "RoleReady", 10)
        assert ready["linkStatus"] == {"peers": [{"target": 2 if gateway is pair.prefill
                                                  else 1, "link": "ok"}]}
    return pair


def test_roles_are_reported_as_mindie_reports_them(roles_assigned) -> None:
    pair = roles_assigned
    for gateway, role in ((pair.prefill, "prefill"), (pair.decode, "decode")):
        status, reply = request(gateway.url("management"), pair.files, "/v1/status")
        assert reply["service"] == {"roleStatus": "RoleReady", "currentRole": role}
    status, reply = request(pair.decode.url("management"), pair.files, "/v1/role/primary", {})
    assert status == 404
    status, reply = fetch(pair.prefill.url("business"), pair.files, "/dresult")
    assert status == 400 and b"Only the Decode node supports dresult" in reply


def test_a_prefill_handed_over_streams_its_answer_on_the_decoders_dresult(
        roles_assigned) -> None:
    pair = roles_assigned
    body = {"model": MODEL, "max_tokens": 12, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    alone = pair.call(pair.decode, "/v1/chat/completions", {**body, "stream": False})
    reader = DResultReader(pair.decode, pair.files)
    try:
        headers = {"req-type": "prefill", "req-id": "a1b2c3",
                   "d-target": f"127.0.0.1;{urlsplit(pair.decode.url('business')).port}"}
        status, reply = post(pair.prefill, pair.files, "/v1/chat/completions", body, headers)
        assert (status, reply) == (200, {"reqId": "a1b2c3", "isStream": True,
                                         "isLastResp": False, "output": ""})
        reader.wait_for(b"lastData:data: [DONE]\n\n", within_s=60)
        results = reader.results("a1b2c3")
        assert [kind for kind, _ in results] == ["data"] * (len(results) - 1) + ["lastData"]
        chunks = [json.loads(body.removeprefix(b"data: ")) for kind, body in results[:-1]]
        assert "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks
                       if chunk["choices"]) == alone["choices"][0]["message"]["content"]

        status, reply = post(pair.prefill, pair.files, "/v1/completions",
                             {**completion(PROMPTS[0])}, {**headers, "req-id": "ff01"})
        assert (status, reply) == (200, {"reqId": "ff01", "isStream": False})
        assert reader.whole_answer("ff01")["choices"][0]["text"] == pair.call(
            pair.decode, "/v1/completions", completion(PROMPTS[0]))["choices"][0]["text"]
    finally:
        reader.close()
    pair.assert_no_block_kept()


def test_is_recompute_hands_the_request_over_for_the_decoder_to_compute(roles_assigned) -> None:
    """MindIE's re-dispatch after a failure: nothing is prefilled on the prefill instance, and
    the decode instance computes the whole prompt (none of it comes from elsewhere)."""
    pair = roles_assigned
    body = completion("Count the planets of the solar system, one by one.")
    reader = DResultReader(pair.decode, pair.files)
    try:
        headers = {"req-type": "prefill", "req-id": "5e", "is-recompute": "true",
                   "d-target": f"127.0.0.1;{urlsplit(pair.decode.url('business')).port}"}
        assert post(pair.prefill, pair.files, "/v1/completions", body, headers) == (
            200, {"reqId": "5e", "isStream": False})
        answer = reader.whole_answer("5e")
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert answer["choices"][0]["text"] == pair.call(
            pair.decode, "/v1/completions", body)["choices"][0]["text"]
        status, reply = post(pair.prefill, pair.files, "/v1/completions", body,
                             {**headers, "req-id": "5f", "is-recompute": "yes"})
        assert status == 400 and "is-recompute" in reply["error"]["message"], reply
    finally:
        reader.close()
    pair.assert_no_block_kept()


def test_tritons_routes_hand_a_prefill_over_too(roles_assigned) -> None:
    """MindIE's coordinator sends its PD headers on Triton's routes as well: /generate's
    whole reply, /generate_stream's events and /infer's reply (in JSON) come on the decoder's
    /dresult."""
    pair = roles_assigned
    body = {"text_input": PROMPTS[2], "parameters": {"max_new_tokens": 12}}
    path = f"/v2/models/{MODEL}/generate"
    alone = pair.call(pair.decode, path, body)["text_output"]
    reader = DResultReader(pair.decode, pair.files)
    try:
        headers = {"req-type": "prefill", "req-id": "7a",
                   "d-target": f"127.0.0.1;{urlsplit(pair.decode.url('business')).port}"}
        assert post(pair.prefill, pair.files, path, body, headers) == (
            200, {"reqId": "7a", "isStream": False})
        assert reader.whole_answer("7a")["text_output"] == alone
        status, reply = post(pair.prefill, pair.files, path + "_stream", body,
                             {**headers, "req-id": "7b"})
        assert (status, reply) == (200, {"reqId": "7b", "isStream": True,
                                         "isLastResp": False, "output": ""})
        reader.wait_for(b"reqId:7b", within_s=60)
        records, _ = poll(lambda: reader.results("7b"),
                          lambda found: found and found[-1][0] == "lastData", 60)
        assert [kind for kind, _ in records] == ["data"] * (len(records) - 1) + ["lastData"]
        events = [json.loads(record.removeprefix(b"data: ")) for _, record in records]
        assert "".join(event["text_output"] for event in events) == alone

        infer = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                             "data": [PROMPTS[2]]}], "parameters": {"max_new_tokens": 12}}
        path = f"/v2/models/{MODEL}/infer"
        assert post(pair.prefill, pair.files, path, infer, {**headers, "req-id": "7c"}) == (
            200, {"reqId": "7c", "isStream": False})
        [output] = reader.whole_answer("7c")["outputs"]
        assert output["data"] == [alone]
        status, reply = post(pair.prefill, pair.files, path, {
            **infer, "parameters": {"binary_data_output": True}}, {**headers, "req-id": "7d"})
        assert status == 400 and "binary_data" in reply["error"], reply
    finally:
        reader.close()
    pair.assert_no_block_kept()


def test_a_gateway_started_in_the_prefill_role_hands_requests_over_unassigned(
        pki, servers, roles_assigned) -> None:
    """`--role prefill`: the role from the start, as if MindIE's controller had assigned it
    (a prefill instance needs no peers: each request names its decode instance)."""
    pair = roles_assigned
    prefill_server, _, _, _ = servers
    gateway = start_gateway(pki.folder, prefill_server.address, "--role", "prefill")
    reader = DResultReader(pair.decode, pair.files)
    try:
        status, reply = request(gateway.url("management"), pair.files, "/v1/status")
        assert reply["service"] == {"roleStatus": "RoleReady", "currentRole": "prefill"}
        assert reply["linkStatus"] == {"peers": []}
        headers = {"req-type": "prefill", "req-id": "c0ffee",
                   "d-target": f"127.0.0.1;{urlsplit(pair.decode.url('business')).port}"}
        status, reply = post(gateway, pair.files, "/v1/completions", completion(PROMPTS[1]),
                             headers)
        assert (status, reply) == (200, {"reqId": "c0ffee", "isStream": False})
        assert reader.whole_answer("c0ffee")["choices"][0]["text"] == pair.call(
            pair.decode, "/v1/completions", completion(PROMPTS[1]))["choices"][0]["text"]
    finally:
        reader.close()
        gateway.stop()
    pair.assert_no_block_kept()


def test_dresult_beats_when_idle_and_a_new_connection_replaces_the_old(roles_assigned) -> None:
    pair = roles_assigned
    first = DResultReader(pair.decode, pair.files)
    try:
        first.wait_for(b"ka:heartbeat", within_s=8)
        second = DResultReader(pair.decode, pair.files)
        try:
            first.wait_for(b"close:new connection is to established, close the old one.",
                           within_s=3)
            assert first.ended.wait(3)
            assert b"reqId:0xffffffffffffffff" in first.records()
        finally:
            second.close()
    finally:
        first.close()


def test_dmi_requests_are_refused_as_mindie_refuses_them(roles_assigned) -> None:
    pair = roles_assigned
    body = completion(PROMPTS[0])
    for headers, message in (
            ({"req-type": "prefill", "req-id": "ab"}, "must have req-type, req-id, d-target"),
            ({"req-type": "prefill", "req-id": "xyz", "d-target": "127.0.0.1"}, "hex char"),
            ({"req-type": "decode", "req-id": "ab", "d-target": "127.0.0.1"}, "must be prefill"),
            ({"req-type": "prefill", "req-id": "ab", "d-target": "decoder"}, "IPv4")):
        status, reply = post(pair.prefill, pair.files, "/v1/completions", body, headers)
        assert status == 400 and message in reply["error"]["message"], reply
    # Only a gateway hands a request over to a decoder.
    status, reply = post(pair.decode, pair.files, "/v1/completions", body,
                         {"req-id": "ab", "x-switchboard-kv-transfer": "{}"})
    assert status == 403, reply


def post(gateway, files, path: str, body: dict, headers: dict) -> tuple[int, object]:
    connection = connect(gateway.url("business"), files)
    try:
        connection.request("POST", path, json.dumps(body),
                           {"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()
