"""MindIE's management routes (/health/timed-N, /v1/config, /v1/status, /metrics-json) from
switchboard.v1 replies, and the gateway's graceful stop, without a network."""

from __future__ import annotations

import asyncio

import pytest

from switchboard.gateway.roles import Roles
from switchboard.gateway.errors import RequestError
from switchboard.gateway.lifecycle import Lifecycle
from switchboard.gateway.protocols.mindie_management import (GIB, config_json, health_timeout, metrics_json,
                                                 status_json)
from switchboard.proto import switchboard_pb2 as sb

PARAMETERS = {"max_seq_len": "2048", "max_input_len": "2047", "max_iter_times": "512",
              "max_running_requests": "8", "block_size": "16", "kv_cache_bytes": str(3 * GIB // 2),
              "world_size": "1", "device": "cpu", "dtype": "float32", "vocab_size": "49152"}


@pytest.mark.parametrize(("seconds", "expected"), [(None, 10), ("1", 1), ("600", 600)])
def test_health_timeout_defaults_to_10_and_takes_1_to_600(seconds: str | None,
                                                           expected: int) -> None:
    assert health_timeout(seconds) == expected


@pytest.mark.parametrize("seconds", ["0", "601", "-1", "abc", "", "1.5", "²", "٣"])
def test_other_health_timeouts_are_no_route(seconds: str) -> None:
    with pytest.raises(RequestError) as caught:
        health_timeout(seconds)
    assert caught.value.status == 404


def test_config_reads_the_models_parameters_under_mindies_keys() -> None:
    config = config_json("smollm2", PARAMETERS)
    assert {key: config[key] for key in (
        "modelName", "maxSeqLen", "maxInputTokenLen", "maxOutputLen", "maxBatchSize",
        "cacheBlockSize", "worldSize", "npuMemSize", "cpuMemSize")} == {
        "modelName": "smollm2", "maxSeqLen": 2048, "maxInputTokenLen": 2047, "maxOutputLen": 512,
        "maxBatchSize": 8, "cacheBlockSize": 16, "worldSize": 1, "npuMemSize": 1.5,
        "cpuMemSize": 0}


def test_config_before_the_model_is_loaded_is_unavailable() -> None:
    with pytest.raises(RequestError) as caught:
        config_json("smollm2", {})
    assert caught.value.status == 503


@pytest.mark.parametrize(("ready", "role_status"), [(True, "RoleReady"), (False, "RoleUnknown")])
def test_status_reports_the_role_and_resources(ready: bool, role_status: str) -> None:
    status = status_json(sb.GetStatusResponse(
        ready=ready, max_running_requests=8, running_requests=2, waiting_requests=1,
        free_slots=5, free_blocks=25, total_blocks=100),
        Roles(lambda: 1026, lambda: None).status_json())
    assert status["service"] == {"roleStatus": role_status, "currentRole": "none"}
    assert status["resource"] == {
        "availSlotsNum": 5, "availBlockNum": 25, "waitingRequestNum": 1, "runningRequestNum": 2,
        "swappedRequestNum": 0, "freeNpuBlockNums": 25, "freeCpuBlockNums": 0,
        "totalNpuBlockNums": 100, "totalCpuBlockNums": 0}
    assert status["linkStatus"] == {"peers": []}


def test_metrics_json_is_a_vector_of_five_string_values_ttft_in_ms() -> None:
    metrics = metrics_json(sb.GetStatusResponse(
        mean_time_to_first_token_s=0.0123, mean_time_between_tokens_s=0.0456,
        waiting_requests=3, running_requests=2, free_blocks=25), instance="10.0.0.1:1027")
    assert metrics["resultType"] == "vector"
    assert [(result["metric"], result["value"]) for result in metrics["result"]] == [
        ([{"__name__": name, "job": "node", "instance": "10.0.0.1:1027"}], value)
        for name, value in (("TTFT", "12"), ("TBT", "46"), ("waitingInferRequestNum", "3"),
                            ("processingInferRequestNum", "2"), ("remainBlocks", "25"))]


def test_lifecycle_counts_requests_in_flight_and_refuses_new_ones_once_stopping() -> None:
    lifecycle = Lifecycle()
    lifecycle.enter()
    lifecycle.enter()
    lifecycle.leave()
    assert lifecycle.in_flight == 1
    assert lifecycle.begin_stop() is True
    assert lifecycle.begin_stop() is False
    with pytest.raises(RequestError) as caught:
        lifecycle.enter()
    assert caught.value.status == 503
    assert lifecycle.in_flight == 1


def test_drained_returns_at_once_when_idle_and_waits_for_a_request_in_flight() -> None:
    async def main() -> None:
        lifecycle = Lifecycle()
        await asyncio.wait_for(lifecycle.drained(), timeout=1)
        lifecycle.enter()
        lifecycle.begin_stop()
        drained = asyncio.create_task(lifecycle.drained())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not drained.done()
        lifecycle.leave()
        await asyncio.wait_for(drained, timeout=1)

    asyncio.run(main())
