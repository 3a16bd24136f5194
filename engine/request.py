"""A request's life inside the engine (`Request`, owned by the core) and what leaves it
(`RequestOutput`, immutable)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.errors import EngineError
from engine.params import GenerationRequest


class FinishReason(enum.Enum):
    """Values are MindIE's / TGI's finish_reason strings."""

    LENGTH = "length"
    EOS = "eos_token"
    STOP = "stop_sequence"


class RequestStatus(enum.IntEnum):
    """Ordered so that `status >= FINISHED_STOPPED` means finished."""

    WAITING = 0
    RUNNING = 1
    FINISHED_STOPPED = 2
    FINISHED_ABORTED = 3
    FINISHED_TIMED_OUT = 4
    FINISHED_FAILED = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One step's news for one request: new tokens and the text they completed.

    The last event of a request has `finish_reason` set, or `error` when it ended badly.
    """

    request_id: str
    new_token_ids: tuple[int, ...]
    text: str
    num_prompt_tokens: int
    num_generated_tokens: int
    seed: int
    finish_reason: FinishReason | None = None
    error: EngineError | None = None

    @property
    def is_last(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass(eq=False, slots=True)
class Request:
    """Mutable state of one request; only the engine core changes it."""

    spec: GenerationRequest
    arrival_index: int
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    num_emitted_chars: int = 0
    finish_reason: FinishReason | None = None
    model_state: object = None

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def deadline(self) -> float:
        return self.arrival_time + self.spec.timeout_s

    @property
    def sort_key(self) -> tuple[int, int]:
        """Waiting order: priority (1 first), then arrival."""
        return (self.spec.priority, self.arrival_index)

    def seen_token_ids(self) -> list[int]:
        return [*self.spec.prompt_token_ids, *self.output_token_ids]
