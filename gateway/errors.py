"""Errors the gateway renders: its own (a body that is not the JSON the route takes) and the
gRPC statuses of the server, mapped to HTTP statuses per protocol family."""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

# Every protocol's table, as KServe v2 / Triton / MindIE's Triton routes answer; the others
# differ from it in a few statuses (TGI's and MindIE's validation 422, TGI's full queue 429).
# A status not in a table is 500.
KSERVE_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ALREADY_EXISTS: 400,
    grpc.StatusCode.CANCELLED: 400,
    # The server refusing the gateway's own certificate: no fault of the client's.
    grpc.StatusCode.UNAUTHENTICATED: 503,
    grpc.StatusCode.PERMISSION_DENIED: 503,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 503,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}
# Statuses whose server message is for operators, not clients, except messages that start
# with one of PUBLIC_UNAVAILABLE.
PUBLIC_UNAVAILABLE = ("the model is not ready", "the server is stopping")
# The server refusing the gateway's own credentials, which only the gateway's log explains.
CREDENTIAL_STATUSES = frozenset({grpc.StatusCode.UNAUTHENTICATED,
                                 grpc.StatusCode.PERMISSION_DENIED})
UNAVAILABLE_MESSAGE = "the inference server is unavailable; retry later"
OPAQUE_STATUSES = {
    **dict.fromkeys({grpc.StatusCode.UNAVAILABLE, *CREDENTIAL_STATUSES}, UNAVAILABLE_MESSAGE),
    grpc.StatusCode.INTERNAL: "internal error",
    grpc.StatusCode.UNKNOWN: "internal error",
    grpc.StatusCode.DATA_LOSS: "internal error",
}


class RequestError(Exception):
    """An HTTP request the gateway refuses before calling the server (status, message, and
    the field at fault when there is one, with the reason the message gives after its name)."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.reason = reason


def bad_request(field: str, reason: str) -> RequestError:
    if not field:
        return RequestError(400, reason)
    return RequestError(400, f"{field}: {reason}", field, reason)


def field_violation(error: grpc.aio.AioRpcError) -> tuple[str, str] | None:
    """The field the server refused and why, from its rich status (a `google.rpc.BadRequest`
    field violation); None when the status names no field."""
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # a status whose details disagree with its code: none of ours
        return None
    for detail in status.details if status is not None else ():
        request = error_details_pb2.BadRequest()
        if detail.Unpack(request) and request.field_violations:
            violation = request.field_violations[0]
            return violation.field, violation.description
    return None


def field_in_protocol(field: str, reason: str, names: Mapping[str, str]) -> tuple[str, str]:
    """A refused field (the server's path, such as `stop[1]`) and its message, both under the
    protocol's names (`names` maps the protocol's names to MindIE's)."""
    theirs = {server: protocol for protocol, server in names.items()}
    if field in theirs:  # a path named whole (the Responses API's tool_choice.name)
        return theirs[field], f"{theirs[field]}: {reason}"
    base = field.split("[", 1)[0].split(".", 1)[0]
    ours = theirs.get(base)
    protocol_field = field if ours is None else ours + field[len(base):]
    return protocol_field, f"{protocol_field}: {reason}"


def http_status(code: grpc.StatusCode, table: dict[grpc.StatusCode, int]) -> int:
    return table.get(code, 500)


def client_message(code: grpc.StatusCode, details: str | None) -> str:
    """What a client reads: the server's message naming the field, or a generic one."""
    if code in OPAQUE_STATUSES and not (code is grpc.StatusCode.UNAVAILABLE and details
                                        and details.startswith(PUBLIC_UNAVAILABLE)):
        return OPAQUE_STATUSES[code]
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and not details:
        return "the request timed out"
    return details or code.name.lower()
