"""The seam between the engine and whatever serves it (a fake implements it in server tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from switchboard.engine.async_engine import ModelInfo
from switchboard.engine.config import EngineLimits
from switchboard.engine.core import EngineStats
from switchboard.engine.kv_transfer import PrefilledKV
from switchboard.engine.params import GenerationRequest
from switchboard.engine.request import RequestOutput
from switchboard.engine.tokenization import PromptTokenizer


class EngineClient(Protocol):
    limits: EngineLimits
    info: ModelInfo
    prompts: PromptTokenizer

    @property
    def is_healthy(self) -> bool: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def token_texts(self, token_ids: Sequence[int]) -> list[str]: ...

    def generate(self, request: GenerationRequest, prefilled: PrefilledKV | None = None, *,
                 streamed: bool = True) -> AsyncIterator[RequestOutput]: ...

    async def read_kv(self, transfer_id: str) -> PrefilledKV: ...

    def release_kv(self, transfer_id: str) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def stop(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...
