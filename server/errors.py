"""Engine error → gRPC status: the one table."""

from __future__ import annotations

import grpc

from engine.errors import (EngineDead, EngineError, GenerationFailed, InvalidRequest, NotFound,
                           Overloaded, RequestTimedOut)

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
