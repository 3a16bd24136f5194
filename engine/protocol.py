"""The seam between the engine and whatever serves it (a fake implements it in server tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from engine.config import EngineLimits
from engine.core import EngineStats
from engine.params import GenerationRequest
from engine.request import RequestOutput


class EngineClient(Protocol):
    limits: EngineLimits

    @property
    def is_healthy(self) -> bool: ...

    def encode(self, text: str) -> list[int]: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]: ...

    def abort(self, request_id: str) -> None: ...

    def stop(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...
