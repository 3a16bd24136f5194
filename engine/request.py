"""A request's life inside the engine (`Request`, owned by the core) and what leaves it
(`RequestOutput`, one object for each event and consumer)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch
from outlines_core import Guide

from switchboard.engine.block_manager import BlockTable
from switchboard.engine.detokenizer import IncrementalDetokenizer
from switchboard.engine.errors import EngineError
from switchboard.engine.params import GenerationRequest
from switchboard.engine.speculation import DraftWindow


class FinishReason(enum.Enum):
    """Values are MindIE's / TGI's finish_reason strings."""

    LENGTH = "length"
    EOS = "eos_token"
    STOP = "stop_sequence"
    STOPPED = "stopped"  # ended early on request (MindIE's stopInfer)


class RequestStatus(enum.IntEnum):
    """Ordered so that `status >= FINISHED_STOPPED` means finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_ABORTED = 4
    FINISHED_TIMED_OUT = 5
    FINISHED_FAILED = 6


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log-probability under the model, and the most likely alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class RequestTimings:
    """Per-request timings (seconds): MindIE's perf_stat material.

    queue_wait: arrival to first scheduled; first_token: arrival to first token;
    step_time: when this event's step ended (monotonic clock); token_latency: this event's
    token since the previous one (since arrival for the first); batch_size: requests in that
    step.
    """

    queue_wait: float
    first_token: float
    step_time: float
    token_latency: float
    batch_size: int


@dataclass(slots=True)
class RequestOutput:
    """One step's news for one request: new tokens and the text they completed. Each goes to
    one consumer, which may name it by its own request id; not frozen, since a frozen
    dataclass's fields are set one `object.__setattr__` at a time, and the engine builds one
    of these and one RequestTimings for every request at every step.

    The last event of a request has `finish_reason` set, or `error` when it ended badly.
    `index` tells the sequences of an n > 1 request apart. `prompt_logprobs`, when asked for,
    comes on the first event with a generated token only: one entry per prompt token, the
    log-probability of the token given those before it, with `logprobs` top alternatives
    (None for the first). `decoded_text`: the text of the new tokens as the sequence decodes
    one token after another (TGI's token texts), neither held back for stop strings nor cut at
    one; "" for a token that ends mid-character, whose bytes come with the next.
    """

    request_id: str
    new_token_ids: tuple[int, ...]
    text: str
    num_prompt_tokens: int
    num_generated_tokens: int
    seed: int
    finish_reason: FinishReason | None = None
    error: EngineError | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    num_cached_tokens: int = 0
    timings: RequestTimings | None = None
    index: int = 0
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()
    decoded_text: str = ""
    # On the last event of a keep_kv request: the id its kept KV cache is read by.
    kv_transfer_id: str = ""

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
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: BlockTable = field(default_factory=BlockTable)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # so far, of tokens 1, 2, ...
    draft_window: DraftWindow = field(default_factory=DraftWindow)
    guide: Guide | None = None  # structured output: the tokens that may follow (see guided.py)
    # Waiting order: probes, then priority (1 first), then arrival; sorted by every step.
    sort_key: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.sort_key = (0 if self.spec.probe else self.spec.priority, self.arrival_index)

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def deadline(self) -> float:
        return self.arrival_time + self.spec.timeout_s

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt and generated tokens: what the KV cache must hold (a preempted request
        recomputes them all)."""
        return [*self.spec.prompt_token_ids, *self.output_token_ids]

    def token_ids(self, start: int, stop: int) -> list[int]:
        """all_token_ids[start:stop], without copying the rest: a decoding step wants only
        the newest token."""
        prompt = self.spec.prompt_token_ids
        if start >= len(prompt):
            return self.output_token_ids[start - len(prompt):stop - len(prompt)]
        return [*prompt[start:stop], *self.output_token_ids[:max(0, stop - len(prompt))]]

    @property
    def num_tokens(self) -> int:
        return len(self.spec.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt log-probabilities were asked for and some are not recorded yet."""
        return (self.spec.sampling.prompt_logprobs
                and len(self.prompt_logprobs) < len(self.spec.prompt_token_ids) - 1)
