"""The gateway's Triton / KServe v2 REST routes end to end: real clients (curl, tritonclient.http,
http.client) → gateway (Tornado, mutual TLS) → gRPC server (mutual TLS) → the real model.

Runs with the other tests under tests/peers (their own pytest process: tritonclient).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tritonclient.http as httpclient
from gateway_clients import (MODEL, connect, curl_with, fetch, long_generation, open_stream,
                             poll, request, slot_count, unique_id)

# "The capital of France is" in SmolLM2's vocabulary.
PROMPT_IDS = [504, 3575, 282, 4649, 314]
PARIS = 7042  # " Paris", greedily the first token after the prompt
VOCAB_SIZE = 49152
SLOTS_BACK_WITHIN_S = 1.0

# MindIE's documented example bodies (Triton token and text interfaces), verbatim: the token
# example asks for a watermark, which MindIE accepts and does not apply.
MINDIE_INFER = {
    "id": "42",
    "inputs": [{"name": "input0", "shape": [1, 5], "datatype": "UINT32", "data": PROMPT_IDS}],
    "outputs": [{"name": "output0"}],
    "parameters": {"details": True, "do_sample": True, "max_new_tokens": 5,
                   "repetition_penalty": 1.03, "seed": 5, "temperature": 0.5, "top_k": 10,
                   "top_p": 0.95, "typical_p": 0.5, "watermark": True, "priority": 5,
                   "timeout": 10},
}
MINDIE_GENERATE = {
    "id": "a123",
    "text_input": "The capital of France is",
    "parameters": {"details": True, "do_sample": False, "max_new_tokens": 8, "seed": 5,
                   "top_k": 10, "top_p": 0.95, "batch_size": 100, "typical_p": 0.5,
                   "watermark": False, "perf_stat": True, "priority": 5, "timeout": 10},
}


def business(gateway, path: str) -> str:
    return gateway.url("business") + path


def model_path(route: str) -> str:
    return f"/v2/models/{MODEL}/{route}"


# 1. curl with MindIE's example bodies --------------------------------------------------------

def test_curl_infer_mindie_example(gateway, client_files) -> None:
    reply = curl_with(client_files, business(gateway, model_path("infer")), body=MINDIE_INFER)
    assert reply.exit_code == 0, reply.stderr
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("application/json")
    document = reply.json()
    assert document["id"] == "42"
    [output] = document["outputs"]
    assert {k: output[k] for k in ("name", "datatype")} == {"name": "output0", "datatype": "UINT32"}
    assert output["shape"] == [1, len(output["data"])]
    assert 1 <= len(output["data"]) <= 5
    assert all(isinstance(t, int) and 0 <= t < VOCAB_SIZE for t in output["data"])


def test_curl_generate_and_generate_stream_mindie_example(gateway, client_files) -> None:
    whole = curl_with(client_files, business(gateway, model_path("generate")), body=MINDIE_GENERATE)
    assert (whole.exit_code, whole.status) == (0, 200), whole.body
    reply = whole.json()
    assert (reply["id"], reply["model_name"]) == ("a123", MODEL)
    assert "Paris" in reply["text_output"]
    details = reply["details"]
    assert details["finish_reason"] in ("length", "eos_token")
    if details["finish_reason"] == "length":
        assert details["generated_tokens"] == 8
    assert 1 <= details["generated_tokens"] <= 8
    assert len(details["perf_stat"]) == details["generated_tokens"]
    assert all(isinstance(token, int) and ms >= 0 for token, ms in details["perf_stat"])

    streamed = curl_with(client_files, business(gateway, model_path("generate_stream")),
                         body=MINDIE_GENERATE, stream=True)
    assert (streamed.exit_code, streamed.status) == (0, 200), streamed.body
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = streamed.events()
    assert len(events) == details["generated_tokens"]  # one event per token
    assert "".join(event["text_output"] for event in events) == reply["text_output"]
    assert [event["details"]["generated_tokens"] for event in events] == \
        list(range(1, len(events) + 1))
    first, *later = events
    assert first["prefill_time"] is not None and first["decode_time"] is None
    assert all(e["prefill_time"] is None and e["decode_time"] is not None for e in later)
    finished = [("finish_reason" in event["details"]) for event in events]
    assert finished == [False] * (len(events) - 1) + [True]
    assert events[-1]["details"]["finish_reason"] == details["finish_reason"]
    assert [pair[0] for pair in events[-1]["details"]["perf_stat"]] == \
        [pair[0] for pair in details["perf_stat"]]


# KServe's generate extension (the Open Inference Protocol's generate_rest.yaml) on the same
# routes: its names, a temperature of 0 (greedy), stop as an array, and details.
KSERVE_GENERATE = {"text_input": "The capital of France is", "parameters": {
    "max_tokens": 4, "temperature": 0, "top_p": 1, "stop": ["\n\n"], "details": True}}


def assert_kserve_tokens(tokens: list[dict]) -> None:
    assert tokens and tokens[0]["id"] == PARIS and tokens[0]["text"] == " Paris"
    assert all(set(token) == {"id", "text", "logprob", "special"} and token["logprob"] <= 0
               and token["special"] is False for token in tokens)


def test_kserves_generate_extension_is_served_beside_mindies(gateway, client_files) -> None:
    status, reply = request(gateway.url("business"), client_files, model_path("generate"),
                            KSERVE_GENERATE)
    assert status == 200, reply
    assert reply["text_output"].startswith(" Paris")
    details = reply["details"]
    assert details["finish_reason"] in ("length", "stop_sequence")
    assert len(details["logprobs"]) == details["generated_tokens"] <= 4
    assert_kserve_tokens(details["logprobs"])
    streamed = curl_with(client_files, business(gateway, model_path("generate_stream")),
                         body=KSERVE_GENERATE, stream=True)
    assert (streamed.exit_code, streamed.status) == (0, 200), streamed.body
    events = streamed.events()
    assert [event["details"]["token"] for event in events] == details["logprobs"]
    assert events[-1]["details"]["finish_reason"] == details["finish_reason"]


@pytest.mark.parametrize("parameters", [{"max_tokens": 0}, {"max_tokens": 2, "top_p": 1.5}],
                         ids=["max_tokens", "top_p"])
def test_kserves_parameters_are_refused_under_their_own_names(gateway, client_files,
                                                            parameters) -> None:
    status, reply = request(gateway.url("business"), client_files, model_path("generate"),
                            {"text_input": "Hi", "parameters": parameters})
    field = "top_p" if "top_p" in parameters else "max_tokens"
    assert status == 400 and reply["error"].startswith(f"{field}: "), reply


def test_the_specs_spelling_of_the_server_metadata_path_is_served(gateway, client_files) -> None:
    """The Open Inference Protocol writes the server metadata path `GET v2/`."""
    assert request(gateway.url("business"), client_files, "/v2/") == \
        request(gateway.url("business"), client_files, "/v2")


@pytest.mark.parametrize("parameter", [{"repetition_penalty": 1.03}, {"min_new_tokens": 2},
                                       {"presence_penalty": 0.5}, {"frequency_penalty": 0.5}],
                         ids=lambda parameter: next(iter(parameter)))
def test_generate_with_logit_changing_parameters(gateway, client_files, parameter) -> None:
    body = {"text_input": "The capital of France is", "parameters": {"max_new_tokens": 3,
                                                                    **parameter}}
    reply = curl_with(client_files, business(gateway, model_path("generate")), body=body)
    assert reply.status == 200, reply.body
    assert reply.json()["text_output"]


def test_curl_generate_speaks_the_vllm_backends_interface(gateway, client_files) -> None:
    """Triton's generate extension's example (the vLLM backend's quickstart too): `stream` in
    `parameters` is that backend's input tensor, so the request speaks its interface: the
    prompt leads the text, 16 tokens, temperature 0 greedy; replies are Triton's."""
    prompt = "The capital of France is"
    mindie = curl_with(client_files, business(gateway, model_path("generate")), body={
        "text_input": prompt, "parameters": {"max_new_tokens": 16, "do_sample": False}})
    greedy = mindie.json()["text_output"]
    assert "Paris" in greedy

    whole = curl_with(client_files, business(gateway, model_path("generate")), body={
        "text_input": prompt, "parameters": {"stream": False, "temperature": 0}})
    assert whole.status == 200, whole.body
    assert whole.json() == {"model_name": MODEL, "model_version": "1",
                            "text_output": prompt + greedy}

    streamed = curl_with(client_files, business(gateway, model_path("generate_stream")), body={
        "text_input": prompt, "parameters": {"stream": True, "temperature": 0},
        "return_finish_reason": True, "return_num_output_tokens": True}, stream=True)
    assert streamed.status == 200, streamed.body
    events = streamed.events()
    assert "".join(event["text_output"] for event in events) == greedy
    reasons = [event["finish_reason"] for event in events]
    assert reasons[:-1] == ["None"] * (len(events) - 1) and reasons[-1] in ("length", "stop")
    if reasons[-1] == "length":
        assert sum(event["num_output_tokens"] for event in events) == 16

    refused = curl_with(client_files, business(gateway, model_path("generate")),
                        body={"text_input": prompt, "stream": True})
    assert refused.status == 400 and refused.json()["error"].startswith("stream: ")


# 2. tritonclient.http over mutual TLS ---------------------------------------------------------

@pytest.fixture(scope="module")
def triton(gateway, client_files):
    client = httpclient.InferenceServerClient(
        gateway.url("business").removeprefix("https://"), ssl=True,
        ssl_options={"ca_certs": str(client_files.ca), "certfile": str(client_files.cert),
                     "keyfile": str(client_files.key)},
        network_timeout=120, connection_timeout=30)
    yield client
    client.close()


def test_tritonclient_http_health_metadata_config(triton) -> None:
    assert triton.is_server_live()
    assert triton.is_server_ready()
    assert triton.is_model_ready(MODEL)
    server = triton.get_server_metadata()
    assert server["name"] == "switchboard" and "binary_tensor_data" in server["extensions"]
    metadata = triton.get_model_metadata(MODEL)
    assert metadata["name"] == MODEL
    assert {t["name"]: t["datatype"] for t in metadata["inputs"]}["input0"] == "UINT32"
    assert {t["name"]: t["datatype"] for t in metadata["outputs"]}["output0"] == "UINT32"
    config = triton.get_model_config(MODEL)
    assert config["name"] == MODEL
    assert config["model_transaction_policy"]["decoupled"] is True
    assert not triton.is_model_ready("no-such-model")
    assert triton.get_model_repository_index() == [
        {"name": MODEL, "version": "1", "state": "READY", "reason": ""}]


def test_tritonclient_http_inference_statistics(triton) -> None:
    before = triton.get_inference_statistics(MODEL)["model_stats"][0]
    triton.infer(MODEL, [token_tensor()], parameters={"max_new_tokens": 2})
    (after,) = triton.get_inference_statistics()["model_stats"]  # every model's: this one
    assert after["name"] == MODEL
    assert after["inference_count"] == before["inference_count"] + 1
    stats = after["inference_stats"]
    assert stats["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert isinstance(stats["success"]["ns"], int) and stats["success"]["ns"] > 0
    assert stats["compute_input"] == {"count": 0, "ns": 0}  # Triton writes every duration


def token_tensor(binary_data: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput("input0", [len(PROMPT_IDS)], "UINT32")
    tensor.set_data_from_numpy(np.array(PROMPT_IDS, dtype=np.uint32), binary_data=binary_data)
    return tensor


@pytest.mark.parametrize("binary_data", [True, False], ids=["binary", "json"])
def test_tritonclient_http_token_infer(triton, binary_data) -> None:
    output = httpclient.InferRequestedOutput("output0", binary_data=binary_data)
    result = triton.infer(MODEL, [token_tensor(binary_data)], outputs=[output], request_id="tc-http",
                          parameters={"max_new_tokens": 4, "do_sample": False})
    tokens = result.as_numpy("output0")
    assert tokens.dtype == np.uint32
    assert tokens.shape[0] == 1 and 1 <= tokens.shape[1] <= 4
    assert tokens[0, 0] == 7042  # " Paris", greedily
    response = result.get_response()
    assert response["id"] == "tc-http"
    assert ("parameters" in response["outputs"][0]) is binary_data  # binary_data_size


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_http_compressed_request(triton, algorithm) -> None:
    """tritonclient.http compresses the body and says so in Content-Encoding (Triton decodes
    gzip and deflate)."""
    result = triton.infer(MODEL, [token_tensor()], request_compression_algorithm=algorithm,
                          parameters={"max_new_tokens": 1, "do_sample": False})
    assert result.as_numpy("output0").tolist() == [[7042]]  # " Paris", greedily


def test_an_unsupported_content_encoding_is_415_with_the_accepted_ones(gateway, client_files
                                                                       ) -> None:
    connection = connect(gateway.url("business"), client_files)
    try:
        connection.request("POST", model_path("generate"), b'{"text_input": "Hi"}',
                           {"Content-Type": "application/json", "Content-Encoding": "br"})
        response = connection.getresponse()
        reply = json.loads(response.read())
    finally:
        connection.close()
    assert (response.status, response.getheader("Accept-Encoding")) == (415, "gzip, deflate")
    assert reply["error"].startswith("Content-Encoding: 'br' is not supported")


# 3. stopInfer ---------------------------------------------------------------------------------

def test_stop_infer_ends_a_stream_early(gateway, client_files) -> None:
    request_id = unique_id("stop")
    with open_stream(gateway.url("business"), client_files, long_generation(request_id)) as stream:
        events = stream.events()
        received = [next(events) for _ in range(3)]
        status, reply = request(gateway.url("business"), client_files, model_path("stopInfer"),
                                {"id": request_id})
        assert (status, reply) == (200, {"id": request_id, "num_stopped": 1})
        received += list(events)
    last = received[-1]["details"]
    assert last["finish_reason"] == "stopped"
    assert last["generated_tokens"] < 200
    assert all("finish_reason" not in event["details"] for event in received[:-1])


def test_stop_infer_of_an_unknown_id_is_not_found(gateway, client_files) -> None:
    status, reply = request(gateway.url("business"), client_files, model_path("stopInfer"),
                            {"id": unique_id("nobody")})
    assert status == 404
    assert isinstance(reply["error"], str)


@pytest.mark.parametrize("body", [{}, {"id": ""}, {"id": "bad id"}, {"id": "x" * 257}],
                         ids=["missing", "empty", "space", "too-long"])
def test_stop_infer_of_an_invalid_id_is_422_naming_it(gateway, client_files, body) -> None:
    """MindIE's stopInfer: ids match ^[a-zA-Z0-9_-]{1,256}$; 422 otherwise."""
    status, reply = request(gateway.url("business"), client_files, model_path("stopInfer"), body)
    assert status == 422, reply
    assert reply["error"].startswith("id: "), reply


# 4 and 7. getSlotCount, and a client gone mid-stream ------------------------------------------

def test_slots_are_back_within_a_second_after_a_client_drops_a_stream(gateway,
                                                                      client_files) -> None:
    idle = slot_count(gateway, client_files)
    assert set(idle) == {"total_slots", "free_slots", "available_tokens_length"}
    assert idle["free_slots"] == idle["total_slots"] > 0
    assert idle["available_tokens_length"] > 0
    with open_stream(gateway.url("business"), client_files,
                     long_generation(unique_id("drop"))) as stream:
        events = stream.events()
        next(events), next(events)
        busy = slot_count(gateway, client_files)
        assert busy["free_slots"] == idle["total_slots"] - 1
        assert busy["available_tokens_length"] < idle["available_tokens_length"]
        stream.drop()
    final, elapsed = poll(lambda: slot_count(gateway, client_files), lambda now: now == idle,
                          deadline_s=SLOTS_BACK_WITHIN_S)
    assert final == idle, f"after {elapsed:.2f} s"


def test_server_aborts_the_request_of_a_client_gone_mid_stream(gateway, grpc_server,
                                                                client_files) -> None:
    client_id = unique_id("gone")
    with open_stream(gateway.url("business"), client_files, long_generation(client_id)) as stream:
        events = stream.events()
        next(events), next(events)
        started = re.search(rf"request (\w+) \(client id '{client_id}'\)", grpc_server.log_text())
        assert started, "the server logged no start for the request"
        stream.drop()
    aborted = re.compile(rf"request {started[1]}(#\d+)? aborted")  # #n: the sequence
    log, elapsed = poll(grpc_server.log_text, aborted.search, deadline_s=5)
    assert aborted.search(log), f"not aborted after {elapsed:.1f} s; server log:\n{log[-3000:]}"


# 5. Ranges, not-found and malformed bodies ----------------------------------------------------

INPUT0 = {"name": "input0", "shape": [1, 2], "datatype": "UINT32", "data": PROMPT_IDS[:2]}


def infer_body(**changes) -> dict:
    """A valid one-token /infer request, with `changes`: top-level keys, or `parameters`
    entries given as parameter=value."""
    body: dict = {"id": "range-ok", "inputs": [INPUT0], "outputs": [{"name": "output0"}],
                  "parameters": {"max_new_tokens": 1}}
    for key, value in changes.items():
        if key in ("id", "inputs", "outputs"):
            body[key] = value
        elif key.startswith("input0_"):
            body["inputs"] = [{**INPUT0, key.removeprefix("input0_"): value}]
        else:
            body["parameters"] = {**body["parameters"], key: value}
    return body


OUT_OF_RANGE = [
    pytest.param(infer_body(id="x" * 257), "id", id="id-too-long"),
    pytest.param(infer_body(id="a b"), "id", id="id-with-space"),
    pytest.param(infer_body(inputs=[INPUT0, INPUT0]), "inputs", id="two-inputs"),
    pytest.param(infer_body(input0_name="input1"), "inputs", id="input-name"),
    pytest.param(infer_body(input0_datatype="INT32"), "datatype", id="datatype-int32"),
    pytest.param(infer_body(input0_shape=[2, 5], input0_data=PROMPT_IDS * 2), "shape",
                 id="shape-2-rows"),
    pytest.param(infer_body(input0_shape=[1, 3]), "input0", id="shape-vs-data"),
    pytest.param(infer_body(input0_shape=[1, 0], input0_data=[]), "input0", id="empty-data"),
    pytest.param(infer_body(input0_data=[504, VOCAB_SIZE]), "input0", id="token-outside-vocab"),
    pytest.param(infer_body(outputs=[{"name": "output0"}, {"name": "output0"}]), "outputs",
                 id="two-outputs"),
    pytest.param(infer_body(temperature=0), "temperature", id="temperature-0"),
    pytest.param(infer_body(top_k=-1), "top_k", id="top_k--1"),
    pytest.param(infer_body(top_p=0), "top_p", id="top_p-0"),
    pytest.param(infer_body(top_p=1.5), "top_p", id="top_p-1.5"),
    pytest.param(infer_body(seed=0), "seed", id="seed-0"),
    pytest.param(infer_body(repetition_penalty=0), "repetition_penalty", id="repetition_penalty-0"),
    pytest.param(infer_body(max_new_tokens=0), "max_new_tokens", id="max_new_tokens-0"),
    pytest.param(infer_body(priority=0), "priority", id="priority-0"),
    pytest.param(infer_body(priority=6), "priority", id="priority-6"),
    pytest.param(infer_body(timeout=0), "timeout", id="timeout-0"),
    pytest.param(infer_body(timeout=3601), "timeout", id="timeout-3601"),
]


@pytest.mark.parametrize(("body", "field"), OUT_OF_RANGE)
def test_out_of_range_infer_is_refused_naming_the_field(gateway, client_files, body, field) -> None:
    status, reply = request(gateway.url("business"), client_files, model_path("infer"), body)
    assert 400 <= status < 500, reply
    assert field in reply["error"]
    status, reply = request(gateway.url("business"), client_files, model_path("infer"),
                            infer_body())
    assert status == 200, reply
    assert reply["outputs"][0]["shape"] == [1, 1]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_out_of_range_generate_is_refused_naming_the_field(gateway, client_files, route) -> None:
    body = {"text_input": "Hi", "parameters": {"max_new_tokens": 1, "top_p": 1.5}}
    status, reply = request(gateway.url("business"), client_files, model_path(route), body)
    assert status == 400
    assert "top_p" in reply["error"]


@pytest.mark.parametrize("route", ["", "/ready", "/config", "/stats", "/infer", "/generate"])
def test_unknown_model_is_not_found(gateway, client_files, route) -> None:
    body = {"/infer": infer_body(), "/generate": {"text_input": "Hi"}}.get(route)
    status, reply = request(gateway.url("business"), client_files,
                            f"/v2/models/no-such-model{route}", body)
    assert status == 404
    assert "no-such-model" in reply["error"]


@pytest.mark.parametrize(("method", "body"), [("GET", None), ("POST", b'{"x": 1}'),
                                            ("DELETE", None)])
def test_an_unknown_route_is_a_404_on_a_connection_that_stays_open(gateway, client_files,
                                                                   method, body) -> None:
    """A pooled client's next request goes on the same connection."""
    connection = connect(gateway.url("business"), client_files)
    try:
        connection.request(method, "/v1/no-such-route", body)
        response = connection.getresponse()
        assert response.status == 404
        assert "no route for" in json.loads(response.read())["error"]
        assert response.getheader("Connection") != "close"
        connection.request("GET", "/v2/health/live")
        assert connection.getresponse().status == 200
    finally:
        connection.close()


@pytest.mark.parametrize("route", ["infer", "generate", "generate_stream", "stopInfer"])
@pytest.mark.parametrize("body", [b'{"inputs":', b"nope", b"\xff\xfe{}", b"[]", b'"text"'],
                         ids=["truncated", "not-json", "not-utf8", "array", "string"])
def test_malformed_json_is_a_400(gateway, client_files, route, body) -> None:
    status, reply = request(gateway.url("business"), client_files, model_path(route), body)
    assert status == 400
    assert isinstance(reply["error"], str) and "Traceback" not in reply["error"]


# Metrics plane: every answered request is counted -------------------------------------------

def test_metrics_count_answered_requests(gateway, client_files) -> None:
    assert request(gateway.url("business"), client_files, "/v2/health/live")[0] == 200
    status, text = fetch(gateway.url("metrics"), client_files, "/metrics")
    assert status == 200
    counted = r'switchboard_http_requests_total\{[^}]*route="health_live"[^}]*\} [1-9]'
    assert re.search(counted, text.decode())
