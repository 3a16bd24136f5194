"""The base of every route handler: bodies within the size limit, errors in the protocol's JSON
shape (never a traceback), and in-flight gRPC calls cancelled when the client goes away."""

from __future__ import annotations

import json
import logging
from typing import Any

import grpc
import tornado.web
from tornado.httputil import responses
from tornado.iostream import StreamClosedError

from gateway.errors import KSERVE_HTTP_STATUS, RequestError, client_message, http_status
from gateway.upstream import Upstream

logger = logging.getLogger(__name__)


@tornado.web.stream_request_body
class Handler(tornado.web.RequestHandler):
    """Subclasses set `status_table` (gRPC status → HTTP status) and may override
    `error_body` for their protocol's error shape (KServe v2's `{"error": message}` here)."""

    status_table = KSERVE_HTTP_STATUS

    def initialize(self, upstream: Upstream, max_body_bytes: int, route: str) -> None:
        self.upstream = upstream
        self.max_body_bytes = max_body_bytes
        self.route = route
        self._chunks: list[bytes] = []
        self._size = 0
        self._calls: set[grpc.aio.Call] = set()

    def prepare(self) -> None:
        declared = self.request.headers.get("Content-Length", "0")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise RequestError(413, f"the body ({declared} bytes) is over the limit of "
                               f"{self.max_body_bytes} bytes")

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self.max_body_bytes:
            raise RequestError(413, f"the body is over the limit of {self.max_body_bytes} bytes")
        self._chunks.append(chunk)

    @property
    def body(self) -> bytes:
        return b"".join(self._chunks)

    def track(self, call: grpc.aio.Call) -> grpc.aio.Call:
        """Remember a gRPC call, to cancel it if the client disconnects."""
        self._calls.add(call)
        call.add_done_callback(lambda _: self._calls.discard(call))
        return call

    def on_connection_close(self) -> None:
        for call in list(self._calls):
            if call.cancel():
                logger.info("%s %s: client gone, upstream call cancelled", self.request.method,
                            self.request.path)

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

    def describe_error(self, error: BaseException | None, status: int) -> tuple[int, str]:
        if isinstance(error, RequestError):
            return error.status, error.message
        if isinstance(error, grpc.aio.AioRpcError):
            return (http_status(error.code(), self.status_table),
                    client_message(error.code(), error.details()))
        if isinstance(error, tornado.web.HTTPError):
            return error.status_code, error.log_message or responses.get(error.status_code, "error")
        return status, "internal error"

    def error_body(self, status: int, message: str) -> object:
        return {"error": message}

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        status, message = self.describe_error(error, status_code)
        self.write_json(self.error_body(status, message), status)

    def log_exception(self, typ: type[BaseException] | None, value: BaseException | None,
                      tb: Any) -> None:
        """Expected failures get one line; anything else its traceback, in the log only."""
        if isinstance(value, (RequestError, tornado.web.HTTPError)):
            logger.info("%s %s: %s", self.request.method, self.request.path, value)
        elif isinstance(value, grpc.aio.AioRpcError):
            logger.info("%s %s: upstream %s: %s", self.request.method, self.request.path,
                        value.code().name, value.details())
        else:
            super().log_exception(typ, value, tb)


class NotFoundHandler(Handler):
    """Unknown paths: 404 in the JSON error shape."""

    def prepare(self) -> None:
        raise RequestError(404, f"no route for {self.request.method} {self.request.path}")


