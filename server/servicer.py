"""KServe v2 `inference.GRPCInferenceService`, backed by the engine.

Each RPC is a few lines: decode with `codec`, call the engine, encode. Engine errors map to
gRPC statuses through `errors.status_for`; RPCs not listed here answer UNIMPLEMENTED (the
generated base class does that).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from engine.errors import EngineDead, EngineError, NotFound
from engine.protocol import EngineClient
from proto import grpc_service_pb2 as pb
from proto import grpc_service_pb2_grpc as pb_grpc
from server import codec, model_info
from server.errors import status_for

logger = logging.getLogger(__name__)

Response = TypeVar("Response")


def engine_errors(rpc: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """Turn an EngineError raised by a unary RPC into its gRPC status and message."""

    @functools.wraps(rpc)
    async def wrapper(self: InferenceServicer, request: object,
                      context: grpc.aio.ServicerContext) -> Response:
        try:
            return await rpc(self, request, context)
        except EngineError as error:
            await context.abort(status_for(error), error.message)

    return wrapper


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, model_name: str, version: str) -> None:
        self.model_name = model_name
        self.version = version
        self.engine: EngineClient | None = None

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._is_ready())

    @engine_errors
    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ModelReadyResponse:
        self._check_model(request.name, request.version)
        return pb.ModelReadyResponse(ready=self._is_ready())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        return model_info.server_metadata(self.version)

    @engine_errors
    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        self._check_model(request.name, request.version)
        return model_info.model_metadata(self.model_name)

    @engine_errors
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ModelConfigResponse:
        self._check_model(request.name, request.version)
        return model_info.model_config(self.model_name, self.engine and self.engine.limits)

    @engine_errors
    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ModelInferResponse:
        call, events = self._start(request)
        async with contextlib.aclosing(events):
            result = codec.aggregate([event async for event in events])
        return codec.infer_response(call, self.model_name, result)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Decoupled streaming: each request on the stream runs concurrently and its responses
        interleave; an error ends only its own request (in-band `error_message`, as Triton)."""
        outbox: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def serve(request: pb.ModelInferRequest) -> None:
            async for response in self._stream_responses(request):
                outbox.put_nowait(response)

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.create_task(serve(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:
                    await asyncio.wait(set(running))
            finally:
                outbox.put_nowait(None)

        reader = asyncio.create_task(read_requests())
        try:
            while (response := await outbox.get()) is not None:
                yield response
        finally:
            for task in (reader, *running):
                task.cancel()

    async def _stream_responses(self, request: pb.ModelInferRequest
                                ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            call, events = self._start(request)
            async with contextlib.aclosing(events):
                async for event in events:
                    yield codec.stream_response(call, self.model_name, event)
        except EngineError as error:
            yield codec.stream_error(error.message)
        except Exception:
            logger.exception("stream request %r failed", request.id)
            yield codec.stream_error("internal error")

    def _start(self, request: pb.ModelInferRequest
               ) -> tuple[codec.InferCall, AsyncIterator]:
        engine = self._ready_engine()
        self._check_model(request.model_name, request.model_version)
        call = codec.decode_infer_request(request)
        request_id = uuid.uuid4().hex
        spec = codec.build_engine_request(call, request_id, engine.encode, engine.limits)
        logger.info("request %s (client id %r): %d prompt tokens, %s", request_id, call.client_id,
                    len(spec.prompt_token_ids), call.kind.name.lower())
        return call, engine.generate(spec)

    def _is_ready(self) -> bool:
        return self.engine is not None and self.engine.is_healthy

    def _ready_engine(self) -> EngineClient:
        if self.engine is None or not self.engine.is_healthy:
            raise EngineDead("the model is not ready (still loading, or stopped)")
        return self.engine

    def _check_model(self, name: str, version: str) -> None:
        if name != self.model_name:
            raise NotFound(f"unknown model {name!r}; this server serves {self.model_name!r}")
        if version not in ("", model_info.MODEL_VERSION):
            raise NotFound(f"model {name!r} has no version {version!r}; "
                           f"available: {model_info.MODEL_VERSION}")
