"""Engine error → gRPC status: the one table."""

from __future__ import annotations

import logging

import grpc

from switchboard.engine.errors import (EngineDead, EngineError, GenerationFailed, InvalidRequest, NotFound,
                           Overloaded, RequestTimedOut)

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


def refusal(error: EngineError) -> tuple[grpc.StatusCode, str]:
    """The status and message of a request that ends with `error`, logged in one line: the
    server's own record of what it refused, for clients that call it directly too."""
    code = status_for(error)
    logger.info("request ended with %s: %s", code.name, error.message)
    return code, error.message
