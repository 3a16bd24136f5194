"""KServe v2 `inference.GRPCInferenceService`, backed by the engine.

Each RPC is a few lines: decode with `codec`, call the engine, encode. Engine errors map to
gRPC statuses through `errors.refusal`; the service's other RPCs answer UNIMPLEMENTED.
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

from switchboard.engine.errors import EngineError, GenerationFailed, NotFound
from switchboard.engine.request import RequestOutput
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import grpc_service_pb2_grpc as pb_grpc
from switchboard.server import codec, model_info
from switchboard.server.errors import refusal
from switchboard.server.kv_transfer import KV_TRANSFER_FIELD, KVHandoff
from switchboard.server.metrics import execution_count
from switchboard.server.served_model import ServedModel

logger = logging.getLogger(__name__)

Response = TypeVar("Response")
ServicerClass = TypeVar("ServicerClass")
# A stream request that failed, and why: it ends that request only.
StreamError = tuple[pb.ModelInferRequest, EngineError]
# Triton's header asking ModelStreamInfer for stream errors as gRPC statuses rather than
# in-band messages (inference_protocols.md).
GRPC_ERROR_HEADER = "triton_grpc_error"


def engine_errors(rpc: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """Turn an EngineError raised by a unary RPC into its gRPC status and message."""

    @functools.wraps(rpc)
    async def wrapper(self: object, request: object,
                      context: grpc.aio.ServicerContext) -> Response:
        try:
            return await rpc(self, request, context)
        except EngineError as error:
            await context.abort(*refusal(error))

    return wrapper


def unsupported_rpcs_answer_unimplemented(servicer: type[ServicerClass]) -> type[ServicerClass]:
    """Give the KServe v2 RPCs a servicer does not define a plain UNIMPLEMENTED answer naming
    the RPC. The generated base class raises NotImplementedError instead, which grpc logs as
    an unexpected error, traceback and all, at every call (tools poll LogSettings, say)."""

    def unsupported(name: str) -> Callable[..., Awaitable[None]]:
        async def rpc(self: object, request: object, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                f"{name} is not supported: this server serves one model, loaded "
                                "at start, without shared memory, trace or log settings")
        return rpc

    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        if method.name not in vars(servicer):
            setattr(servicer, method.name, unsupported(method.name))
    return servicer


@unsupported_rpcs_answer_unimplemented
class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, served: ServedModel, version: str, handoff: KVHandoff) -> None:
        self.served = served
        self.version = version
        self.handoff = handoff

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.served.is_ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ModelReadyResponse:
        """As Triton's: a model or version not served is not ready (no error)."""
        try:
            self.served.check_model(request.name, request.version)
        except NotFound:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.served.is_ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        return model_info.server_metadata(self.version)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        """Triton's model repository index: the one served model, READY once loaded."""
        if request.repository_name:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "'repository_name' specification is not supported")
        ready = self.served.is_ready
        if request.ready and not ready:
            return pb.RepositoryIndexResponse()
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(
            name=self.served.model_name, version=model_info.MODEL_VERSION,
            state="READY" if ready else "UNAVAILABLE",
            reason="" if ready else "loading, or stopped")])

    @engine_errors
    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        self.served.check_model(request.name, request.version)
        return model_info.model_metadata(self.served.model_name)

    @engine_errors
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ModelConfigResponse:
        self.served.check_model(request.name, request.version)
        return model_info.model_config(self.served.model_name, self.served.engine)

    @engine_errors
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: grpc.aio.ServicerContext) -> pb.ModelStatisticsResponse:
        """An empty name asks for every model: the one served."""
        if request.name:
            self.served.check_model(request.name, request.version)
        return model_info.model_statistics(self.served.model_name, self.served.metrics.totals,
                                           execution_count(self.served.engine_stats()))

    @engine_errors
    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ModelInferResponse:
        call, events = await self._start(request, streamed=False)
        async with contextlib.aclosing(events):
            result = codec.aggregate([event async for event in events])
        return self._handed_over(codec.infer_response(call, self.served.model_name, result),
                                 result.kv_transfer_id)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Decoupled streaming. An error ends only its own request, in-band (`error_message`),
        unless the call carries Triton's `triton_grpc_error: true` header: then the stream ends
        with the error's gRPC status."""
        status_errors = dict(context.invocation_metadata() or ()).get(GRPC_ERROR_HEADER) == "true"
        async with contextlib.aclosing(self.stream(request_iterator, context,
                                                   status_errors=status_errors)) as responses:
            async for response in responses:
                yield response

    async def stream(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                     context: grpc.aio.ServicerContext, *, status_errors: bool
                     ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request on the stream runs concurrently and its responses interleave. An error
        ends its own request in-band, or, with `status_errors`, the stream with its status."""
        outbox: asyncio.Queue[pb.ModelStreamInferResponse | StreamError | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def serve(request: pb.ModelInferRequest) -> None:
            try:
                call, events = await self._start(request, streamed=True)
                model_name = self.served.model_name
                special_token_ids = self.served.ready_engine().info.special_token_ids
                async with contextlib.aclosing(events):
                    if call.streams:
                        async for event in events:
                            response = codec.stream_response(call, model_name, event,
                                                             special_token_ids)
                            self._handed_over(response.infer_response, event.kv_transfer_id)
                            outbox.put_nowait(response)
                    else:
                        result = codec.aggregate([event async for event in events])
                        response = codec.final_stream_response(call, model_name, result)
                        self._handed_over(response.infer_response, result.kv_transfer_id)
                        outbox.put_nowait(response)
            except EngineError as error:
                outbox.put_nowait((request, error))
            except Exception:
                logger.exception("stream request %r failed", request.id)
                outbox.put_nowait((request, GenerationFailed("internal error")))

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
            while (item := await outbox.get()) is not None:
                if not isinstance(item, tuple):
                    yield item
                    continue
                request, error = item
                status = refusal(error)
                if status_errors:
                    await context.abort(*status)
                yield codec.stream_error(request, status.details)
        finally:
            for task in (reader, *running):
                task.cancel()

    async def _start(self, request: pb.ModelInferRequest, *, streamed: bool
                     ) -> tuple[codec.InferCall, AsyncIterator[RequestOutput]]:
        """streamed: the call answers as the request goes (ModelStreamInfer, where the
        request itself asks to stream), else once it has ended."""
        engine = self.served.ready_engine()
        self.served.check_model(request.model_name, request.model_version)
        call = codec.decode_infer_request(request)
        request_id = uuid.uuid4().hex
        spec = await codec.build_engine_request(call, request_id, engine.prompts.encode,
                                                engine.limits)
        spec, prefilled = await self.handoff.prepared(spec, call.kv_transfer, engine)
        logger.info("request %s (client id %r): %d prompt tokens, %s", request_id, call.client_id,
                    len(spec.prompt_token_ids), call.kind.name.lower())
        return call, self.served.generate(spec, call.client_id, prefilled,
                                          streamed=streamed and call.streams)

    def _handed_over(self, response: pb.ModelInferResponse, kv_transfer_id: str
                     ) -> pb.ModelInferResponse:
        """A prefill's last response names where its KV cache is kept (vLLM's
        kv_transfer_params, as the JSON string parameter a request sends them in)."""
        if kv_transfer_id:
            response.parameters[KV_TRANSFER_FIELD].CopyFrom(
                codec.kv_transfer_parameter(self.handoff.prefilled_here(kv_transfer_id)))
        return response
