"""JSON values → KServe v2 InferParameter, and MindIE's REST priority and timeout → Triton's
reserved gRPC parameters. Ranges are the server's to check; only what changes meaning on the
way is checked here (REST's timeout 0 and priority 0 are errors, gRPC's mean "default")."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from switchboard.gateway.errors import bad_request
from switchboard.proto import grpc_service_pb2 as pb

INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
UINT32_MAX = 2**32 - 1
MICROSECONDS = 1_000_000


def to_parameter(name: str, value: object) -> pb.InferParameter:
    """bool, int, float, str; a list becomes a JSON-array string (as `stop` travels)."""
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        if -INT64_MAX - 1 <= value <= INT64_MAX:
            return pb.InferParameter(int64_param=value)
        if INT64_MAX < value <= UINT64_MAX:
            return pb.InferParameter(uint64_param=value)
        raise bad_request(name, f"{value} does not fit in 64 bits")
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    if isinstance(value, str):
        return pb.InferParameter(string_param=value)
    if isinstance(value, list):
        return pb.InferParameter(string_param=json.dumps(value))
    raise bad_request(name, f"must be a number, a string, a boolean or a list; got {json_type(value)}")


def set_parameters(target: Mapping[str, pb.InferParameter], values: Mapping[str, object]) -> None:
    """Copy `values` (null ones are absent) into a request's parameter map, MindIE's
    `priority` (1 highest) and `timeout` (seconds) converted."""
    for name, value in values.items():
        if value is None:
            continue
        # Out-of-range values are the server's to refuse; they only must fit on the way.
        if name == "priority":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad_request("priority", f"must be a positive integer (1 highest); got "
                                  f"{json.dumps(value)}")
            target[name].uint64_param = min(value, UINT64_MAX)
        elif name == "timeout":
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 < value < math.inf:
                raise bad_request("timeout", f"must be a positive number of seconds; got "
                                  f"{json.dumps(value)}")
            # At least 1 us: 0 would mean the default.
            capped = min(value, INT64_MAX // MICROSECONDS)
            target[name].int64_param = min(max(1, round(capped * MICROSECONDS)), INT64_MAX)
        else:
            target[name].CopyFrom(to_parameter(name, value))


def parameters_timeout_s(parameters: Mapping[str, pb.InferParameter]) -> float | None:
    """The `timeout` a KServe request's parameters ask for, in seconds (None: none)."""
    if "timeout" not in parameters:
        return None
    return parameters["timeout"].int64_param / MICROSECONDS


def parameter_value(parameter: pb.InferParameter) -> object:
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None


def json_type(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")
