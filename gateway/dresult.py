"""MindIE's `GET /dresult`: a decode instance's one long-lived stream to its coordinator, which
carries the results of the requests it decodes for prefill instances.

MindIE frames it as NUL-terminated records, not as SSE lines (under a `text/event-stream`
type): `reqId:<id>\\0` names the request the next record is about, then `data:<bytes>\\0`
(what the request's protocol would send its client), `lastData:<bytes>\\0` (its last),
`error:<text>\\0`; `ka:heartbeat\\0` when nothing was sent for HEARTBEAT_S. One connection is
live: a new one makes the old one end with a `close:` record.
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import AsyncIterator, Coroutine

HEARTBEAT_S = 5.0
HEARTBEAT = b"ka:heartbeat\0"
# MindIE's id and text for the record that ends a replaced connection.
REPLACED_ID = "0xffffffffffffffff"
REPLACED = "new connection is to established, close the old one."


class Record(enum.Enum):
    DATA = "data"
    LAST_DATA = "lastData"
    ERROR = "error"
    CLOSE = "close"


def framed(request_id: str, kind: Record, body: bytes) -> bytes:
    return b"reqId:" + request_id.encode() + b"\0" + kind.value.encode() + b":" + body + b"\0"


class DResultStream:
    """One connection's records, in order, with heartbeats while none come."""

    def __init__(self) -> None:
        self._records: collections.deque[bytes] = collections.deque()
        self._arrived = asyncio.Event()
        self._closed = False

    def put(self, record: bytes) -> None:
        self._records.append(record)
        self._arrived.set()

    def close(self, last: bytes) -> None:
        self.put(last)
        self._closed = True

    async def chunks(self) -> AsyncIterator[bytes]:
        """Each chunk ends a record (MindIE's coordinator reads whole records per chunk)."""
        while True:
            try:
                await asyncio.wait_for(self._arrived.wait(), HEARTBEAT_S)
            except TimeoutError:
                yield HEARTBEAT
                continue
            self._arrived.clear()
            chunk = b"".join(self._records)
            self._records.clear()
            yield chunk
            if self._closed:
                return


class DResults:
    """The live /dresult stream, which results are published to, and the decodings that
    publish there."""

    def __init__(self) -> None:
        self._live: DResultStream | None = None
        self._decodings: set[asyncio.Task[None]] = set()

    def run(self, decoding: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(decoding)
        self._decodings.add(task)
        task.add_done_callback(self._decodings.discard)

    def close(self) -> None:
        for task in self._decodings:
            task.cancel()

    def connect(self) -> DResultStream:
        if self._live is not None:
            self._live.close(framed(REPLACED_ID, Record.CLOSE, REPLACED.encode()))
        self._live = DResultStream()
        return self._live

    def disconnect(self, stream: DResultStream) -> None:
        if self._live is stream:
            self._live = None

    def publish(self, request_id: str, kind: Record, body: bytes) -> bool:
        """False when no coordinator listens: MindIE drops such results too."""
        if self._live is None:
            return False
        self._live.put(framed(request_id, kind, body))
        return True
