"""What the KServe v2 service and the Management service share: the served model's name, its
engine once loaded, and the running requests by the id their clients gave them."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator

from engine.errors import EngineDead, NotFound
from engine.protocol import EngineClient
from server.model_info import MODEL_VERSION


class ServedModel:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.engine: EngineClient | None = None
        self._request_ids_by_client_id: defaultdict[str, set[str]] = defaultdict(set)

    @property
    def is_ready(self) -> bool:
        return self.engine is not None and self.engine.is_healthy

    def ready_engine(self) -> EngineClient:
        if self.engine is None or not self.engine.is_healthy:
            raise EngineDead("the model is not ready (still loading, or stopped)")
        return self.engine

    def check_model(self, name: str, version: str = "") -> None:
        if name != self.model_name:
            raise NotFound(f"unknown model {name!r}; this server serves {self.model_name!r}")
        if version not in ("", MODEL_VERSION):
            raise NotFound(f"model {name!r} has no version {version!r}; available: {MODEL_VERSION}")

    @contextlib.contextmanager
    def running(self, client_id: str, request_id: str) -> Iterator[None]:
        """Register a running request under its client's id (MindIE's stopInfer names requests
        by it); several requests may share one client id."""
        if not client_id:
            yield
            return
        self._request_ids_by_client_id[client_id].add(request_id)
        try:
            yield
        finally:
            request_ids = self._request_ids_by_client_id[client_id]
            request_ids.discard(request_id)
            if not request_ids:
                del self._request_ids_by_client_id[client_id]

    def request_ids(self, client_id: str) -> frozenset[str]:
        return frozenset(self._request_ids_by_client_id.get(client_id, ()))
