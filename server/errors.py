"""Engine error → gRPC status: the one table. A refused field also travels as gRPC's rich
error model (`google.rpc.Status` with a `google.rpc.BadRequest` field violation), which
grpcurl and every gRPC client can read without parsing the message."""

from __future__ import annotations

import logging

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from switchboard.engine.errors import (EngineDead, EngineError, GenerationFailed, InvalidRequest,
                                       NotFound, Overloaded, RequestTimedOut)

logger = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[EngineError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NotFound: grpc.StatusCode.NOT_FOUND,
    RequestTimedOut: grpc.StatusCode.DEADLINE_EXCEEDED,
    EngineDead: grpc.StatusCode.UNAVAILABLE,
    GenerationFailed: grpc.StatusCode.INTERNAL,
}


def status_for(error: EngineError) -> grpc.StatusCode:
    """The status of the nearest listed base class (PromptTooLong is an InvalidRequest)."""
    for kind in type(error).__mro__:
        if kind in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[kind]
    return grpc.StatusCode.INTERNAL


def refusal(error: EngineError) -> grpc.Status:
    """The status of a request that ends with `error` (code, details and, for a refused
    field, the rich status in the trailing metadata: `context.abort(*refusal(error))`),
    logged in one line: the server's own record of what it refused, for clients that call it
    directly too."""
    code = status_for(error)
    logger.info("request ended with %s: %s", code.name, error.message)
    status = status_pb2.Status(code=code.value[0], message=error.message)
    if isinstance(error, InvalidRequest):
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=error.field,
                                                        description=error.reason)]))
        status.details.append(detail)
    return rpc_status.to_status(status)
