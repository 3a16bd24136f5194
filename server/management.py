"""`switchboard.v1.Management`: MindIE's management operations that KServe v2 has no RPC for."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc

from switchboard.engine.errors import InvalidRequest, NotFound
from switchboard.engine.validation import MAX_TIMEOUT_S, build_request
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc
from switchboard.server import codec
from switchboard.server.served_model import ServedModel
from switchboard.server.servicer import engine_errors

PROBE_PROMPT = "Hello"
PROBE_TIMEOUT_S = 10.0


class ManagementServicer(sb_grpc.ManagementServicer):
    """`stop_service(force)` drains the server and makes it exit (StopService)."""

    def __init__(self, served: ServedModel,
                 stop_service: Callable[[bool], Awaitable[None]]) -> None:
        self.served = served
        self.stop_service = stop_service
        self._stop: asyncio.Future[None] | None = None

    @engine_errors
    async def StopInfer(self, request: sb.StopInferRequest, context: grpc.aio.ServicerContext
                        ) -> sb.StopInferResponse:
        engine = self.served.named_engine(request.model_name)
        if not request.id:
            raise InvalidRequest("id", "is required: the id of the request to stop")
        codec.check_client_id(request.id)
        request_ids = self.served.request_ids(request.id)
        if not request_ids:
            raise NotFound(f"no running request has id {request.id!r}")
        for request_id in request_ids:
            engine.stop(request_id)
        return sb.StopInferResponse(num_stopped=len(request_ids))

    @engine_errors
    async def GetSlotCount(self, request: sb.GetSlotCountRequest, context: grpc.aio.ServicerContext
                           ) -> sb.GetSlotCountResponse:
        stats = self.served.named_engine(request.model_name).stats()
        return sb.GetSlotCountResponse(
            total_slots=stats.max_batch_size,
            free_slots=stats.free_slots,
            available_tokens_length=stats.num_free_blocks * stats.block_size,
        )

    async def GetStatus(self, request: sb.GetStatusRequest, context: grpc.aio.ServicerContext
                        ) -> sb.GetStatusResponse:
        metrics = self.served.metrics
        response = sb.GetStatusResponse(
            ready=self.served.is_ready, stopping=self.served.stopping,
            mean_time_to_first_token_s=metrics.mean_time_to_first_token,
            mean_time_between_tokens_s=metrics.mean_time_between_tokens)
        if self.served.engine is not None:
            stats = self.served.engine.stats()
            response.max_running_requests = stats.max_batch_size
            response.running_requests = stats.num_running
            response.waiting_requests = stats.num_waiting
            response.free_blocks = stats.num_free_blocks
            response.total_blocks = stats.num_total_blocks
            response.block_size = stats.block_size
            response.preemptions = stats.num_preemptions
            response.free_slots = stats.free_slots
        return response

    async def GetMetrics(self, request: sb.GetMetricsRequest, context: grpc.aio.ServicerContext
                         ) -> sb.GetMetricsResponse:
        return sb.GetMetricsResponse(text=self.served.metrics.exposition())

    @engine_errors
    async def ProbeGeneration(self, request: sb.ProbeGenerationRequest,
                              context: grpc.aio.ServicerContext) -> sb.ProbeGenerationResponse:
        start = time.monotonic()
        engine = self.served.ready_engine()
        remaining = context.time_remaining()
        timeout_s = min(remaining if remaining is not None else PROBE_TIMEOUT_S, MAX_TIMEOUT_S)
        spec = dataclasses.replace(build_request(
            f"probe-{uuid.uuid4().hex}", await engine.prompts.encode(PROBE_PROMPT),
            {"max_new_tokens": 1, "timeout": timeout_s, "do_sample": False}, engine.limits),
            probe=True)
        async with contextlib.aclosing(engine.generate(spec)) as events:
            async for _ in events:
                pass
        return sb.ProbeGenerationResponse(
            latency_us=round((time.monotonic() - start) * codec.MICROSECONDS))

    async def StopService(self, request: sb.StopServiceRequest, context: grpc.aio.ServicerContext
                          ) -> sb.StopServiceResponse:
        if self.served.stopping:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "a graceful stop is already under way")
        self._stop = asyncio.ensure_future(self.stop_service(request.force))
        await asyncio.shield(self._stop)  # the stop goes on if the caller leaves
        return sb.StopServiceResponse()
