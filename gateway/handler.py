"""The base of every route handler: bodies within the size limit, errors in the protocol's JSON
shape (never a traceback), and in-flight gRPC calls cancelled when the client goes away."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import ssl
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import tornado.web
from tornado.httputil import responses
from tornado.iostream import StreamClosedError

from switchboard.gateway.content_coding import ACCEPTED, UNSUPPORTED_STATUS, BodyDecoder, body_decoder
from switchboard.gateway.config import MAX_DRAINED_BODY_BYTES
from switchboard.gateway.errors import (CREDENTIAL_STATUSES, KSERVE_HTTP_STATUS, RequestError,
                                        client_message, field_in_protocol, field_violation,
                                        http_status)
from switchboard.gateway.lifecycle import Lifecycle
from switchboard.gateway.metrics import GatewayMetrics
from switchboard.gateway.protocols.parameters import parameters_timeout_s
from switchboard.gateway.dresult import DResults
from switchboard.gateway.roles import Roles
from switchboard.gateway.sse import CONTENT_TYPE, sse_event
from switchboard.gateway.upstream import Upstream
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import switchboard_pb2 as sb

logger = logging.getLogger(__name__)
Response = TypeVar("Response")
# Deadline of the small unary calls (health, metadata, model index, tokenizer, management).
METADATA_TIMEOUT_S = 10.0
# The server ends a request at its timeout with an error naming it; the call's deadline, a
# backstop for a server that never answers, comes this much later so that this error, not
# gRPC's "Deadline Exceeded", is what the client reads.
UPSTREAM_GRACE_S = 2.0
# The status logged and counted for a request whose client left before its answer (nginx's
# "client closed request", which vLLM answers too): not a server error.
CLIENT_CLOSED_REQUEST = 499


def deadline_of(request: sb.GenerateRequest | pb.ModelInferRequest,
                longest_timeout_s: float) -> float:
    """A generation call's deadline in seconds: the request's timeout, or without one (or out
    of range) the longest the server lets a request run, UPSTREAM_GRACE_S later."""
    if isinstance(request, sb.GenerateRequest):
        timeout_s = (request.scheduling.timeout if request.scheduling.HasField("timeout")
                     else None)
    else:
        timeout_s = parameters_timeout_s(request.parameters)
    if timeout_s is None or not 0 < timeout_s < longest_timeout_s:  # the server refuses it
        timeout_s = longest_timeout_s
    return timeout_s + UPSTREAM_GRACE_S


class PublishedLimits:
    """What the server accepts of each generation parameter (its GetParameterLimits), asked
    for when first needed and kept: they follow from the server's configuration."""

    def __init__(self) -> None:
        self._limits: dict[str, sb.ParameterLimits] | None = None

    async def get(self, ask: Callable[[], Awaitable[sb.GetParameterLimitsResponse]]
                  ) -> Mapping[str, sb.ParameterLimits]:
        if self._limits is None:
            self._limits = dict((await ask()).parameters)
        return self._limits


@dataclass(frozen=True, slots=True)
class Services:
    """What every handler of a gateway shares."""

    upstream: Upstream
    lifecycle: Lifecycle
    # The server that prefills for `upstream` to decode (see `handoff.py`), if one is set.
    prefill: Upstream | None
    # MindIE's prefill/decode role of this instance (see `roles.py`), the stream its
    # coordinator reads decoded results from (`dresult.py`), and how this gateway calls the
    # gateways of its peers: with its own certificate, as it calls its server (None: plain
    # HTTP, as its management plane speaks).
    roles: Roles
    dresults: DResults
    peer_tls: Callable[[], ssl.SSLContext | None]
    metrics: GatewayMetrics
    max_body_bytes: int
    # Inference requests forwarded at once (MindIE's maxLinkNum); the others wait in turn.
    admission: asyncio.Semaphore
    limits: PublishedLimits = field(default_factory=PublishedLimits)


@tornado.web.stream_request_body
class Handler(tornado.web.RequestHandler):
    """Subclasses set `status_table` (gRPC status → HTTP status) and may override
    `error_body` for their protocol's error shape (KServe v2's `{"error": message}` here).
    Those whose POST runs a generation, or tokenizes a prompt, set `runs_inference`: during a
    graceful stop they answer 503, and the gateway waits for those in flight before it exits;
    at most maxLinkNum of them are forwarded at once, the others waiting in arrival order, each
    from when its body has arrived (a client sending its body slowly holds no one's turn)."""

    status_table = KSERVE_HTTP_STATUS
    runs_inference = False
    # The protocol's field names → the server's, where they differ: errors name its fields.
    names: Mapping[str, str] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method in cls.SUPPORTED_METHODS:
            if method.lower() in vars(cls):
                setattr(cls, method.lower(), _after_the_body(vars(cls)[method.lower()]))

    def initialize(self, services: Services, route: str) -> None:
        self.services = services
        self.upstream = services.upstream
        self.max_body_bytes = services.max_body_bytes
        self.route = route
        self._chunks: list[bytes] = []
        self._size = 0
        self._decoder: BodyDecoder | None = None
        # Why the body is refused, found as it arrived and answered once it has: an error
        # raised from data_received would end the connection without an answer.
        self._body_error: RequestError | None = None
        self._calls: set[grpc.aio.Call] = set()
        self._in_flight = False
        self._admitted = False
        self._client_gone = False

    async def prepare(self) -> None:
        declared = self.request.headers.get("Content-Length", "0")
        declared_size = int(declared) if declared.isdigit() else 0
        if declared_size > MAX_DRAINED_BODY_BYTES:
            raise RequestError(413, f"the body ({declared} bytes) is over the limit of "
                               f"{self.max_body_bytes} bytes")
        self._decoder = body_decoder(self.request.headers.get("Content-Encoding"),
                                     self.max_body_bytes)
        if self.runs_inference and self.request.method == "POST" \
                and declared_size <= self.max_body_bytes:
            self.services.lifecycle.enter()
            self._in_flight = True

    async def _wait_turn(self) -> None:
        """Take one of the maxLinkNum forwarding slots, waiting in arrival order."""
        await self.services.admission.acquire()
        self._admitted = True
        if self._client_gone:  # it left while waiting its turn
            self._release()

    async def is_server_ready(self) -> bool:
        """Ready for inference: the server says so, and this gateway is not stopping."""
        response = await self.track(self.upstream.inference.ServerReady(
            pb.ServerReadyRequest(), timeout=METADATA_TIMEOUT_S))
        return response.ready and not self.services.lifecycle.stopping

    async def model_names(self) -> list[str]:
        index = await self.track(self.upstream.inference.RepositoryIndex(
            pb.RepositoryIndexRequest(), timeout=METADATA_TIMEOUT_S))
        return [model.name for model in index.models]

    async def served_model_parameters(self) -> tuple[str, dict[str, str]]:
        """The served model's name and its config parameters (limits, device, dtype…)."""
        names = await self.model_names()
        if not names:
            raise RequestError(503, "no model is loaded")
        response = await self.track(self.upstream.inference.ModelConfig(
            pb.ModelConfigRequest(name=names[0]), timeout=METADATA_TIMEOUT_S))
        return names[0], {key: value.string_value
                          for key, value in response.config.parameters.items()}

    async def parameter_limits(self) -> Mapping[str, sb.ParameterLimits]:
        """What the server accepts of each generation parameter."""
        return await self.services.limits.get(lambda: self.track(
            self.upstream.generation.GetParameterLimits(sb.GetParameterLimitsRequest(),
                                                        timeout=METADATA_TIMEOUT_S)))

    async def call_deadline_s(self, request: sb.GenerateRequest | pb.ModelInferRequest) -> float:
        """A generation call's deadline (`deadline_of`), bounded by the server's published
        longest timeout."""
        return deadline_of(request, (await self.parameter_limits())["timeout"].maximum)

    def on_finish(self) -> None:
        self._release()

    def _release(self) -> None:
        """Give back the request's forwarding slot and its place among those in flight, once."""
        if self._admitted:
            self._admitted = False
            self.services.admission.release()
        if self._in_flight:
            self._in_flight = False
            self.services.lifecycle.leave()

    def data_received(self, chunk: bytes) -> None:
        """Keep the body's chunks up to the limit, and drop them past it or once it is found
        malformed: the body is still read to its end, so that a client sending it whole reads
        the 413 or 400 (see `body`)."""
        if self._body_error is not None:
            return
        try:
            if self._decoder is not None:
                chunk = self._decoder.decode(chunk)
            self._size += len(chunk)
            if self._size > self.max_body_bytes:
                raise RequestError(413, f"the body is over the limit of {self.max_body_bytes} "
                                        "bytes")
        except RequestError as error:
            self._body_error = error
            self._chunks.clear()
            return
        self._chunks.append(chunk)

    def _check_body(self) -> None:
        """Refuse a body that arrived over the limit or not in its Content-Encoding."""
        if self._body_error is not None:
            raise self._body_error
        if self._decoder is not None:
            self._decoder.finish()

    @property
    def body(self) -> bytes:
        """The request's body, decoded from its Content-Encoding."""
        self._check_body()
        return b"".join(self._chunks)

    def track(self, call: grpc.aio.Call) -> grpc.aio.Call:
        """Remember a gRPC call, to cancel it if the client disconnects."""
        self._calls.add(call)
        call.add_done_callback(lambda _: self._calls.discard(call))
        return call

    def on_connection_close(self) -> None:
        """The client left: its calls are cancelled and its request no longer counts as in
        flight. Tornado never finishes a request whose body was still arriving (no on_finish),
        so this releases what `prepare` took; its own handler ends such a request."""
        super().on_connection_close()
        self._client_gone = True
        self.set_status(CLIENT_CLOSED_REQUEST)
        for call in list(self._calls):
            if call.cancel():
                logger.info("%s %s: client gone, upstream call cancelled", self.request.method,
                            self.request.path)
        self._release()

    def send_error(self, status_code: int = 500, **kwargs: Any) -> None:
        """No error reply to a client that has left (the calls it was awaiting were cancelled
        for it): the request ends as CLIENT_CLOSED_REQUEST."""
        if not self._client_gone:
            super().send_error(status_code, **kwargs)
        elif not self._finished:
            self.set_status(CLIENT_CLOSED_REQUEST)
            self.finish()

    def own_port(self) -> int:
        """The port this request came in on."""
        return self.request.connection.stream.socket.getsockname()[1]

    def client_identity(self) -> str | None:
        """The common name of the client's certificate (None without one)."""
        certificate = self.request.get_ssl_certificate()
        if not certificate:
            return None
        names = dict(pair for part in certificate.get("subject", ()) for pair in part)
        return names.get("commonName")

    def finish_empty(self) -> None:
        """200 with no body, and so no Content-Type (Tornado's default is text/html)."""
        self.clear_header("Content-Type")
        self.finish()

    def write_json(self, document: object, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(document, ensure_ascii=False))

    async def write_chunk(self, data: bytes) -> bool:
        """Send part of a streamed reply; False when the client has gone."""
        try:
            self.write(data)
            await self.flush()
            return True
        except StreamClosedError:
            self.on_connection_close()
            return False

    def error_terms(self) -> tuple[Mapping[grpc.StatusCode, int], Mapping[str, str]]:
        """The status table and the field names (the protocol's → the server's) that the
        request's errors are described in."""
        return self.status_table, self.names

    def describe_error(self, error: BaseException | None, status: int
                       ) -> tuple[int, str, str | None]:
        """The HTTP status, the message and the field at fault (under the protocol's names:
        `names`) of an error; the server names a refused field in its status details."""
        if isinstance(error, RequestError):
            return error.status, error.message, error.field
        if isinstance(error, grpc.aio.AioRpcError):
            status_table, names = self.error_terms()
            status = http_status(error.code(), status_table)
            if (violation := field_violation(error)) is not None:
                field, message = field_in_protocol(*violation, names)
                return status, message, field
            return status, client_message(error.code(), error.details()), None
        if isinstance(error, tornado.web.HTTPError):
            return (error.status_code,
                    error.log_message or responses.get(error.status_code, "error"), None)
        return status, "internal error", None

    def allowed_methods(self) -> list[str]:
        """The HTTP methods this route answers: those its handler implements."""
        return [method for method in self.SUPPORTED_METHODS
                if getattr(type(self), method.lower())
                is not getattr(tornado.web.RequestHandler, method.lower())]

    def error_body(self, status: int, message: str) -> object:
        return {"error": message}

    def error_document(self, error: BaseException | None, status: int) -> tuple[int, object]:
        """The HTTP status and the protocol's error body for an error."""
        status, message, _ = self.describe_error(error, status)
        return status, self.error_body(status, message)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        status, document = self.error_document(error, status_code)
        if status == 405:
            self.set_header("Allow", ", ".join(self.allowed_methods()))
        if status == UNSUPPORTED_STATUS:
            self.set_header("Accept-Encoding", ACCEPTED)
        self.write_json(document, status)

    async def relay(self, responses: AsyncIterable[Response],
                    render: Callable[[Response], Iterable[bytes]], *,
                    content_type: str = CONTENT_TYPE, end: Callable[[], bytes] = bytes,
                    error_event: Callable[[object], bytes] = sse_event) -> None:
        """Stream a gRPC call's responses, each rendered as chunks, then `end()`. An error before
        the first response is an HTTP error; after it, the protocol's error body goes out as
        one last event (`error_event`) and the stream ends."""
        iterator = aiter(responses)
        first = await anext(iterator, None)
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", "no-cache")
        try:
            if first is not None:
                for chunk in render(first):
                    if not await self.write_chunk(chunk):
                        return
            async for response in iterator:
                for chunk in render(response):
                    if not await self.write_chunk(chunk):
                        return
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.CANCELLED:
                return
            self.log_exception(type(error), error, None)
            await self.write_chunk(error_event(self.error_document(error, 500)[1]))
        else:
            if not await self.write_chunk(end()):
                return
        self.finish()

    def log_exception(self, typ: type[BaseException] | None, value: BaseException | None,
                      tb: Any) -> None:
        """Expected failures get one line; anything else its traceback, in the log only."""
        if isinstance(value, (RequestError, tornado.web.HTTPError)):
            logger.info("%s %s: %s", self.request.method, self.request.path, value)
        elif self._client_gone and isinstance(value, asyncio.CancelledError):
            logger.info("%s %s: client gone", self.request.method, self.request.path)
        elif isinstance(value, grpc.aio.AioRpcError) and value.code() in CREDENTIAL_STATUSES:
            logger.error("%s %s: the server refused the gateway's client certificate (%s: %s); "
                         "clients get 503 until it is replaced (then SIGHUP)", self.request.method,
                         self.request.path, value.code().name, value.details())
        elif isinstance(value, grpc.aio.AioRpcError):
            logger.info("%s %s: upstream %s: %s", self.request.method, self.request.path,
                        value.code().name, value.details())
        else:
            super().log_exception(typ, value, tb)


def _after_the_body(method: Callable[..., Awaitable[None] | None]
                    ) -> Callable[..., Awaitable[None]]:
    """A handler's HTTP method, which Tornado calls once the body has arrived: a body refused
    as it arrived is answered first, and a POST that runs inference waits for its turn."""

    @functools.wraps(method)
    async def after_the_body(self: Handler, *args: str, **kwargs: str) -> None:
        self._check_body()
        if self.runs_inference and self.request.method == "POST" and not self._admitted:
            await self._wait_turn()
        result = method(self, *args, **kwargs)
        if result is not None:
            await result

    return after_the_body


class NotFoundHandler(Handler):
    """Unknown paths: 404 in the JSON error shape, answered once the body is read (refused
    in `prepare`, the unread body would make Tornado close the connection)."""

    def _not_found(self, *args: str) -> None:
        raise RequestError(404, f"no route for {self.request.method} {self.request.path}")

    get = post = put = patch = delete = head = options = _not_found


