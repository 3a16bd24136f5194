"""The seam between the engine and whatever serves it (a fake implements it in server tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from switchboard.engine.async_engine import ModelInfo
from switchboard.engine.chat import ChatPrompt
from switchboard.engine.config import EngineLimits
from switchboard.engine.core import EngineStats
from switchboard.engine.params import GenerationRequest
from switchboard.engine.request import RequestOutput


class EngineClient(Protocol):
    limits: EngineLimits
    info: ModelInfo

    @property
    def is_healthy(self) -> bool: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_with_spans(self, text: str, add_special_tokens: bool = True
                          ) -> tuple[list[int], list[tuple[int, int]]]: ...

    def render_chat(self, prompt: ChatPrompt) -> str: ...

    def encode_chat(self, prompt: ChatPrompt) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def token_texts(self, token_ids: Sequence[int]) -> list[str]: ...

    def vocabulary_strings(self, token_ids: Sequence[int]) -> list[str]: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]: ...

    def abort(self, request_id: str) -> None: ...

    def stop(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...
