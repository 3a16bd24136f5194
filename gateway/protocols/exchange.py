"""What a generation route's protocol gives the gateway's one generation handler: the
switchboard.v1 requests a body becomes (`Exchange`), how their responses are answered
(`Answer`), and the protocol's error shape (`GenerationProtocol`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from switchboard.gateway.protocols.generation import Generation, SequenceResult
from switchboard.gateway.sse import CONTENT_TYPE, sse_event
from switchboard.proto import switchboard_pb2 as sb

# The served model's name, asked of the server when a protocol's answer must name it.
ServedModel = Callable[[], Awaitable[str]]


class Answer:
    """One request's answer: its calls' responses collected per call (`generations`), then
    the protocol's reply, or, streamed, each response's events as it comes and `end()`; an
    error after the first event goes out as `error_event`."""

    content_type = CONTENT_TYPE

    def __init__(self, calls: int = 1) -> None:
        self.generations = [Generation() for _ in range(calls)]

    @property
    def generation(self) -> Generation:
        """The one call's responses, for protocols that make one."""
        [generation] = self.generations
        return generation

    def collect(self, call: int, response: sb.GenerateResponse) -> SequenceResult:
        return self.generations[call].add(response)

    def reply(self) -> object:
        raise NotImplementedError

    def events(self, call: int, response: sb.GenerateResponse) -> Iterable[bytes]:
        """The stream's events for a response (collected here too)."""
        raise NotImplementedError

    def end(self) -> bytes:
        return b""

    def error_event(self, body: object) -> bytes:
        return sse_event(body)


@dataclass(frozen=True, slots=True)
class Exchange:
    """A route's request, translated: the calls to make, their deadline, whether the answer
    streams, and the protocol's field names → the server's (which errors are named by)."""

    requests: Sequence[sb.GenerateRequest]
    deadline_s: float
    stream: bool
    answer: Answer
    names: Mapping[str, str]


class GenerationProtocol:
    """A protocol's generation route: its translation (`exchange`), its HTTP statuses, and its
    error body for a status, a message and the field at fault."""

    status_table: Mapping[grpc.StatusCode, int]

    def speaking(self, document: object) -> GenerationProtocol:
        """The protocol a body speaks: this one, but for routes shared by several."""
        return self

    async def exchange(self, document: object, served_model: ServedModel) -> Exchange:
        raise NotImplementedError

    def error_document(self, status: int, message: str, field: str | None,
                       error: BaseException | None) -> tuple[int, object]:
        raise NotImplementedError
