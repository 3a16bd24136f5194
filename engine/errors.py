"""The engine's one error taxonomy. Servers map each kind to their protocol's status once."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine reports to a caller; `message` is safe to show a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(EngineError):
    """A request field is missing, malformed or out of range; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class PromptTooLong(InvalidRequest):
    """The prompt (or prompt + requested tokens) exceeds the configured limits."""


class Overloaded(EngineError):
    """The waiting queue is full; the caller may retry later."""


class NotFound(EngineError):
    """No such request or model."""


class RequestTimedOut(EngineError):
    """The request's own timeout passed before it finished."""

    @classmethod
    def after(cls, timeout_s: float) -> RequestTimedOut:
        return cls(f"request timed out after {timeout_s:g} s")


class EngineDead(EngineError):
    """The engine is not running (not loaded yet, stopped, or failed)."""


class GenerationFailed(EngineError):
    """The model step failed for this request; the engine itself carries on."""
