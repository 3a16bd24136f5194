"""Tornado's HTTP server with a bound on open connections (MindIE's maxLinkNum): one more is
answered 503 and closed, before anything of it is read."""

from __future__ import annotations

import asyncio
import json
import logging

import tornado.httpserver
import tornado.iostream

logger = logging.getLogger(__name__)


class BoundedHTTPServer(tornado.httpserver.HTTPServer):
    def initialize(self, *args: object, max_connections: int, refusal_timeout_s: float,
                   **kwargs: object) -> None:
        super().initialize(*args, **kwargs)
        self.max_connections = max_connections
        self._refusal_timeout_s = refusal_timeout_s
        self._open = 0
        self._refusals: set[asyncio.Task[None]] = set()

    def handle_stream(self, stream: tornado.iostream.IOStream, address: tuple) -> None:
        if self._open >= self.max_connections:
            task = asyncio.ensure_future(self._refuse(stream, address))
            self._refusals.add(task)
            task.add_done_callback(self._refusals.discard)
            return
        self._open += 1
        super().handle_stream(stream, address)

    def on_close(self, server_conn: object) -> None:
        self._open -= 1
        super().on_close(server_conn)

    async def _refuse(self, stream: tornado.iostream.IOStream, address: tuple) -> None:
        logger.warning("connection from %s refused: %d connections are open (the limit)",
                       address[0], self._open)
        body = json.dumps({"error": f"too many connections: at most {self.max_connections} at "
                                    "once; retry later"}).encode()
        head = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        try:
            await asyncio.wait_for(stream.write(head + body), self._refusal_timeout_s)
        except (tornado.iostream.StreamClosedError, asyncio.TimeoutError, OSError):
            pass
        finally:
            stream.close()
