"""Tornado's HTTP server with bounds on open connections, in all (from MindIE's maxLinkNum)
and from one client address: one more is answered 503 and closed, before anything of it is
read."""

from __future__ import annotations

import asyncio
import collections
import json
import logging

import tornado.httpserver
import tornado.iostream

logger = logging.getLogger(__name__)


class BoundedHTTPServer(tornado.httpserver.HTTPServer):
    def initialize(self, *args: object, max_connections: int, max_client_connections: int,
                   refusal_timeout_s: float, **kwargs: object) -> None:
        super().initialize(*args, **kwargs)
        self.max_connections = max_connections
        self.max_client_connections = max_client_connections
        self._refusal_timeout_s = refusal_timeout_s
        self._open = 0
        self._open_by_client: collections.Counter[str] = collections.Counter()
        self._refusals: set[asyncio.Task[None]] = set()

    def handle_stream(self, stream: tornado.iostream.IOStream, address: tuple) -> None:
        client = address[0]
        if self._open >= self.max_connections:
            self._refuse(stream, client, f"{self._open} connections are open (the limit)",
                         f"too many connections: at most {self.max_connections} at once")
            return
        if self._open_by_client[client] >= self.max_client_connections:
            self._refuse(stream, client, f"{self._open_by_client[client]} connections from it "
                                         "are open (the limit per client address)",
                         f"too many connections from your address: at most "
                         f"{self.max_client_connections} at once")
            return
        self._open += 1
        self._open_by_client[client] += 1
        super().handle_stream(stream, address)

    def on_close(self, server_conn: object) -> None:
        self._open -= 1
        client = server_conn.context.address[0]
        self._open_by_client[client] -= 1
        if not self._open_by_client[client]:
            del self._open_by_client[client]
        super().on_close(server_conn)

    def _refuse(self, stream: tornado.iostream.IOStream, client: str, why: str,
                message: str) -> None:
        logger.warning("connection from %s refused: %s", client, why)
        task = asyncio.ensure_future(self._answer_503(stream, message))
        self._refusals.add(task)
        task.add_done_callback(self._refusals.discard)

    async def _answer_503(self, stream: tornado.iostream.IOStream, message: str) -> None:
        body = json.dumps({"error": f"{message}; retry later"}).encode()
        head = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        try:
            await asyncio.wait_for(stream.write(head + body), self._refusal_timeout_s)
        except (tornado.iostream.StreamClosedError, asyncio.TimeoutError, OSError):
            pass
        finally:
            stream.close()
