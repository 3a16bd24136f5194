"""What a route's protocol gives the gateway's handlers: its error shape and which protocol a
body speaks (`Protocol`); for the one generation handler, the switchboard.v1 requests a body
becomes (`Exchange`) and how their responses are answered (`Answer`); for /tokenize, the
reply from the server's tokenizer (`TokenizeProtocol`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from switchboard.gateway.protocols.generation import Generation, SequenceResult
from switchboard.gateway.sse import CONTENT_TYPE, sse_event
from switchboard.proto import switchboard_pb2 as sb

# The served model's name, asked of the server when a protocol's answer must name it.
ServedModel = Callable[[], Awaitable[str]]
# The server's tokenizer (switchboard.v1 Tokenize).
Tokenizer = Callable[[sb.TokenizeRequest], Awaitable[sb.TokenizeResponse]]


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
    """A route's request, translated: the calls to make, whether the answer streams, and the
    protocol's field names → the server's (which errors are named by)."""

    requests: Sequence[sb.GenerateRequest]
    stream: bool
    answer: Answer
    names: Mapping[str, str]


class Protocol:
    """A route's protocol: its HTTP statuses, its error body for a status, a message and the
    field at fault, and the protocol a body speaks (this one, but on routes shared by
    several)."""

    status_table: Mapping[grpc.StatusCode, int]

    def speaking(self, document: object) -> Protocol:
        return self

    def error_document(self, status: int, message: str, field: str | None,
                       error: BaseException | None) -> tuple[int, object]:
        raise NotImplementedError


class GenerationProtocol(Protocol):
    """A protocol's generation route: its translation (`exchange`)."""

    async def exchange(self, document: object, served_model: ServedModel) -> Exchange:
        raise NotImplementedError


class TokenizeProtocol(Protocol):
    """A protocol's /tokenize: the reply to a body from the server's tokenizer (`answer`);
    `names`, the protocol's field names → the server's, name the fields of its errors."""

    names: Mapping[str, str] = {}

    async def answer(self, document: object, tokenize: Tokenizer) -> object:
        raise NotImplementedError
