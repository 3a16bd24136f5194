"""MindIE's management routes ⇄ switchboard.v1 Management and KServe v2: /health/timed[-N],
/v1/config, /v1/status and /metrics-json.

The instance's prefill/decode role and its peers' links come from `roles.py`. MindIE's "Npu"
block and memory fields describe the engine's KV cache on whatever device runs the model; its
"Cpu" ones describe a swap space, which Switchboard does not have (0).
"""

from __future__ import annotations

from collections.abc import Mapping

from switchboard.gateway.errors import RequestError
from switchboard.proto import switchboard_pb2 as sb

DEFAULT_HEALTH_TIMEOUT_S = 10
MAX_HEALTH_TIMEOUT_S = 600
GIB = 2**30
MILLISECONDS = 1000


def health_timeout(seconds: str | None) -> int:
    """N of /health/timed-N: an integer in [1, 600]; other values are no route (404)."""
    if seconds is None:
        return DEFAULT_HEALTH_TIMEOUT_S
    digits_ok = seconds.isascii() and seconds.isdigit() and len(seconds.lstrip("0")) <= 3
    if not digits_ok or not 1 <= int(seconds) <= MAX_HEALTH_TIMEOUT_S:
        raise RequestError(404, f"no route for /health/timed-{seconds}: the timeout must be an "
                           f"integer number of seconds in [1, {MAX_HEALTH_TIMEOUT_S}]")
    return int(seconds)


def config_json(model_name: str, parameters: Mapping[str, str]) -> dict[str, object]:
    """MindIE's /v1/config from the model config's parameters (the model must be loaded)."""
    if "max_seq_len" not in parameters:
        raise RequestError(503, "the model is not loaded yet")
    kv_cache_gib = int(parameters["kv_cache_bytes"]) / GIB
    return {
        "modelName": model_name,
        "maxSeqLen": int(parameters["max_seq_len"]),
        "maxInputTokenLen": int(parameters["max_input_len"]),
        "maxOutputLen": int(parameters["max_iter_times"]),
        "maxIterTimes": int(parameters["max_iter_times"]),
        "maxBatchSize": int(parameters["max_running_requests"]),
        "cacheBlockSize": int(parameters["block_size"]),
        "npuMemSize": round(kv_cache_gib, 3),
        "cpuMemSize": 0,
        "worldSize": int(parameters["world_size"]),
        "device": parameters["device"],
        "dtype": parameters["dtype"],
    }


def status_json(status: sb.GetStatusResponse, roles: Mapping[str, Mapping[str, object]]
                ) -> dict[str, object]:
    """roles: the instance's prefill/decode `service` and `linkStatus` (see `roles.py`); the
    role status is RoleUnknown while the server is not ready."""
    service = roles["service"] if status.ready else {**roles["service"],
                                                     "roleStatus": "RoleUnknown"}
    return {
        "service": service,
        "resource": {
            "availSlotsNum": status.free_slots,
            "availBlockNum": status.free_blocks,
            "waitingRequestNum": status.waiting_requests,
            "runningRequestNum": status.running_requests,
            "swappedRequestNum": 0,
            "freeNpuBlockNums": status.free_blocks,
            "freeCpuBlockNums": 0,
            "totalNpuBlockNums": status.total_blocks,
            "totalCpuBlockNums": 0,
        },
        "linkStatus": roles["linkStatus"],
    }


def metrics_json(status: sb.GetStatusResponse, instance: str) -> dict[str, object]:
    """MindIE's Prometheus-API-like vector: TTFT and TBT (ms, means over the last 1000
    requests), the waiting and running request counts and the free KV-cache blocks; values
    are strings, as MindIE's."""
    values = (("TTFT", round(status.mean_time_to_first_token_s * MILLISECONDS)),
              ("TBT", round(status.mean_time_between_tokens_s * MILLISECONDS)),
              ("waitingInferRequestNum", status.waiting_requests),
              ("processingInferRequestNum", status.running_requests),
              ("remainBlocks", status.free_blocks))
    return {"resultType": "vector",
            "result": [{"metric": [{"__name__": name, "job": "node", "instance": instance}],
                        "value": str(value)} for name, value in values]}
