"""The gateway's graceful stop (MindIE's /stopService, SIGTERM): once it begins, inference
routes answer 503, and the gateway exits when the inference requests in flight have been
answered in full."""

from __future__ import annotations

import asyncio

from switchboard.gateway.errors import RequestError


class Lifecycle:
    def __init__(self) -> None:
        self.stopping = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # Set when the gateway should close its servers and exit.
        self.exit_requested = asyncio.Event()
        # Set when it should do so without waiting for the requests in flight.
        self.stop_now = asyncio.Event()

    def begin_stop(self) -> bool:
        """Refuse new inference requests from now on; False if a stop had already begun."""
        begun, self.stopping = not self.stopping, True
        return begun

    def enter(self) -> None:
        """An inference request starts (RequestError 503 once stopping)."""
        if self.stopping:
            raise RequestError(503, "the service is stopping: it takes no new requests")
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self._idle.set()

    def stop_now_after(self, seconds: float) -> None:
        asyncio.get_running_loop().call_later(seconds, self.stop_now.set)

    async def drained(self) -> None:
        """Return once no inference request is in flight."""
        await self._idle.wait()
