"""What the gRPC services share: the served model's name, its engine once loaded, the requests
in flight (by the id their clients gave them), their metrics, and the graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator

from switchboard.engine.core import EngineStats
from switchboard.engine.errors import EngineDead, EngineError, NotFound
from switchboard.engine.kv_transfer import PrefilledKV
from switchboard.engine.params import GenerationRequest
from switchboard.engine.protocol import EngineClient
from switchboard.engine.request import RequestOutput
from switchboard.server.metrics import ServerMetrics
from switchboard.server.model_info import MODEL_VERSION


class ServedModel:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.engine: EngineClient | None = None
        self.metrics = ServerMetrics(model_name, self.engine_stats)
        self.stopping = False
        self._request_ids_by_client_id: defaultdict[str, set[str]] = defaultdict(set)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def is_ready(self) -> bool:
        """Loaded, healthy, and taking new requests."""
        return self.engine is not None and self.engine.is_healthy and not self.stopping

    def ready_engine(self) -> EngineClient:
        if self.engine is None or not self.engine.is_healthy:
            raise EngineDead("the model is not ready (still loading, or stopped)")
        return self.engine

    def named_engine(self, name: str) -> EngineClient:
        """Our own services' engine, if ready: an empty name is the served model, as in their
        requests (KServe's RPCs need the name, see check_model)."""
        engine = self.ready_engine()
        if name:
            self.check_model(name)
        return engine

    def check_model(self, name: str, version: str = "") -> None:
        if name != self.model_name:
            raise NotFound(f"unknown model {name!r}; this server serves {self.model_name!r}")
        if version not in ("", MODEL_VERSION):
            raise NotFound(f"model {name!r} has no version {version!r}; available: {MODEL_VERSION}")

    async def generate(self, spec: GenerationRequest, client_id: str,
                       prefilled: PrefilledKV | None = None, *, streamed: bool = True
                       ) -> AsyncIterator[RequestOutput]:
        """The engine's events for a request: refused once a graceful stop has begun, counted
        in flight until it ends, findable by its client's id meanwhile, and measured.
        prefilled: its prompt's KV cache, from the instance that prefilled it; streamed:
        False where the answer waits for the request's end (see `AsyncEngine.generate`)."""
        engine = self.ready_engine()
        if self.stopping:
            raise EngineDead("the server is stopping: it takes no new requests")
        recorder = self.metrics.start_request()
        with self._running(client_id, spec.request_id):
            try:
                events = engine.generate(spec, prefilled, streamed=streamed)
                async with contextlib.aclosing(events):
                    del prefilled  # the engine's cache holds it from now on
                    async for event in events:
                        recorder.event(event)
                        yield event
                recorder.finished()
            except EngineError as error:
                recorder.failed(error)
                raise
            finally:
                recorder.close()

    def begin_stop(self) -> bool:
        """Refuse new requests from now on; False if a stop had already begun."""
        begun, self.stopping = not self.stopping, True
        return begun

    async def drained(self) -> None:
        """Return once no request is in flight."""
        await self._idle.wait()

    @contextlib.contextmanager
    def _running(self, client_id: str, request_id: str) -> Iterator[None]:
        """Count a request in flight, and register it under its client's id (MindIE's
        stopInfer names requests by it; several requests may share one client id)."""
        self._in_flight += 1
        self._idle.clear()
        if client_id:
            self._request_ids_by_client_id[client_id].add(request_id)
        try:
            yield
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
            if client_id:
                request_ids = self._request_ids_by_client_id[client_id]
                request_ids.discard(request_id)
                if not request_ids:
                    del self._request_ids_by_client_id[client_id]

    def request_ids(self, client_id: str) -> frozenset[str]:
        return frozenset(self._request_ids_by_client_id.get(client_id, ()))

    def engine_stats(self) -> EngineStats | None:
        """The engine's load; None before it is loaded."""
        return self.engine.stats() if self.engine is not None else None
