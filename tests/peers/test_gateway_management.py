"""MindIE's management plane and the metrics plane end to end: the deep health probe,
/v1/config, /v1/status, /v1/role, /metrics-json and Prometheus' /metrics, read with real HTTPS
clients (mutual TLS) from the gateway in front of the real server and model.

Imports none of our packages (see gateway_clients); prometheus_client parses /metrics.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from conftest import start_gateway
from gateway_clients import (MODEL, fetch, long_generation, open_stream, poll, request,
                             unique_id)
from prometheus_client.parser import text_string_to_metric_families

INFER = {"inputs": "The capital of France is",
         "parameters": {"max_new_tokens": 3, "do_sample": False}}
METRICS_JSON_NAMES = {"TTFT", "TBT", "waitingInferRequestNum", "processingInferRequestNum",
                      "remainBlocks"}
GIB = 2**30


def management(gateway, client_files, path: str, body: object = None) -> tuple[int, object]:
    return request(gateway.url("management"), client_files, path, body)


def ok(reply: tuple[int, object]) -> object:
    status, document = reply
    assert status == 200, document
    return document


def assert_mindie_error(reply: tuple[int, object], status: int, error_type: str) -> None:
    assert reply[0] == status, reply
    document = reply[1]
    assert set(document) == {"error", "error_type"}, document
    assert document["error_type"] == error_type
    assert isinstance(document["error"], str) and document["error"]


def infer(gateway, client_files) -> None:
    status, document = request(gateway.url("business"), client_files, "/infer", INFER)
    assert status == 200, document


def status_resource(gateway, client_files) -> dict:
    return ok(management(gateway, client_files, "/v1/status"))["resource"]


def idle_resource(gateway, client_files) -> dict:
    """/v1/status's resource once no request runs or waits (an earlier stream that a client
    dropped leaves within an engine step)."""
    resource, _ = poll(lambda: status_resource(gateway, client_files),
                       lambda resource: resource["runningRequestNum"] ==
                       resource["waitingRequestNum"] == 0, deadline_s=10)
    return resource


def scrape(gateway, client_files) -> dict[str, list]:
    """/metrics parsed by prometheus_client: the samples by name."""
    status, body = fetch(gateway.url("metrics"), client_files, "/metrics")
    assert status == 200, body
    samples = defaultdict(list)
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[sample.name].append(sample)
    return samples


def sample_value(samples: dict[str, list], name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels`; 0 when there is none yet."""
    matching = [sample.value for sample in samples[name] if labels.items() <= sample.labels.items()]
    assert len(matching) <= 1, (name, labels, matching)
    return matching[0] if matching else 0.0


def metrics_json_values(gateway, client_files) -> dict[str, str]:
    """/metrics-json in MindIE's documented shape: each value by its name."""
    document = ok(management(gateway, client_files, "/metrics-json"))
    assert document["resultType"] == "vector"
    assert len(document["result"]) == len(METRICS_JSON_NAMES)
    instance = urlsplit(gateway.url("management")).netloc
    values = {}
    for item in document["result"]:
        (metric,) = item["metric"]
        assert metric["instance"] == instance
        values[metric["__name__"]] = item["value"]
    assert set(values) == METRICS_JSON_NAMES
    assert all(isinstance(value, str) and value.isdigit() for value in values.values()), values
    return values


# 1. The deep health probe ----------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/health/timed", "/health/timed-5"])
def test_health_timed_generates_a_token_and_answers_healthy(gateway, client_files, path) -> None:
    assert management(gateway, client_files, path) == (200, {"status": "healthy"})


@pytest.mark.parametrize("seconds", ["0", "601", "abc"])
def test_health_timed_outside_1_to_600_seconds_is_no_route(gateway, client_files,
                                                          seconds) -> None:
    assert_mindie_error(management(gateway, client_files, f"/health/timed-{seconds}"), 404,
                        "NotFoundError")


# 2. /v1/config ---------------------------------------------------------------------------------

def test_config_has_mindies_keys_consistent_with_the_model_config(gateway, grpc_server,
                                                                  client_files) -> None:
    config = ok(management(gateway, client_files, "/v1/config"))
    model = grpc_server.model_name
    parameters = {key: value["string_value"] for key, value in ok(request(
        gateway.url("business"), client_files, f"/v2/models/{model}/config"))["parameters"].items()}
    assert config["modelName"] == model
    assert {key: config[key] for key in ("maxSeqLen", "maxInputTokenLen", "maxOutputLen",
                                         "maxBatchSize", "cacheBlockSize", "worldSize")} == {
        "maxSeqLen": int(parameters["max_seq_len"]),
        "maxInputTokenLen": int(parameters["max_input_len"]),
        "maxOutputLen": int(parameters["max_iter_times"]),
        "maxBatchSize": int(parameters["max_running_requests"]),
        "cacheBlockSize": int(parameters["block_size"]),
        "worldSize": 1}
    assert config["npuMemSize"] == pytest.approx(int(parameters["kv_cache_bytes"]) / GIB,
                                                 abs=1e-3)
    assert config["cpuMemSize"] == 0
    assert 0 < config["maxInputTokenLen"] <= config["maxSeqLen"]
    info = ok(request(gateway.url("business"), client_files, "/info"))
    assert (info["max_total_tokens"], info["max_input_length"]) == (
        config["maxSeqLen"], config["maxInputTokenLen"])
    # The packaged .gguf model is served in its own quantization by default.
    assert (info["model_dtype"], info["model_device_type"], parameters["quantization"]) == (
        "float32", "cpu", "gguf")
    slots = ok(management(gateway, client_files, f"/v2/models/{model}/getSlotCount"))
    assert slots["total_slots"] == config["maxBatchSize"]


def test_config_reveals_no_tls_material(gateway, client_files, pki) -> None:
    status, body = fetch(gateway.url("management"), client_files, "/v1/config")
    assert status == 200, body
    text = body.decode()

    def strings(node: object) -> list[str]:
        if isinstance(node, dict):
            return [*node, *(s for value in node.values() for s in strings(value))]
        if isinstance(node, list):
            return [s for value in node for s in strings(value)]
        return [str(node)]

    for word in strings(json.loads(text)):
        assert "key" not in word.lower() and "password" not in word.lower(), word
    assert ".pem" not in text and str(pki.folder) not in text
    for path in pki.folder.iterdir():
        assert path.name not in text
        assert not any(line in text for line in path.read_text().splitlines() if len(line) > 16)


# 3. /v1/status, /metrics and /metrics-json under load -----------------------------------------

def test_status_idle_is_ready_with_every_block_free(gateway, client_files) -> None:
    document = ok(management(gateway, client_files, "/v1/status"))
    assert document["service"] == {"roleStatus": "RoleReady", "currentRole": "none"}
    resource = idle_resource(gateway, client_files)
    for name in ("availSlotsNum", "availBlockNum", "waitingRequestNum", "runningRequestNum",
                 "totalNpuBlockNums", "freeNpuBlockNums"):
        assert isinstance(resource[name], int) and not isinstance(resource[name], bool), name
    assert (resource["runningRequestNum"], resource["waitingRequestNum"]) == (0, 0)
    assert resource["availBlockNum"] == resource["totalNpuBlockNums"] > 0
    assert resource["availSlotsNum"] == ok(management(gateway, client_files, "/v1/config")
                                           )["maxBatchSize"]


def test_a_stream_in_flight_shows_in_status_metrics_and_metrics_json(gateway, client_files
                                                                      ) -> None:
    request_id = unique_id("status")
    with open_stream(gateway.url("business"), client_files, long_generation(request_id)) as stream:
        events = stream.events()
        next(events)
        busy = status_resource(gateway, client_files)
        samples = scrape(gateway, client_files)
        values = metrics_json_values(gateway, client_files)
        stopped = request(gateway.url("business"), client_files,
                          f"/v2/models/{MODEL}/stopInfer", {"id": request_id})
        assert stopped[0] == 200, stopped
        assert list(events)[-1]["details"]["finish_reason"] == "stopped"
    assert busy["runningRequestNum"] >= 1
    assert busy["availBlockNum"] < busy["totalNpuBlockNums"]
    assert sample_value(samples, "vllm:num_requests_running") >= 1
    assert sample_value(samples, "vllm:kv_cache_usage_perc") > 0
    assert int(values["processingInferRequestNum"]) >= 1
    assert int(values["remainBlocks"]) < busy["totalNpuBlockNums"]
    idle = idle_resource(gateway, client_files)
    assert (idle["runningRequestNum"], idle["waitingRequestNum"]) == (0, 0)
    assert idle["availBlockNum"] == idle["totalNpuBlockNums"]


def test_metrics_json_reports_latencies_after_requests(gateway, client_files) -> None:
    infer(gateway, client_files)
    values = metrics_json_values(gateway, client_files)
    assert int(values["TTFT"]) > 0 and int(values["TBT"]) > 0
    assert values["processingInferRequestNum"] == values["waitingInferRequestNum"] == "0"
    assert int(values["remainBlocks"]) == status_resource(gateway, client_files)["availBlockNum"]


def test_metrics_has_vllms_names_and_the_gateways_and_servers_own(gateway, client_files) -> None:
    samples = scrape(gateway, client_files)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "switchboard_http_requests_total",
                 "switchboard_server_process_resident_memory_bytes",
                 "switchboard_gateway_process_resident_memory_bytes"):
        assert samples[name], name
    assert sample_value(samples, "switchboard_upstream_up") == 1
    assert sample_value(samples, "switchboard_server_process_resident_memory_bytes") > 0
    assert sample_value(samples, "switchboard_gateway_process_resident_memory_bytes") > 0


def test_metrics_count_each_request_once(gateway, client_files) -> None:
    """N /infer requests move the route's counter and the TTFT histogram by exactly N; the
    /health/timed probe's own generation is not counted."""
    infers = {"route": "mindie_infer", "code": "200", "method": "POST", "plane": "business"}
    before = scrape(gateway, client_files)
    requests = 3
    for _ in range(requests):
        infer(gateway, client_files)
    assert management(gateway, client_files, "/health/timed")[0] == 200
    after = scrape(gateway, client_files)
    for name, labels in (("switchboard_http_requests_total", infers),
                         ("vllm:time_to_first_token_seconds_count", {}),
                         ("vllm:e2e_request_latency_seconds_count", {})):
        moved = sample_value(after, name, **labels) - sample_value(before, name, **labels)
        assert moved == requests, name


# 4. Routes of prefill/decode disaggregation, and TGI's probes on the management plane ---------

def test_a_role_body_mindie_refuses_is_422_naming_its_field(gateway, client_files) -> None:
    """(tests/peers/test_prefill_decode.py assigns roles to a pair of its own.)"""
    status, document = management(gateway, client_files, "/v1/role/prefill", {"peers": []})
    assert status == 422 and document["error"].startswith("local: must be an object")
    assert document["error_type"] == "Input Validation Error"


def test_dresult_outside_a_decode_role_is_400_as_mindie_answers(gateway, client_files) -> None:
    status, document = request(gateway.url("business"), client_files, "/dresult")
    assert status == 400, document
    assert document == {"error": "Non DMI does not support dresult request",
                        "error_type": "Bad Request"}


def test_health_and_info_answer_on_the_management_plane(gateway, grpc_server,
                                                        client_files) -> None:
    assert fetch(gateway.url("management"), client_files, "/health") == (200, b"")
    info = ok(management(gateway, client_files, "/info"))
    assert info["model_id"] == grpc_server.model_name


# 5. A gateway whose server is unreachable -------------------------------------------------------

@pytest.fixture(scope="module")
def orphan_gateway(pki) -> Iterator:
    """A gateway whose upstream address has no server (nothing listens on port 1)."""
    gateway = start_gateway(pki.folder, "127.0.0.1:1")
    yield gateway
    assert gateway.stop() == 0, gateway.log_text()


def test_without_a_server_probes_fail_and_metrics_say_upstream_down(orphan_gateway,
                                                                     client_files) -> None:
    assert_mindie_error(management(orphan_gateway, client_files, "/health/timed-5"), 500,
                        "Incomplete Generation")
    assert_mindie_error(management(orphan_gateway, client_files, "/v1/status"), 503,
                        "Service Unavailable")
    samples = scrape(orphan_gateway, client_files)
    assert sample_value(samples, "switchboard_upstream_up") == 0
    assert not any(name.startswith(("vllm:", "switchboard_server_")) for name in samples)
